"""Other processes of a multi-controller job that compile and run every step with this one.

In a lockstep tune (``autoremat._search.lockstep``) one process decides what to measure
and every process compiles and runs the same program: JAX's SPMD partitioner gives each
process the program of its own devices, and a step whose arguments span every process's
devices runs only when all of them run it. The problem of such a tune carries its
``Peers`` (``on_every_process``: the problem, and the same at each length): each compile
of its step (``measure.compile_schedule``) tells them what it compiles (``announce``) and
hands them the result (``joined``); they compile the same schedule and return the
executable wrapped so that every run of it is a run on every process, and the
measurement combined over processes (``combine``): every byte figure the largest on any
device of any process, a failure anywhere the trial's failure, naming the process. A
problem without peers (one process, or a job that does not tune in lockstep) compiles
here alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final, Protocol

from autoremat._measure import device_memory
from autoremat._measure.measurement import ERROR, OK, OVER_BUDGET, Measurement, Status
from autoremat._measure.problem import Problem

if TYPE_CHECKING:
    from autoremat._measure.timing import Compiled
    from autoremat._schedules.base import Schedule

#: The byte figures combined as the largest over processes.
BYTE_FIGURES: Final = ("total_bytes", "temp_bytes", "argument_bytes", "output_bytes",
                       "alias_bytes", "peak_bytes", "runtime_peak_bytes",
                       "compile_scratch_bytes", "compiler_bytes")


class Peers(Protocol):
    """The other processes of a lockstep tune, as ``measure.compile_schedule`` sees them."""

    def announce(self, problem: Problem, schedule: Schedule, budget_bytes: int | None) -> int:
        """Tell every other process to compile ``schedule`` of ``problem``; a ticket."""
        ...

    def joined(self, ticket: int, compiled: Compiled) -> Compiled:
        """This process's ``compiled`` with the others' figures combined in and its
        executable run on every process at each call."""
        ...


@dataclass(frozen=True)
class _OnEveryProcess(Problem):
    """A problem whose every compile is announced to ``peers`` and joined with theirs."""

    peers: Peers | None = field(default=None, repr=False, compare=False)


def on_every_process(problem: Problem, peers: Peers) -> Problem:
    """``problem`` compiled on every process (``peers``), and so is ``at_length(n)`` of it
    (short runs); ``small()`` (a probe's instance) stays this process's alone."""
    at_length = problem.at_length

    def at(n: int) -> Problem:
        assert at_length is not None
        return on_every_process(at_length(n), peers)

    kept = {f.name: getattr(problem, f.name) for f in fields(Problem)}
    return _OnEveryProcess(**{**kept, "at_length": None if at_length is None else at},
                           peers=peers)


def peers_of(problem: Problem) -> Peers | None:
    """The other processes that compile and run ``problem``'s step with this one, if any."""
    return problem.peers if isinstance(problem, _OnEveryProcess) else None


def combine(mine: Measurement, theirs: Sequence[tuple[int, Measurement]],
            budget_bytes: int | None) -> Measurement:
    """One measurement of a step compiled on every process (the module doc): ``mine``,
    with each byte figure the largest of any process's; an error on any process is the
    trial's error (the first, naming its process), a size over ``budget_bytes`` on any
    process (or a process that found it so) makes it over the budget."""
    if mine.status == ERROR:
        return mine
    for process, other in theirs:
        if other.status == ERROR:
            return _with(mine, ERROR, f"process {process}: {other.reason}",
                         failed_at=other.failed_at, out_of_memory=other.out_of_memory)
    figures: dict[str, Any] = {}
    for name in BYTE_FIGURES:
        values = [v for v in (getattr(m, name) for m in (mine, *(o for _, o in theirs)))
                  if v is not None]
        figures[name] = max(values) if values else None
    combined = _with(mine, mine.status, mine.reason, **figures)
    if combined.status != OK:
        return combined
    over = next(((p, o) for p, o in theirs if o.status == OVER_BUDGET), None)
    if over is not None:
        return _with(combined, OVER_BUDGET, f"process {over[0]}: {over[1].reason}")
    total = combined.total_bytes
    if (budget_bytes is not None and total is not None and total > budget_bytes
            and combined.platform not in device_memory.VALIDATED):
        return _with(combined, OVER_BUDGET, f"over budget: total {total} bytes on some "
                                            f"process's device > budget {budget_bytes} bytes "
                                            "(not run)")
    return combined


def _with(m: Measurement, status: Status, reason: str, **figures: Any) -> Measurement:
    """``m`` with another outcome and the given figures (by their flat names)."""
    return Measurement(m.schedule_key, status, reason, sizes=m.sizes, peaks=m.peaks,
                       timing=m.timing, where=m.where, failure=m.failure, proof=m.proof,
                       **figures)
