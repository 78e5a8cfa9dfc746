"""Which schedule to measure next: screen by compiled memory, predict time, time few.

A worker's ``Planner`` holds a pool of candidate schedules (``pool``: the space's random
draws, every structure of a short scan, the neighbours of the best so far) and decides,
each time the search may measure one more, which one it is worth timing:

1. candidates are ranked by predicted step time (``Judge.rank``: ``predict.TimeModel``,
   calibrated on the study's own timed trials) -- a layer stack's presets first, then
   the unrolls of the leader's innermost scan and of its closest rivals'
   (``propose_unrolls``), the fastest predicted first, so an unroll that pays is found
   before the limit;
2. going down that list, a candidate storing at least as much as one already over the
   budget, or predicted at least as large as a program the compiler refused for want of
   memory (``MemoryModel.surely_over``), is skipped unsized; the others are compiled and
   sized (a fraction of timing's cost), the executable kept for the timing;
3. one that ``untimed`` rules out (over the budget at run time, or dominated on memory
   and predicted time by a schedule already timed) is never timed -- nor compiled, when
   the memory model's guess already makes it dominated; nor an offloading one whose twin
   without the copies fits (``offload_twins``); the first that is neither is;
4. the search is done at once when the budget is under what no schedule removes
   (``breakdown.floor_bytes``); else when the best prediction left is slower than the
   best measured schedule that fits by ``judge.STOP_RATIO``, widened by twice the model's
   own leave-one-out error (``Judge.stop_ratio``: a model off by 15% must not rule out a
   schedule predicted 20% slower); or when ``standings.PATIENCE`` candidates within the budget were compiled
   since the best last improved by ``IMPROVES`` and none of those is worth timing; or
   when the time left cannot pay for the next compile or timing. An unrolled compile costs
   more (``Clock.compile_cost_of``): one that would end past the limit is not started
   while cheaper ones are (``TooLate``; the tune's result lists them).

With ``explore_front`` step 4's ratio test is off: every fitting schedule not dominated
is timed. A timing stops after its first run when that run is already
``timing.CUT_RATIO`` x slower than the best that fits (a *cut* trial), and after its
fewest runs when they all are ``timing.BEATEN`` slower (``Judge.rival``). With compile
threads (``compiles``) the next candidates are compiled ahead, and the device times
another while the planner's choice compiles (``ahead``).

Each rule lives in the part that holds its figures; one function orders them
(``screening.next_action``), which the planner asks of each candidate in ranked order
(``choose``), as its compiles ahead do (``ahead``). The worker calls the planner's face only (``observe``,
``next``, ``candidate``, ``take_compiled``, ``prefetch``, ``predict``, ``rival``, ``record``,
``reserve``, ``close``), never its parts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final, Literal

from autoremat._measure import device_memory
from autoremat._measure.breakdown import floor_bytes, least_bytes
from autoremat._measure.measure import Compiled, compile_schedule
from autoremat._measure.measurement import OK, OVER_BUDGET, Measurement
from autoremat._measure.problem import Problem, Step
from autoremat._measure.timing import DEFAULT_TIME_BUDGET
from autoremat._schedules.base import Schedule
from autoremat._schedules.policy import Policy
from autoremat._search.arguments import SharedArguments
from autoremat._search.planning.ahead import CompilesAhead
from autoremat._search.planning.candidates import AGAIN, Candidate, TooLate, Verdict
from autoremat._search.planning.clock import Clock
from autoremat._search.planning.compile_pool import CompilePool
from autoremat._search.planning.judge import Judge, Round
from autoremat._search.planning.layer_costs import LayerCosts
from autoremat._search.planning.memory_model import MemoryModel
from autoremat._search.planning.offload_twins import OffloadTwins
from autoremat._search.planning.pool import Pool
from autoremat._search.planning.predict import TimeModel
from autoremat._search.planning.presets import Presets
from autoremat._search.planning.screening import Action, next_action
from autoremat._search.planning.standings import Standings
from autoremat._search.probes.guard import ProbeGuard
from autoremat._search.short_runs import ShortRuns

#: The rivals whose unrolls are proposed early (``propose_unrolls``): timed within this
#: fraction of the leader,
UNROLL_BAND: Final = 0.10
#: and at most this many besides the leader.
UNROLL_RIVALS: Final = 2
#: At most this many unrolled candidates are ranked early at a time.
EARLY: Final = 4


class Planner:
    """One worker's pool of candidates and models (see the module doc).

    Its parts, each readable alone: ``pool`` (the candidates), ``standings`` (what was
    measured), ``judge`` (the models' view of a candidate), ``clock`` (the time left),
    ``ahead`` (compiles ahead), ``twins`` (an offload's twin first; ``None``: the whole
    front is wanted), ``presets`` (a layer stack's, first; ``None``: not a layer stack),
    ``guard`` (the study's probe of risky choices; ``None``: none).

    Attributes:
      floor: bytes no schedule removes (``breakdown.floor_bytes``), once a compile said.
    """

    def __init__(self, problem: Problem, budget_bytes: int, platform: str, short: ShortRuns,
                 *, seed: int = 0, explore_front: bool = False,
                 time_budget: float = DEFAULT_TIME_BUDGET,
                 refused: frozenset[str] = frozenset(),
                 named: Mapping[str, Policy] | None = None,
                 layer_costs: LayerCosts | None = None,
                 built: tuple[str, Step, tuple[Any, ...]] | None = None,
                 guard: ProbeGuard | None = None,
                 compiles: CompilePool | None = None) -> None:
        """``short``: how a candidate is timed (its run length and cost); ``refused``:
        choices the study's probe left out; ``named``: policies over the problem's tags
        (``named_policies``); ``layer_costs``: a layer stack's (its presets first);
        ``built``: ``(schedule key, step, args)`` built before the search (``tune``: the
        plain scan, whose arguments fingerprint the study), used by that schedule's
        compile; ``compiles``: threads compiling ahead."""
        self.problem, self.budget_bytes = problem, budget_bytes
        self.short, self.time_budget, self.guard = short, time_budget, guard
        self.pool = Pool(problem.seq_len, platform, seed=seed, refused=refused,
                         fuse=problem.fuse_choice, named=named,
                         layer_stack=layer_costs is not None)
        self.presets = None if layer_costs is None else Presets(layer_costs, self.pool,
                                                                budget_bytes)
        self.standings = Standings(budget_bytes)
        memory_model = MemoryModel()
        self.judge = Judge(platform, self.standings, TimeModel(platform), memory_model,
                           explore_front, self.presets)
        self.twins = None if explore_front else OffloadTwins(
            problem.seq_len, budget_bytes, memory_model,
            (self.standings.timed, self.standings.cut), self.pool.proposed, self.pool.mark)
        self.clock = Clock(reserve_compile=platform in device_memory.VALIDATED)
        self.ahead = CompilesAhead(compiles, self.pool, self.judge, self.clock, short,
                                   time_budget, twins=self.twins, guard=guard,
                                   built=None if built is None else built[0])
        self._built = built
        self._shared = SharedArguments(None if built is None else built[2])
        self.floor: int | None = None
        self.too_late: list[TooLate] = []

    # -- the worker's face ---------------------------------------------------------------
    @property
    def explore_front(self) -> bool:
        """Every fitting schedule not dominated is timed (no stop on predictions)."""
        return self.judge.explore_front

    @property
    def compiles_ahead(self) -> bool:
        """Threads compile candidates ahead (so enqueued seeds are worth reading)."""
        return self.ahead.running

    def candidate(self, schedule: Schedule) -> Candidate:
        """The pool's candidate of a schedule from the study (a seed, a retry)."""
        return self.pool.candidate(schedule)

    def prefetch(self, exclude: str | None = None,
                 first: list[Schedule] | None = None) -> None:
        """Hand the compile threads what the planner would compile next
        (``CompilesAhead.prefetch``)."""
        self.ahead.prefetch(exclude=exclude, first=first)

    def predict(self, cand: Candidate) -> float | None:
        """``cand``'s predicted step seconds (``None`` before any timing)."""
        return self.judge.predict(cand)

    def rival(self) -> float | None:
        """The best step that fits, which a timing competes with (``Judge.rival``)."""
        return self.judge.rival()

    def compile_cost(self) -> float:
        """Mean seconds of one compile so far (``Clock.compile_cost``)."""
        return self.clock.compile_cost()

    def reserve(self, seconds: float) -> None:
        """Keep ``seconds`` back from the time left for work after the planner stops
        (``Clock.reserve``)."""
        self.clock.reserve = max(0.0, seconds)

    # -- what the study holds ----------------------------------------------------------
    def observe(self, measured: list[tuple[Schedule, Measurement]],
                taken: set[str] | None = None) -> None:
        """What the study holds now (every worker's): measured trials, claimed keys
        (``None``: as before)."""
        if taken is not None:
            self.pool.take(taken)
        for schedule, m in measured:
            self.record(schedule, m, refit=False)
        self._refit()

    def record(self, schedule: Schedule, m: Measurement, *, refit: bool = True) -> None:
        """One measured trial: no longer a candidate; its figures calibrate the model."""
        key = schedule.key()
        cand = self.pool.candidate(schedule)
        if cand.verdict is Verdict.UNDECIDED:
            self.pool.mark(cand, Verdict.MEASURED)
        if cand.compiled is not None:
            cand.compiled.release()
        self.standings.record(key, m)
        fit = m.fit_bytes
        if m.status == OVER_BUDGET and m.runtime_peak_bytes is not None:
            self.judge.memory_model.mark_over(cand.structure)  # over by its run, not its compile
        if self.presets is not None:
            self.presets.observe(cand.schedule, m.size_bytes if fit is None else fit,
                                 m.step_seconds)
        if self.guard is not None:  # a combination that failed to compile is left out
            self.guard.failed_in_trial(cand.params, m)
        if refit:
            self._refit()

    def _refit(self) -> None:
        self.judge.time_model.fit([(self.pool[k].structure, b, s)
                                   for k, (b, s) in self.standings.measured().items()])
        best = self.standings.new_best()
        if best is not None:
            self.pool.grow_around(best)
        if not self.judge.explore_front:
            self.propose_unrolls()

    def propose_unrolls(self) -> None:
        """The unrolls of the leader's innermost scan and of its closest rivals' (timed
        within ``UNROLL_BAND`` of it, up to ``UNROLL_RIVALS``), ranked after the presets
        and before the rest (``Judge.early``), the fastest predicted first, up to
        ``EARLY``: where an unroll pays (on some steps; on others every unroll is slower),
        it is found before the limit, whichever candidate the random draws put near the top.
        Still screened as any other (``screening.next_action``); an unrolled compile's cost
        is its own (``Clock.compile_cost_of``)."""
        budget = self.budget_bytes
        fits = sorted((s, k) for k, (b, s) in self.standings.timed.items() if b <= budget)
        if not fits:
            self.judge.prefer([])
            return
        near = [k for s, k in fits if s <= (1.0 + UNROLL_BAND) * fits[0][0]][:1 + UNROLL_RIVALS]
        found = {c.schedule.key(): c for k in near for c in self.pool.unrolled(k)
                 if c.verdict is Verdict.UNDECIDED and c.schedule.key() not in self.pool.taken}
        predicted = {k: self.judge.predict(c) for k, c in found.items()}
        ranked = sorted(found, key=lambda k: (predicted[k] is None, predicted[k] or 0.0, k))
        self.judge.prefer(ranked[:EARLY])

    def probed(self, cand: Candidate) -> bool:
        """``cand``'s risky choices passed the study's probe (``ProbeGuard.allows``: probed
        now where not); else it is refused, and the choices left out leave the proposals."""
        if self.guard is None or self.guard.allows(cand.params):
            return True
        self.pool.mark(cand, Verdict.REFUSED)
        self.pool.refuse(self.guard.refused)
        return False

    # -- screening ---------------------------------------------------------------------
    def take_compiled(self, cand: Candidate) -> Compiled:
        """The candidate compiled and sized (now if not screened); the pool keeps only the
        sized figures (the caller runs and releases it)."""
        if cand.compiled is None:
            self.screen(cand)
        assert cand.compiled is not None
        compiled = cand.compiled
        cand.compiled = Compiled(compiled.measurement)
        return compiled

    def screen(self, cand: Candidate) -> None:
        """Compile and size ``cand`` (taken ahead by a compile thread where one did); its
        figures teach the memory model, the guard, the floor and a layer stack's plan."""
        key = cand.schedule.key()
        built = None
        if self._built is not None and self._built[0] == key:
            built, self._built = self._built[1:], None  # compiled once: not kept
        ahead = None if built is not None else self.ahead.take(key)
        cand.compiled = ahead if ahead is not None else compile_schedule(
            self.problem, cand.schedule, budget_bytes=self.budget_bytes, built=built)
        # when it ended: compiles beside each other cost the search less than their seconds
        ended = self.ahead.ended(key) if ahead is not None else time.monotonic()
        m = cand.compiled.measurement
        if m.compile_seconds is not None:
            self.clock.add_compile(m.compile_seconds, cand.schedule.unroll, ended)
        if m.size_bytes is not None:  # or the size the compiler stated, out of memory
            self.judge.memory_model.add(cand.structure, m.size_bytes, m.status == OVER_BUDGET,
                                        refused=m.total_bytes is None)
        if self.guard is not None:
            self.guard.failed_in_trial(cand.params, m)
        floor, least = floor_bytes(m), least_bytes(m)
        if floor is not None:
            self.floor = floor
        if least is not None:  # every schedule's total is at least this: no guess is under
            memory = self.judge.memory_model
            memory.least = float(least) if not memory.least else min(memory.least, least)
        if m.status == OVER_BUDGET and self.presets is not None:
            self.presets.observe(cand.schedule, m.size_bytes)
        self._shared.share(cand.compiled)

    # -- deciding ----------------------------------------------------------------------
    def next(self, deadline: float | None, *, explore: bool = False,
             dominated: bool = False) -> Candidate | None:
        """The next candidate to time (or to record: a failure), or ``None``: done, by
        ``deadline`` (``time.monotonic()``); ``explore``: no stop on the predicted ratio;
        ``dominated``: dominated ones too (a caller that must measure a given number)."""
        if dominated:
            self.pool.reopen_dominated()
        self.clock.until(deadline)
        while True:
            chosen = self.choose(self.clock.time_left(), explore=explore or dominated,
                                 dominated=dominated)
            if chosen != AGAIN:
                return chosen if isinstance(chosen, Candidate) else None

    def choose(self, time_left: float | None, *, explore: bool = False,
               dominated: bool = False) -> Candidate | Literal["again"] | None:
        """One round of ``next``: the candidate to time, ``AGAIN`` (one was compiled: the
        models moved, rank again) or ``None`` (done), with ``time_left`` seconds. Each
        candidate, in ranked order, gets the judge's ``next_action``."""
        if self.floor is not None and self.floor > self.budget_bytes:
            return None  # nothing can fit: the arguments and outputs alone are over
        judge = self.judge
        twins = self.twins
        rnd = Round(explore=explore, dominated_too=dominated, time_left=time_left,
                    compile_cost=self.clock.compile_cost(),
                    compile_cost_of=lambda c: self.clock.compile_cost_of(c.schedule.unroll),
                    timing_cost=self._timing_cost if judge.time_model.points else None,
                    twin=None if twins is None else (
                        lambda c: twins.first(c, self.pool.taken, judge.stop_seconds())))
        ranked = judge.rank(self.pool.open(), compiled_first=dominated)
        for i, (predicted, cand) in enumerate(ranked):
            facts = judge.facts(cand, predicted, rnd)
            decision = next_action(facts)
            target = facts.target
            if decision.verdict is not None:
                self.pool.mark(target, decision.verdict)
                if decision.verdict is Verdict.OVER_AT_RUNTIME:  # and what stores more
                    judge.memory_model.mark_over(target.structure)
                if decision.verdict is Verdict.TOO_LATE:  # the tune says so
                    self.too_late.append(TooLate(
                        target.schedule.describe(),
                        self.clock.compile_cost_of(target.schedule.unroll)))
            action = decision.action
            if action is Action.STOP:
                return None
            if action in (Action.TIME, Action.FAIL):
                return target  # a failure is recorded as a failed trial
            if action is Action.SKIP or not self.probed(target):
                continue
            if facts.preset:  # tried before all others, not counted against the patience
                self.screen(target)
                return AGAIN
            if not dominated and self.ahead.compiling(target):  # on a thread: time another
                other = self.ahead.meanwhile(ranked[i + 1:], time_left,
                                             target.schedule.key(), self.screen)
                if other is not None:
                    return other
            self.screen(target)  # the planner's own choice (not a seed, not a preset):
            self.standings.compiled_within(  # counted where it fits
                target.sized is not None and target.sized.status == OK
                and not judge.over_at_runtime(target))
            return AGAIN  # the models moved: rank again
        return None

    def _timing_cost(self, cand: Candidate, predicted: float) -> float:
        """Seconds to time ``cand`` predicted at ``predicted`` (its run, ``short``)."""
        return self.short.timing_cost(cand.schedule, predicted, self.time_budget)

    def close(self) -> None:
        """Release what the compile threads took ahead and stop them."""
        self.ahead.close()
