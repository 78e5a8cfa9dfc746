"""What every outermost autoremat scan reports at trace time, whatever its schedule:
its stacked per-step outputs and its carry (the floor under every schedule's memory,
``autoremat._measure.breakdown``). No jax here: the measurement stage reads these."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class ScanRecord:
    """What one autoremat scan holds whatever its schedule (``record_scans``).

    Attributes:
      stacked_bytes: its stacked per-step outputs (``T`` x one step's ``y``), as the
        arrays' shapes say (no device padding).
      carry_bytes: one carry.
      stacked_shapes: ``(shape, dtype name)`` of each stacked array: the measurement
        stage sizes them as the device lays them out (a TPU pads to tiles).
    """

    stacked_bytes: int
    carry_bytes: int
    stacked_shapes: tuple[tuple[tuple[int, ...], str], ...] = ()


SCAN_RECORDS: contextvars.ContextVar[list[ScanRecord] | None] = contextvars.ContextVar(
    "autoremat_scan_records", default=None)


@contextlib.contextmanager
def record_scans() -> Iterator[list[ScanRecord]]:
    """Every outermost autoremat scan traced inside appends its ``ScanRecord`` to the list.

    Scans inside a scanned step are not recorded: what they stack is part of
    the outer step's output.
    """
    records: list[ScanRecord] = []
    token = SCAN_RECORDS.set(records)
    try:
        yield records
    finally:
        SCAN_RECORDS.reset(token)
