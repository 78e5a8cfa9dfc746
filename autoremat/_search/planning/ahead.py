"""Compiles ahead: the next candidates compiled on threads while the device times one.

A ``Planner`` (``autoremat._search.planning.planner``) holds a ``CompilesAhead`` over a
``CompilePool`` of threads (``compile_pool``: its size rule). Each time the device is
about to time a schedule, ``prefetch`` hands the threads the candidates the planner
would compile next (``upcoming``: by today's models, as the planner's own rules would
pick them), and ``take`` hands over a finished one when its candidate comes up. Only
the main thread reads the results and updates the models. The planner's own choice, not
compiled ahead, goes to a thread too (``compiling``); until it is done the device times
another the planner would time, already compiled (``meanwhile``), instead of waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autoremat._measure.measure import Compiled
from autoremat._measure.timing import CUT_RATIO
from autoremat._schedules.base import Schedule
from autoremat._search.planning.candidates import Candidate, Verdict
from autoremat._search.planning.clock import Clock
from autoremat._search.planning.compile_pool import CompilePool
from autoremat._search.planning.judge import Judge, Round
from autoremat._search.planning.offload_twins import OffloadTwins
from autoremat._search.planning.pool import Pool
from autoremat._search.planning.screening import Action, next_action
from autoremat._search.probes.guard import ProbeGuard
from autoremat._search.short_runs import ShortRuns


class CompilesAhead:
    """One planner's compiles ahead (module doc): what it would compile next, read from
    its ``pool``, ``judge`` and ``clock``, the offload ``twins`` (compiled first) and the
    probe ``guard`` (a candidate using a risky choice is probed first, on the main
    thread). ``threads`` ``None``: every method is a no-op; ``built``: the schedule key
    compiled with the arguments built before the search (never taken ahead)."""

    def __init__(self, threads: CompilePool | None, pool: Pool, judge: Judge, clock: Clock,
                 short: ShortRuns, time_budget: float, *, twins: OffloadTwins | None = None,
                 guard: ProbeGuard | None = None, built: str | None = None) -> None:
        self.threads, self.pool, self.judge, self.clock = threads, pool, judge, clock
        self.short, self.time_budget = short, time_budget
        self.twins, self.guard, self.built = twins, guard, built
        self.seeds: list[Candidate] = []  # ``prefetch``'s enqueued seeds

    @property
    def running(self) -> bool:
        """Threads compile ahead (a pool that started at least one)."""
        return self.threads is not None and bool(self.threads.threads)

    def take(self, key: str) -> Compiled | None:
        """The compile of ``key`` a thread finished ahead; ``None``: none did (the caller
        compiles it, while the threads take the next ones ahead)."""
        if self.threads is None:
            return None
        ahead = self.threads.take(key)
        if ahead is None:
            self.prefetch(exclude=key)
        return ahead

    def ended(self, key: str) -> float | None:
        """When the compile of ``key`` a thread finished ahead ended (``None``: none did)."""
        return None if self.threads is None else self.threads.ended(key)

    def prefetch(self, exclude: str | None = None,
                 first: Sequence[Schedule] | None = None) -> None:
        """Hand the compile threads the candidates the planner would compile next
        (``upcoming``, as many as they hold); one taken ahead before that is no longer among
        the next twice as many is dropped -- but ``exclude``, the one compiled or taken now.
        ``first``: schedules measured before any the planner picks (enqueued seeds;
        ``None``: those given last time). A no-op without threads, and none is started
        within two compiles of the deadline (``Clock.time_left``). The results are read
        when their candidate comes up (``take``)."""
        if self.threads is None or not self.running:
            return
        if first is not None:
            self.seeds = [self.pool.candidate(s) for s in first]
        n = self.threads.capacity
        wanted = [c.schedule.key() for c in self.upcoming(n * 2, exclude)]
        self.threads.keep_only([*wanted, *([exclude] if exclude else [])])
        left = self.clock.time_left()
        if left is not None and left < 2 * self.clock.compile_cost():
            return  # one started now would be done too late to be timed, and delay the end
        for key in wanted[:n]:
            self.threads.submit(key, self.pool[key].schedule)

    def upcoming(self, n: int, exclude: str | None = None) -> list[Candidate]:
        """The first ``n`` candidates the planner would compile, by today's models: open
        and unsized, short of the stop, not surely over the budget, not dominated by the
        memory model's guess (nor an offload by its twin); those predicted to be cut (over
        ``CUT_RATIO`` x the best) after the rest: the planner compiles them too when they
        come up, and compiled here they cost the device no wait (a big model waited on two
        such compiles on the main thread: ``studies/results/tune_time.md``);
        ``exclude``: a key left out. The enqueued
        seeds (``prefetch``'s ``first``) come first, whatever their prediction; those likely
        over the budget at run time (``Judge.guessed_over``) go after the rest too. The
        rules are the planner's (``screening.next_action``), without the clock."""
        judge, taken = self.judge, self.pool.taken
        self.seeds = [c for c in self.seeds if c.verdict is Verdict.UNDECIDED
                      and c.compiled is None and c.schedule.key() not in taken]
        found = [c for c in self.seeds
                 if c.schedule.key() != exclude and c.schedule.key() != self.built][:n]
        rival = judge.rival()
        cut = None if rival is None else CUT_RATIO * rival
        explore = judge.explore_front
        # no more of the planner's own than its patience lets it compile (``PATIENCE``)
        calibrated = judge.calibrated()
        own = judge.patience_left() if calibrated and not explore else n
        later: list[Candidate] = []  # predicted to be cut
        left = self.clock.time_left()
        for predicted, cand in judge.rank(self.pool.open()):
            key = cand.schedule.key()
            if len(found) >= n:
                break
            if cand.compiled is not None or key in (exclude, self.built) or any(
                    c is cand for c in found):
                continue
            if self.guard is not None and self.guard.used(cand.params):
                continue  # probed first, on the main thread (``Planner.probed``)
            if self.twins is not None and self.twins.waits(cand, taken):
                continue  # its twin first, or dominated by it (``offload_twins``)
            facts = judge.facts(cand, predicted, Round(explore=explore, own_left=own))
            action = next_action(facts).action  # the planner's rules, no clock
            if action is Action.STOP:
                break
            if action is not Action.COMPILE:
                continue
            unroll = cand.schedule.unroll
            if unroll > 1 and left is not None and left < self.clock.compile_cost_of(unroll):
                continue  # an unrolled compile that would end past the limit: not started
            if facts.preset:  # a layer stack's preset: no prediction rules it out
                found.append(cand)
                continue
            own -= 1
            cut_or_over = (calibrated and cut is not None and predicted > cut) or (
                judge.guessed_over(cand))
            (later if cut_or_over else found).append(cand)
        return [*found, *later][:n]

    def compiling(self, cand: Candidate) -> bool:
        """``cand`` compiles on a thread and is not done yet (handed to the thread kept for
        it, ``CompilePool.urgent``, when none took it ahead): the device need not wait for
        it (``meanwhile``). ``False``: no thread, or it is done; it is compiled here."""
        return self.threads is not None and self.threads.urgent(cand.schedule.key(),
                                                                cand.schedule)

    def meanwhile(self, ranked: Sequence[tuple[float, Candidate]], time_left: float | None,
                  compiling: str, screen: Callable[[Candidate], None]) -> Candidate | None:
        """While the candidate ranked first (key ``compiling``) compiles on a thread
        (``compiling``): the first of ``ranked`` (those after it) sized, within the budget,
        not dominated and predicted short of the stop -- one the planner would time when it
        came up -- for the device to time instead of waiting (one done ahead is taken now,
        by the planner's ``screen``); none yet, it waits for the first compile under way to
        end and looks again (where the device's waits went: ``studies/results/tune_time.md``).
        ``None``: ``compiling`` is done first; the caller takes it."""
        while True:
            found = self._meanwhile_once(ranked, time_left, screen)
            if found is not None or self.threads is None or not self.threads.wait_other(
                    compiling):
                return found

    def _meanwhile_once(self, ranked: Sequence[tuple[float, Candidate]],
                        time_left: float | None,
                        screen: Callable[[Candidate], None]) -> Candidate | None:
        judge = self.judge
        rnd = Round(explore=judge.explore_front, time_left=time_left,
                    timing_cost=lambda c, p: self.short.timing_cost(c.schedule, p,
                                                                    self.time_budget))
        for _, cand in ranked:
            if cand.compiled is None:
                if self.threads is None or not self.threads.ready(cand.schedule.key()):
                    continue  # no compile is started or waited for here
                screen(cand)  # done ahead: taken without waiting
            predicted = judge.predict(cand)  # sized now: its own prediction
            if judge.first(cand) is not None or predicted is None:
                continue  # a preset comes up first in the planner's own order
            if next_action(judge.facts(cand, predicted, rnd)).action is Action.TIME:
                return cand  # one the planner would time
        return None

    def close(self) -> None:
        """Release what the compile threads took ahead and stop them."""
        if self.threads is not None:
            self.threads.close()
