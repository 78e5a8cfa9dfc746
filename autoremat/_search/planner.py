"""Which schedule to measure next: screen by compiled memory, predict time, time few.

A worker's ``Planner`` holds a pool of candidate schedules (the space's random draws,
``space.propose``; every structure of a short scan, ``short_scans``; the neighbours of the
best so far, ``space.neighbours``) and decides, each time the search may measure one more,
which one it is worth timing:

1. candidates are ranked by predicted step time (``predict.TimeModel``, calibrated on the
   study's own timed trials);
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
   best measured schedule that fits by ``STOP_RATIO``, widened by twice the model's own
   leave-one-out error (``stop_ratio``: a model off by 15% must not rule out a schedule
   predicted 20% slower); or when ``PATIENCE`` candidates within the budget were compiled
   since the best last improved by ``IMPROVES`` and none of those is worth timing; or
   when the time left cannot pay for the next compile or timing.

With ``explore_front`` step 4's ratio test is off: every fitting schedule not dominated
is timed. A timing stops after its first run when that run is already
``timing.CUT_RATIO`` x slower than the best that fits (a *cut* trial), and after its
fewest runs when they all are ``timing.BEATEN`` slower (``rival``). With compile threads
(``compiles``) the next candidates are compiled ahead, and the device times another while
the planner's choice compiles (``planner_ahead``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from autoremat._measure.breakdown import floor_bytes
from autoremat._measure.measure import Compiled
from autoremat._measure.measurement import ERROR, OK, OVER_BUDGET, Measurement
from autoremat._measure.problem import Problem, Step
from autoremat._measure.timing import DEFAULT_TIME_BUDGET
from autoremat._schedules.base import Schedule
from autoremat._schedules.groups import GroupsSchedule
from autoremat._schedules.policy import Policy
from autoremat._search import untimed as rules
from autoremat._search.arguments import SharedArguments
from autoremat._search.candidates import AGAIN, Candidate, Verdict
from autoremat._search.compile_pool import CompilePool
from autoremat._search.layer_costs import LayerCosts
from autoremat._search.memory_model import MemoryModel
from autoremat._search.offload_twins import OffloadTwins
from autoremat._search.planner_ahead import CompilesAhead
from autoremat._search.predict import Structure, TimeModel
from autoremat._search.presets import LayerPlan, PresetsFirst
from autoremat._search.probe_guard import ProbeGuard
from autoremat._search.short_runs import ShortRuns
from autoremat._search.short_scans import short_scan_params
from autoremat._search.space import neighbours, propose, seeds

#: Random draws in the initial pool.
POOL_SIZE: Final = 300
#: Stop when the best prediction left is this much slower than the best measured
#: (at least; ``Planner.stop_ratio`` widens it by the model's error, up to ``MAX_STOP``).
STOP_RATIO: Final = 1.15
MAX_STOP: Final = 1.6
#: Candidates the planner chose, compiled and found within the budget (not seeds or
#: presets; not one over the budget or failed: the memory model is off, not the search
#: done) since the best last improved by ``IMPROVES``, before the search stops (step 4;
#: where the time model is off, compiles after the pick changed nothing:
#: ``studies/results/tune_time.md``). The last of them may still be timed.
PATIENCE: Final = 5
#: An improvement of the best by less than this (its timing noise) does not count.
IMPROVES: Final = 0.01


@dataclass
class Planner(CompilesAhead, PresetsFirst):
    """One worker's pool of candidates and models (see the module doc)."""

    problem: Problem
    budget_bytes: int
    platform: str
    short: ShortRuns  # how a candidate is timed (the search's): its run length and cost
    seed: int = 0
    explore_front: bool = False
    time_budget: float = DEFAULT_TIME_BUDGET
    refused: frozenset[str] = frozenset()  # choices the study's probe left out
    named: Mapping[str, Policy] = field(default_factory=dict)  # over its tags (``named_policies``)
    layer_costs: LayerCosts | None = None  # a layer stack's (``presets``: tried first)
    pool: dict[str, Candidate] = field(default_factory=dict)
    timed: dict[str, tuple[int, float]] = field(default_factory=dict)  # key -> (bytes, s)
    cut: dict[str, tuple[int, float]] = field(default_factory=dict)  # one run's seconds
    taken: set[str] = field(default_factory=set)  # in the study (measured or claimed)
    time_model: TimeModel = field(default_factory=TimeModel)
    memory_model: MemoryModel = field(default_factory=MemoryModel)
    compile_seconds: list[float] = field(default_factory=list)
    floor: int | None = None  # bytes no schedule removes (``breakdown.floor_bytes``)
    #: ``(schedule key, step, args)`` built before the search (``tune``: the plain scan,
    #: whose arguments fingerprint the study), used by that schedule's compile.
    built: tuple[str, Step, tuple[Any, ...]] | None = None
    guard: ProbeGuard | None = None  # probes risky choices before a compile (``probed``)
    _shared: SharedArguments = field(default_factory=SharedArguments)  # one set of arguments
    _best_key: str | None = None
    layers: LayerPlan | None = None
    compiles: CompilePool | None = None  # threads compiling ahead (``prefetch``)
    _seeds_ahead: list[Candidate] = field(default_factory=list)  # ``prefetch``'s enqueued seeds
    deadline: float | None = None  # ``time.monotonic()`` to finish by (``next``'s)
    since_best: int = 0  # candidates compiled since the best last improved (``PATIENCE``)
    twins: OffloadTwins | None = None  # an offload's twin first (none: the whole front)
    _improved: float | None = None  # the best's seconds when it last improved
    overstated: int | None = None  # the most a size overstated a run (``untimed.Reach``)

    def __post_init__(self) -> None:
        if self.built is not None:  # every candidate's compile shares these arguments
            self._shared = SharedArguments(self.built[2])
        self.rng = random.Random(self.seed)
        self.time_model = TimeModel(self.platform)  # its prior is the platform's
        seq_len = self.problem.seq_len
        fuse = self.problem.fuse_choice
        for schedule, params in seeds(seq_len, self.platform, self.refused, fuse):
            self.add(schedule, params)
        for p in short_scan_params(seq_len, self.platform, self.rng, self.refused, self.named):
            self.add(*self.propose(p))
        for _ in range(POOL_SIZE):
            self.add(*self.propose({}))
        if self.layer_costs is not None:
            self._add_presets(self.layer_costs)
        if not self.explore_front:
            self.twins = OffloadTwins(seq_len, self.budget_bytes, self.memory_model,
                                      (self.timed, self.cut), self._proposed)

    # -- the pool ----------------------------------------------------------------------
    def propose(self, wanted: Mapping[str, Any]) -> tuple[Schedule, dict[str, Any]]:
        """``space.propose`` in this planner's space (its refused and named choices)."""
        return propose(wanted, self.problem.seq_len, self.platform, self.rng, self.refused,
                       self.problem.fuse_choice, self.named)

    def add(self, schedule: Schedule, params: dict[str, Any]) -> None:
        """A candidate, or a measured schedule (``record``). A groups draw of the space
        joins only for a layer stack (elsewhere: 42 of 56 compiles at T=32, all over)."""
        key = schedule.key()
        if params and schedule.kind == GroupsSchedule.kind and self.layer_costs is None:
            return
        if key not in self.pool:
            self.pool[key] = Candidate(schedule, params,
                                       Structure.of(schedule, self.problem.seq_len))

    def _proposed(self, wanted: Mapping[str, Any]) -> Candidate:
        schedule, params = self.propose(wanted)
        self.add(schedule, params)
        return self.pool[schedule.key()]

    @property
    def best(self) -> tuple[str, int, float] | None:
        """``(key, fit_bytes, step_seconds)`` of the fastest timed schedule that fits."""
        fits = [(s, b, k) for k, (b, s) in self.timed.items() if b <= self.budget_bytes]
        if not fits:
            return None
        s, b, k = min(fits)
        return k, b, s

    def observe(self, measured: list[tuple[Schedule, Measurement]], taken: set[str]) -> None:
        """What the study holds now (every worker's): measured trials, claimed keys."""
        self.taken = taken
        for schedule, m in measured:
            self.record(schedule, m, refit=False)
        self._refit()

    def record(self, schedule: Schedule, m: Measurement, *, refit: bool = True) -> None:
        """One measured trial: no longer a candidate; its figures calibrate the model."""
        key = schedule.key()
        self.add(schedule, {})
        cand = self.pool[key]
        if cand.verdict is Verdict.UNDECIDED:
            cand.verdict = Verdict.MEASURED
        if cand.compiled is not None:
            cand.compiled.release()
        fit = m.fit_bytes  # the measured runtime peak where there is one
        if m.step_seconds is not None and fit is not None:
            self.timed[key] = (fit, m.step_seconds)
        elif m.cut_seconds is not None and fit is not None:
            self.cut[key] = (fit, m.cut_seconds)
        self.overstated = rules.overstated_after(self.overstated, m)
        if m.status == OVER_BUDGET and m.runtime_peak_bytes is not None:
            self.memory_model.mark_over(cand.structure)  # over by its run, not its compile
        self._observe_layers(cand.schedule, m.size_bytes if fit is None else fit,
                             m.step_seconds)
        if self.guard is not None:  # a combination that failed to compile is left out
            self.guard.failed_in_trial(cand.params, m)
        if refit:
            self._refit()

    def _refit(self) -> None:
        self.time_model.fit([(self.pool[k].structure, b, s)
                             for k, (b, s) in {**self.cut, **self.timed}.items()])
        best = self.best
        if best is not None and (self._improved is None
                                 or best[2] < (1 - IMPROVES) * self._improved):
            self._improved, self.since_best = best[2], 0
        if best is not None and best[0] != self._best_key:
            self._best_key = best[0]
            if self.pool[best[0]].params:
                for schedule, params in neighbours(self.pool[best[0]].params,
                                                   self.problem.seq_len, self.platform, self.rng,
                                                   self.refused, self.problem.fuse_choice,
                                                   self.named):
                    self.add(schedule, params)

    def patience_left(self) -> int:
        """How many more of the planner's compiles that fit may come before the best
        improves (``PATIENCE``): after that, no compile more."""
        return max(0, PATIENCE - self.since_best)

    def stop_ratio(self, cand: Candidate | None = None) -> float:
        """``STOP_RATIO`` widened by twice the time model's median error, at most
        ``MAX_STOP``; for ``cand``, scaled by its distance to the nearest timed
        schedule (``TimeModel.nearest``): a neighbour of a timed one is predicted
        well, so it must be predicted within ``STOP_RATIO`` to be timed."""
        d = 1.0
        if cand is not None:
            d = self.time_model.nearest(cand.structure, float(self.total(cand) or 0))[0]
        return min(MAX_STOP, max(STOP_RATIO, 1.0 + 2.0 * self.time_model.error * d))

    def rival(self) -> float | None:
        """The best step that fits, which a timing competes with (``timing.CUT_RATIO``,
        ``BEATEN``); ``None``: time in full (none yet, or the whole front wanted)."""
        best = self.best
        return None if self.explore_front or best is None else best[2]

    def probed(self, cand: Candidate) -> bool:
        """``cand``'s risky choices passed the study's probe (``ProbeGuard.admit``: probed
        now where not); else it is refused, and the choices left out leave the proposals."""
        if self.guard is None or self.guard.admit(cand):
            return True
        self.refused = self.guard.refused
        return False

    def candidate(self, schedule: Schedule) -> Candidate:
        """The pool's candidate of a schedule that came from the study (a seed, or a
        retry of a trial whose worker died), added when the pool has none."""
        self.add(schedule, {})
        return self.pool[schedule.key()]

    # -- screening ---------------------------------------------------------------------
    def take_compiled(self, cand: Candidate) -> Compiled:
        """The candidate compiled and sized (now if not screened); the pool keeps only the
        sized figures (the caller runs and releases it)."""
        if cand.compiled is None:
            self._screen(cand)
        assert cand.compiled is not None
        compiled = cand.compiled
        cand.compiled = Compiled(compiled.measurement)
        return compiled

    def _screen(self, cand: Candidate) -> None:
        built = None
        if self.built is not None and self.built[0] == cand.schedule.key():
            built, self.built = self.built[1:], None  # compiled once: not kept
        cand.compiled = self._compile(cand, built)
        m = cand.compiled.measurement
        if m.compile_seconds is not None:
            self.compile_seconds.append(m.compile_seconds)
        if m.size_bytes is not None:  # or the size the compiler stated, out of memory
            self.memory_model.add(cand.structure, m.size_bytes, m.status == OVER_BUDGET,
                                  refused=m.total_bytes is None)
        if self.guard is not None:
            self.guard.failed_in_trial(cand.params, m)
        floor = floor_bytes(m)
        if floor is not None:
            self.floor = floor
        if m.status == OVER_BUDGET:
            self._observe_layers(cand.schedule, m.size_bytes)
        self._shared.share(cand.compiled)

    # -- what keeps a candidate untimed: ``untimed``'s rules on this planner's figures --
    def reach(self) -> rules.Reach:
        return rules.Reach(self.budget_bytes, self.platform, self.overstated,
                     tuple(self.timed.values()))

    def total(self, cand: Candidate) -> float | None:
        """Total bytes: sized, else the memory model's guess (``None``: no guess yet)."""
        sized, guess = cand.sized, self.memory_model.predict
        return sized.total_bytes if sized is not None else guess(cand.structure)

    def predict(self, cand: Candidate) -> float | None:
        """Predicted step seconds (``None`` before any schedule was timed)."""
        return self.time_model.predict(cand.structure, float(self.total(cand) or 0))

    def untimed(self, cand: Candidate, dominated: bool = False) -> Verdict | None:
        """Why ``cand``, compiled, is not timed (``untimed.untimed``; ``None``: it may be)."""
        assert cand.compiled is not None
        return rules.untimed(cand.compiled, self.predict(cand), self.reach(), dominated)

    def dominated(self, cand: Candidate, predicted: float | None) -> bool:
        return rules.dominated(self.total(cand), predicted, self.timed.values())

    def over_at_runtime(self, cand: Candidate) -> bool:
        return rules.over_at_runtime(None if cand.sized is None else self.total(cand),
                                     self.reach())

    def guessed_over(self, cand: Candidate) -> bool:
        return rules.guessed_over(self.memory_model.predict(cand.structure), self.reach())

    # -- deciding ----------------------------------------------------------------------
    def _rank(self, compiled_first: bool = False) -> list[tuple[float, Candidate]]:
        """Open candidates by predicted time (before any timing: fewest evaluations, the
        time model's prior); ``compiled_first``: those already compiled first."""
        open_ = [c for k, c in self.pool.items() if c.verdict is Verdict.UNDECIDED and k not in self.taken]
        ranked = [(self.predict(c), c) for c in open_]

        def order(pc: tuple[float, Candidate]) -> tuple[int, bool, float]:
            first = self._first(pc[1])  # a layer stack's presets, in their order, first
            return (len(self.pool) if first is None else first,
                    compiled_first and pc[1].compiled is None, pc[0])

        return sorted(((p if p is not None else c.structure.evaluations, c) for p, c in ranked),
                      key=order)

    def next(self, deadline: float | None, *, explore: bool = False,
             dominated: bool = False) -> Candidate | None:
        """The next candidate to time (or to record: a failure), or ``None``: done, by
        ``deadline`` (``time.monotonic()``); ``explore``: no stop on the predicted ratio;
        ``dominated``: dominated ones too (a caller that must measure a given number)."""
        if dominated:
            for cand in self.pool.values():
                if cand.verdict is Verdict.DOMINATED and cand.schedule.key() not in self.taken:
                    cand.verdict = Verdict.UNDECIDED
        self.deadline = deadline
        while True:
            chosen = self._next_once(self.time_left(), explore or dominated, dominated)
            if chosen != AGAIN:
                return chosen if isinstance(chosen, Candidate) else None

    def _next_once(self, time_left: float | None, explore: bool,
                   dominated: bool) -> Candidate | Literal["again"] | None:
        if self.floor is not None and self.floor > self.budget_bytes:
            return None  # nothing can fit: the arguments and outputs alone are over
        best = self.best
        stop = self.stop_ratio()
        compile_cost = self.compile_cost()
        ranked = self._rank(compiled_first=dominated)
        for i, (predicted, cand) in enumerate(ranked):
            if self.layers is not None and self._first(cand) is not None:
                if cand.compiled is None and self.layers.over(cand.schedule):
                    cand.verdict = Verdict.SURELY_OVER  # by what it keeps (``presets``)
                    continue
                first = self._next_first(cand, time_left, compile_cost)
                if first is not None:
                    return first
                continue
            calibrated = self.time_model.points >= 2 and best is not None
            if calibrated and not explore and best is not None:
                if predicted > stop * best[2]:
                    return None
                if predicted > self.stop_ratio(cand) * best[2]:
                    continue  # near a timed schedule, and not predicted within STOP_RATIO
            if cand.compiled is None:
                if calibrated and not explore and not self.patience_left():
                    continue  # no compile more; one compiled may still be timed
                screen = cand if self.twins is None else self.twins.first(
                    cand, self.taken, None if best is None else stop * best[2])
                if screen is None:
                    continue
                cand = screen
                if self._surely_over(cand):
                    cand.verdict = Verdict.SURELY_OVER
                    continue
                if not explore and self.dominated(cand, predicted):
                    continue  # by the memory model's guess: not worth a compile (yet)
                if time_left is not None and time_left < compile_cost:
                    return None
                if not self.probed(cand):
                    continue
                if not dominated and self.compiling(cand):  # on a thread: time another
                    other = self.meanwhile(ranked[i + 1:], time_left, cand.schedule.key())
                    if other is not None:
                        return other
                self._screen(cand)  # the planner's own choice (not a seed, not a preset):
                self.since_best += (cand.sized is not None and cand.sized.status == OK
                                    and not self.over_at_runtime(cand))  # fits
                return AGAIN  # the models moved: rank again
            m = cand.compiled.measurement
            if m.status == ERROR:
                return cand  # recorded as a failed trial
            verdict = self.untimed(cand, dominated)
            if verdict is not None:
                cand.verdict = verdict
                if verdict is Verdict.OVER_AT_RUNTIME:  # and what stores more
                    self.memory_model.mark_over(cand.structure)
                continue
            if (time_left is not None and self.time_model.points
                    and time_left < self.short.timing_cost(cand.schedule, predicted,
                                                           self.time_budget)):
                return None
            return cand
        return None
