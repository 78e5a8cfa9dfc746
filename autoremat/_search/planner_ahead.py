"""The planner's compiles ahead: the next candidates compiled while the device times one.

``Planner`` (``autoremat._search.planner``) inherits ``CompilesAhead``: with a
``CompilePool`` of threads (``compile_pool``: its size rule), each time the device is
about to time a schedule, ``prefetch`` hands the threads the candidates the planner
would compile next (``ahead``: by today's models, as the planner's own rules would
pick them), and ``_compile`` takes a finished one when its candidate comes up. Only
the main thread reads the results and updates the models. The planner's own choice, not
compiled ahead, goes to a thread too (``compiling``); until it is done the device times
another the planner would time, already compiled (``meanwhile``), instead of waiting.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autoremat._measure import device_memory
from autoremat._measure.measure import Compiled, compile_schedule
from autoremat._measure.measurement import OK
from autoremat._measure.problem import Problem, Step
from autoremat._measure.timing import CUT_RATIO
from autoremat._schedules.base import Schedule
from autoremat._search.candidates import Candidate, Verdict
from autoremat._search.compile_pool import CompilePool
from autoremat._search.memory_model import MemoryModel
from autoremat._search.offload_twins import OffloadTwins
from autoremat._search.predict import TimeModel
from autoremat._search.presets import LayerPlan
from autoremat._search.short_runs import ShortRuns

if TYPE_CHECKING:
    from autoremat._search.probe_guard import ProbeGuard


class CompilesAhead:
    """The compiles-ahead part of ``Planner`` (module doc); the attributes and methods
    declared here are the planner's."""

    problem: Problem
    budget_bytes: int
    platform: str
    explore_front: bool
    deadline: float | None
    compile_seconds: list[float]
    pool: dict[str, Candidate]
    taken: set[str]
    built: tuple[str, Step, tuple[Any, ...]] | None
    guard: ProbeGuard | None
    layers: LayerPlan | None
    memory_model: MemoryModel
    time_model: TimeModel
    compiles: CompilePool | None
    short: ShortRuns
    time_budget: float
    _seeds_ahead: list[Candidate]
    twins: OffloadTwins | None

    if TYPE_CHECKING:
        @property
        def best(self) -> tuple[str, int, float] | None: ...
        def rival(self) -> float | None: ...
        def stop_ratio(self, cand: Candidate | None = None) -> float: ...
        def patience_left(self) -> int: ...
        def predict(self, cand: Candidate) -> float | None: ...
        def _screen(self, cand: Candidate) -> None: ...
        def untimed(self, cand: Candidate, dominated: bool = False) -> Verdict | None: ...
        def guessed_over(self, cand: Candidate) -> bool: ...
        def candidate(self, schedule: Schedule) -> Candidate: ...
        def _rank(self, compiled_first: bool = False) -> list[tuple[float, Candidate]]: ...
        def _first(self, cand: Candidate) -> int | None: ...
        def dominated(self, cand: Candidate, predicted: float | None) -> bool: ...

    def compile_cost(self) -> float:
        """Mean seconds of one compile so far (0 before any)."""
        seconds = self.compile_seconds
        return sum(seconds) / len(seconds) if seconds else 0.0

    def time_left(self) -> float | None:
        """Seconds left to start compiles and timings (``None``: no deadline): to the
        deadline, less one compile where the pick's proof of fit compiles it again (a
        platform whose fit a run decides, ``device_memory.VALIDATED``; ``proof``), so
        the tune ends within its time limit."""
        if self.deadline is None:
            return None
        reserve = self.compile_cost() if self.platform in device_memory.VALIDATED else 0.0
        return self.deadline - time.monotonic() - reserve

    def _surely_over(self, cand: Candidate) -> bool:
        """Not worth a compile: over the budget by the memory model's rule or far over it by
        its guess (``MemoryModel.far_over``) or, in a layer stack, by what the schedule
        keeps (``presets.LayerPlan.over``)."""
        return self.memory_model.surely_over(cand.structure) or self.memory_model.far_over(
            cand.structure, self.budget_bytes) or (
            self.layers is not None and self.layers.over(cand.schedule))

    def _compile(self, cand: Candidate, built: tuple[Step, tuple[Any, ...]] | None) -> Compiled:
        """``cand`` compiled and sized: taken ahead by a compile thread, else compiled here
        (while the threads take the next ones ahead)."""
        key = cand.schedule.key()
        if self.compiles is not None and built is None:
            ahead = self.compiles.take(key)
            if ahead is not None:
                return ahead
            self.prefetch(exclude=key)
        return compile_schedule(self.problem, cand.schedule, budget_bytes=self.budget_bytes,
                                built=built)

    def prefetch(self, exclude: str | None = None,
                 first: Sequence[Schedule] | None = None) -> None:
        """Hand the compile threads the candidates ``next`` would compile next (``ahead``,
        as many as they hold); one taken ahead before that is no longer among the next
        twice as many is dropped -- but ``exclude``, the one compiled or taken now.
        ``first``: schedules measured before any the planner picks (enqueued seeds;
        ``None``: those given last time). A no-op without threads, and none is started
        within two compiles of the deadline (``time_left``). The results are read when
        their candidate comes up (``_compile``)."""
        if self.compiles is None or not self.compiles.threads:
            return
        if first is not None:
            self._seeds_ahead = [self.candidate(s) for s in first]
        n = self.compiles.capacity
        wanted = [c.schedule.key() for c in self.ahead(2 * n, exclude)]
        self.compiles.keep_only([*wanted, *([exclude] if exclude else [])])
        left = self.time_left()
        if left is not None and left < 2 * self.compile_cost():
            return  # one started now would be done too late to be timed, and delay the end
        for key in wanted[:n]:
            self.compiles.submit(key, self.pool[key].schedule)

    def ahead(self, n: int, exclude: str | None = None) -> list[Candidate]:
        """The first ``n`` candidates ``_next_once`` would compile, by today's models: open
        and unsized, short of the stop, not surely over the budget, not dominated by the
        memory model's guess (nor an offload by its twin); those predicted to be cut (over
        ``CUT_RATIO`` x the best) after the rest: ``next`` compiles them too when they come
        up, and compiled here they cost the device no wait (a big model waited on two such
        compiles on the main thread: ``studies/results/tune_time.md``);
        ``exclude``: a key left out. The enqueued
        seeds (``prefetch``'s ``first``) come first, whatever their prediction; those likely
        over the budget at run time (``guessed_over``) go after the rest too."""
        self._seeds_ahead = [c for c in self._seeds_ahead if c.verdict is Verdict.UNDECIDED
                             and c.compiled is None and c.schedule.key() not in self.taken]
        found = [c for c in self._seeds_ahead if c.schedule.key() != exclude and not (
            self.built is not None and self.built[0] == c.schedule.key())][:n]
        best, rival, stop = self.best, self.rival(), self.stop_ratio()
        cut = None if rival is None else CUT_RATIO * rival
        calibrated = self.time_model.points >= 2 and best is not None
        # no more of the planner's own than its patience lets it compile (``PATIENCE``)
        own = self.patience_left() if calibrated and not self.explore_front else n
        later: list[Candidate] = []  # predicted to be cut
        for predicted, cand in self._rank():
            key = cand.schedule.key()
            if len(found) >= n:
                break
            if cand.compiled is not None or key == exclude or any(c is cand for c in found) or (
                    self.built is not None and self.built[0] == key):
                continue
            if self.guard is not None and self.guard.used(cand.params):
                continue  # probed first, on the main thread (``probed``)
            if self.twins is not None and self.twins.waits(cand, self.taken):
                continue  # its twin first, or dominated by it (``offload_twins``)
            if self._first(cand) is not None:  # a layer stack's preset: no prediction rules it out
                if self.layers is None or not self.layers.over(cand.schedule):
                    found.append(cand)
                continue
            if calibrated and best is not None and not self.explore_front:
                if predicted > stop * best[2]:
                    break
                if predicted > self.stop_ratio(cand) * best[2]:
                    continue
            if self._surely_over(cand):
                continue
            if not self.explore_front and self.dominated(cand, predicted):
                continue
            if own <= 0:
                break
            own -= 1
            cut_or_over = (calibrated and cut is not None and predicted > cut) or (
                self.guessed_over(cand))
            (later if cut_or_over else found).append(cand)
        return [*found, *later][:n]

    def compiling(self, cand: Candidate) -> bool:
        """``cand`` compiles on a thread and is not done yet (handed to the thread kept for
        it, ``CompilePool.urgent``, when none took it ahead): the device need not wait for
        it (``meanwhile``). ``False``: no thread, or it is done; it is compiled here."""
        return self.compiles is not None and self.compiles.urgent(cand.schedule.key(),
                                                                  cand.schedule)

    def meanwhile(self, ranked: Sequence[tuple[float, Candidate]], time_left: float | None,
                  compiling: str) -> Candidate | None:
        """While the candidate ranked first (key ``compiling``) compiles on a thread
        (``compiling``): the first of ``ranked`` (those after it) sized, within the budget,
        not dominated and predicted short of the stop -- one the planner would time when it
        came up -- for the device to time instead of waiting (one done ahead is taken now);
        none yet, it waits for the first compile under way to end and looks again (where the
        device's waits went: ``studies/results/tune_time.md``). ``None``: ``compiling`` is
        done first; the caller takes it."""
        while True:
            found = self._meanwhile_once(ranked, time_left)
            if found is not None or self.compiles is None or not self.compiles.wait_other(
                    compiling):
                return found

    def _meanwhile_once(self, ranked: Sequence[tuple[float, Candidate]],
                        time_left: float | None) -> Candidate | None:
        best, stop = self.best, self.stop_ratio()
        calibrated = self.time_model.points >= 2 and best is not None
        for _, cand in ranked:
            if cand.compiled is None:
                if self.compiles is None or not self.compiles.ready(cand.schedule.key()):
                    continue  # no compile is started or waited for here
                self._screen(cand)  # done ahead: taken without waiting
            assert cand.compiled is not None
            predicted = self.predict(cand)
            if (cand.compiled.measurement.status != OK or self._first(cand) is not None
                    or predicted is None or self.untimed(cand) is not None):
                continue  # not one the planner would time (``untimed``)
            if calibrated and best is not None and not self.explore_front and (
                    predicted > stop * best[2] or predicted > self.stop_ratio(cand) * best[2]):
                continue
            if time_left is not None and time_left < self.short.timing_cost(
                    cand.schedule, predicted, self.time_budget):
                continue
            return cand
        return None

    def close(self) -> None:
        """Release what the compile threads took ahead and stop them."""
        if self.compiles is not None:
            self.compiles.close()
