"""What scheduling can save at most, measured before the search: two compiles.

A schedule changes only what the long scans keep for the backward pass: the
attention scores, the MLP activations and anything else a step holds outside its
scans stay whatever the schedule. ``scan_bound`` compiles the step twice -- as
written (the plain scan) and with every long scan at the least memory a schedule
gives it (``least_memory``: three nested levels of about ``T^(1/3)`` steps that save
nothing, ``O(3 T^(1/3))`` carries and one step's residuals, Chen et al. 2016,
arXiv 1604.06174) -- and reads both totals from the compiled executables. Their
difference is what the search can win, up to the few carries a deeper nesting would
save too; where it is a small share of the step (``NEGLIGIBLE``) the tune says so at
once and times the plain scan only, and where even the least is over the budget it
says that this is why nothing fits.

Offload policies (a GPU or TPU moving residuals to host memory) can go under the
least figure; there the bound informs but does not stop the search.

Where the search compiles on threads (an accelerator: ``compile_workers`` > 1) the two
compiles run on two threads of their own (``start_bound``), as a compile thread runs
one (``compile_pool.compile_quietly``), beside each other and beside the search's first
compiles ahead, and the search does not wait for them: its first timings run while the
least-memory schedule compiles, and the bound is read between trials (``BoundWatch``),
where a negligible one stops the search at what was timed by then. On a CPU, whose
compiles share the cores a timing uses, they run one after the other on the calling
thread, before the first trial.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

from autoremat._measure.measure import Compiled, compile_schedule
from autoremat._measure.problem import Problem, Step
from autoremat._schedules import nested, plain
from autoremat._schedules.base import Schedule
from autoremat._search.planning.compile_pool import compile_quietly, compile_workers, traces_as

#: A saving under this share of the step is not worth a search: the plain scan is timed
#: and is the answer where it fits.
NEGLIGIBLE: Final = 0.02
#: The study user attr that holds the bound (a resumed study does not compile it again).
BOUND_ATTR: Final = "scan_bound"


@dataclass(frozen=True)
class Bound:
    """The step's total as written and under the least-memory schedule.

    Attributes:
      step_bytes: the plain scan's total (``memory_analysis()``: arguments + outputs +
        temp - alias).
      least_bytes: the total with every long scan under ``least``.
      least: that schedule, described.
      seconds: the two compiles' wall time.
    """

    step_bytes: int
    least_bytes: int
    least: str
    seconds: float

    @property
    def saving(self) -> int:
        """The most any schedule saves (never below zero)."""
        return max(0, self.step_bytes - self.least_bytes)

    @property
    def share(self) -> float:
        """``saving`` as a share of the step's total."""
        return self.saving / self.step_bytes if self.step_bytes else 0.0

    @property
    def negligible(self) -> bool:
        return self.share < NEGLIGIBLE

    def to_attrs(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, attrs: Mapping[str, Any]) -> Bound | None:
        """The bound a study recorded (``BOUND_ATTR``), ``None`` when it has none."""
        data = attrs.get(BOUND_ATTR)
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(int(data["step_bytes"]), int(data["least_bytes"]), str(data["least"]),
                       float(data["seconds"]))
        except (KeyError, TypeError, ValueError):
            return None


def least_memory(seq_len: int, fuse: bool | None) -> Schedule:
    """Three nested levels of about ``T^(1/3)`` steps saving nothing (two when ``T`` is
    short): the least memory a nested schedule gives a scan, up to a few carries.
    ``fuse``: the readout in the step too, where that is a choice (less memory)."""
    depth = 3 if seq_len >= 27 else 2 if seq_len >= 4 else 1
    if depth == 1:
        return replace(plain(seq_len), fuse=fuse)
    inner = max(2, round(seq_len ** (1 / depth)))
    lengths = [max(1, math.ceil(seq_len / inner ** (depth - 1)))] + [inner] * (depth - 1)
    return replace(nested(lengths, "nothing_saveable"), fuse=fuse)


def _jobs(problem: Problem, built: tuple[Step, tuple[Any, ...]] | None,
          ) -> tuple[Schedule, list[tuple[Schedule, tuple[Step, tuple[Any, ...]] | None]]]:
    """The least-memory schedule, and the two compiles (a schedule, its build where the
    caller has it): the step as written, then under it."""
    least = least_memory(problem.seq_len, True if problem.fuse_choice else None)
    return least, [(plain(problem.seq_len), built), (least, None)]


def _bound(least: Schedule, compiled: list[Compiled], seconds: float) -> Bound | None:
    totals = [c.measurement.total_bytes for c in compiled]
    for c in compiled:
        c.release()
    if totals[0] is None or totals[1] is None:
        return None
    return Bound(int(totals[0]), int(totals[1]), least.describe(), seconds)


def scan_bound(problem: Problem, built: tuple[Step, tuple[Any, ...]] | None = None,
               ) -> Bound | None:
    """Compile ``problem``'s step as written (``built``: its plain build, when the caller has
    it) and under ``least_memory``, one after the other; ``None`` when either fails to build
    or compile (the search then finds out and says so per trial)."""
    start = time.monotonic()
    least, jobs = _jobs(problem, built)
    compiled = [compile_schedule(problem, schedule, built=made) for schedule, made in jobs]
    return _bound(least, compiled, time.monotonic() - start)


