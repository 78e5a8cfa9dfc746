"""Other processes of a multi-controller job that compile and run every step with this one.

In a lockstep tune (``autoremat._search.lockstep``) one process decides what to measure
and every process compiles and runs the same program: JAX's SPMD partitioner gives each
process the program of its own devices, and a step whose arguments span every process's
devices runs only when all of them run it. ``measure.compile_schedule`` tells the
``Peers`` registered here (``active``) what it compiles (``announce``) and hands them
the result (``joined``); they compile the same schedule and return the executable
wrapped so that every run of it is a run on every process, and the measurement combined
over processes (``combine``): every byte figure the largest on any device of any process,
a failure anywhere the trial's failure, naming the process. With no peers registered
(one process, or a job that does not tune in lockstep) nothing changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from autoremat._measure import device_memory
from autoremat._measure.measurement import ERROR, OK, OVER_BUDGET, Measurement, Status

if TYPE_CHECKING:
    from autoremat._measure.problem import Problem
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


_ACTIVE: list[Peers] = []


def active() -> Peers | None:
    """The peers of the lockstep tune under way in this process, if any."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.contextmanager
def registered(peers: Peers) -> Iterator[None]:
    """``peers`` are ``active()`` inside the block."""
    _ACTIVE.append(peers)
    try:
        yield
    finally:
        _ACTIVE.remove(peers)


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
