"""The lock the device's measurements hold, and the order in which it is taken.

``MEASURE_LOCK`` is held while the device is measured: its memory around a piece of work
(``device_memory.need``, ``runs_within``) and a step's timing (``timing.time_compiled``);
and by every lowering (``measure.compile_step``). A tuner's compile thread
(``autoremat._search.compile_pool``) builds and lowers its step under it -- a build may put
arrays on the device, a trace holds the GIL a timed run waits for -- so a figure is the
work's alone; only XLA's compile, outside the GIL, runs beside a timing.

The device goes first: a timing takes the lock with ``device_first``, and a build or
trace not yet started when one waits (``behind_the_device``) starts after it -- one under
way ends first. On a TPU v5e the big model's timings waited 4-5 s a tune for threads'
traces that began after the device had asked for the lock (``studies/results/tune_time.md``).
A compile's sizing takes the lock as it is: the device may wait for what it needs next.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Final

MEASURE_LOCK: Final = threading.RLock()

_ASKED = threading.Condition()
_waiting = 0  # timings waiting for MEASURE_LOCK (``device_first``)


@contextlib.contextmanager
def device_first() -> Iterator[None]:
    """``MEASURE_LOCK`` for the device's own work (a timing), before any build or trace
    that has not started yet (module doc)."""
    global _waiting
    with _ASKED:
        _waiting += 1
    try:
        MEASURE_LOCK.acquire()
    finally:
        with _ASKED:
            _waiting -= 1
            _ASKED.notify_all()
    try:
        yield
    finally:
        MEASURE_LOCK.release()


@contextlib.contextmanager
def behind_the_device() -> Iterator[None]:
    """``MEASURE_LOCK`` for a build or a trace: once no timing waits for it."""
    with _ASKED:
        _ASKED.wait_for(lambda: _waiting == 0)
    with MEASURE_LOCK:
        yield