class PendingBound:
    """``scan_bound`` under way on two threads (``parallel``) while the caller goes on, or
    done at once; ``result()`` waits for it."""

    def __init__(self, problem: Problem, built: tuple[Step, tuple[Any, ...]] | None,
                 platform: str, parallel: bool) -> None:
        self._start = time.monotonic()
        self._futures: list[Future[tuple[Compiled | None, float]]] = []
        self._done: Bound | None = None
        if not parallel:
            self._done = scan_bound(problem, built)
            return
        from autoremat._jax import trace_context  # imports jax

        self._problem = problem
        self._least, self._compiles = _jobs(problem, built)
        expected = trace_context()  # the caller's: a thread compiles only where it matches
        threads = ThreadPoolExecutor(2, thread_name_prefix="autoremat-bound")
        self._futures = [threads.submit(contextvars.copy_context().run, _on_thread, problem,
                                        schedule, made, platform, expected)
                         for schedule, made in self._compiles]
        threads.shutdown(wait=False)

    def done(self) -> bool:
        """Whether both compiles have ended (``result`` then waits for neither)."""
        return all(future.done() for future in self._futures)

    def result(self) -> Bound | None:
        """The bound, ``None`` where a compile failed."""
        if self._futures:
            compiled: list[Compiled] = []
            ends: list[float] = []
            for (schedule, made), future in zip(self._compiles, self._futures, strict=True):
                done, end = future.result()
                if done is None:  # the thread did not trace as the caller does: done here
                    done = compile_schedule(self._problem, schedule, built=made)
                    end = time.monotonic()
                compiled.append(done)
                ends.append(end)
            self._futures = []
            self._done = _bound(self._least, compiled, max(ends) - self._start)
        return self._done


def _on_thread(problem: Problem, schedule: Schedule,
               built: tuple[Step, tuple[Any, ...]] | None, platform: str, expected: object,
               ) -> tuple[Compiled | None, float]:
    """``schedule`` compiled on a thread where JAX traces as on the caller's (``None``: it
    does not), and when it ended."""
    if not traces_as(expected):
        return None, time.monotonic()
    return compile_quietly(problem, schedule, None, platform, built), time.monotonic()


def start_bound(study: Any, problem: Problem, built: tuple[Step, tuple[Any, ...]] | None,
                platform: str) -> PendingBound | Bound:
    """The bound ``study`` recorded (a resumed study: no compile), else ``scan_bound``'s,
    started: on threads beside the caller where the search compiles on threads
    (``compile_workers`` > 1), else now (``recorded_bound`` waits for it)."""
    return Bound.of(study.user_attrs) or PendingBound(
        problem, built, platform, parallel=compile_workers(platform) > 1)


def recorded_bound(study: Any, bound: PendingBound | Bound) -> Bound | None:
    """``start_bound``'s bound, waited for and recorded in ``study`` (on the caller's thread:
    the storage is written from one thread)."""
    if isinstance(bound, Bound):
        return bound
    done = bound.result()
    if done is not None:
        study.set_user_attr(BOUND_ATTR, done.to_attrs())
    return done


def trials_worth(bound: Bound | None, budget_bytes: int, platform: str) -> int | None:
    """How many schedules are worth measuring when no count was asked for: where scheduling
    can save only a negligible share of the step, the plain scan alone (the first
    candidate) -- none on a CPU where even the least is over the budget (no offload goes
    under it there); ``None``: as many as the search wants."""
    if bound is None or not bound.negligible:
        return None
    if bound.step_bytes <= budget_bytes:
        return 1
    return 0 if platform == "cpu" and bound.least_bytes > budget_bytes else None


class BoundWatch:
    """The bound as the search reads it between trials (``Worker.run``'s ``most``): not
    waited for while its compiles run on threads, so the first timings do not wait for the
    least-memory compile; once it is there, recorded, passed to ``on_bound`` and, where the
    search is the tune's to size (``searching``: no trial count given), the cap of
    ``trials_worth`` -- no more than were measured by then."""

    def __init__(self, study: Any, pending: PendingBound | Bound | None, budget_bytes: int,
                 platform: str, searching: bool,
                 on_bound: Callable[[Bound], None] | None) -> None:
        self._study, self._pending = study, pending
        self._budget, self._platform, self._searching = budget_bytes, platform, searching
        self._on_bound = on_bound
        self._bound: Bound | None = None

    def cap(self, measured: int) -> int | None:
        """Before a trial, with ``measured`` trials measured: the most worth measuring;
        ``None``: no cap (or the bound still compiling)."""
        if isinstance(self._pending, PendingBound) and not self._pending.done():
            return None
        bound = self.bound()
        worth = trials_worth(bound, self._budget, self._platform) if self._searching else None
        return None if worth is None else max(worth, measured)

    def bound(self) -> Bound | None:
        """The bound, waited for where it is still compiling; recorded and passed to
        ``on_bound`` once."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._bound = recorded_bound(self._study, pending)
            if self._bound is not None and self._on_bound is not None:
                self._on_bound(self._bound)
        return self._bound
