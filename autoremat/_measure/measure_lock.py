"""The lock a measurement holds, with the compile threads' work behind the measurer's.

``device_memory.MEASURE_LOCK`` is held while the device is measured (a timing, the memory
around a piece of work) and by every build and lowering (``measure.compile_step``): a
build may put arrays on the device, a trace holds the GIL a timed run waits for. A
tuner's compile threads (``autoremat._search.planning.compile_pool``) take it for each
build and lowering, one after another; a plain lock is not fair, so a timing that asked
for it could wait behind several of them while the device idled -- the first timing of a
TPU tune waited 3 s so (``studies/results/tune_time_v5e_workers.md``). Here a thread's
``behind()`` does not start while another waits for the lock as a measurer (``with``):
the measurer waits for the work under way, never for the work queued.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import TracebackType


class MeasureLock:
    """A re-entrant lock whose ``behind()`` holders give way to those waiting in ``with``
    (module doc)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._changed = threading.Condition()
        self._waiting = 0  # threads waiting for the lock in ``with`` (``acquire``)

    def acquire(self) -> None:
        """Take the lock, before any ``behind()`` not yet started."""
        with self._changed:
            self._waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._changed:
                self._waiting -= 1
                self._changed.notify_all()

    def release(self) -> None:
        """Let the lock go (once per ``acquire`` or ``behind()``)."""
        self._lock.release()

    def __enter__(self) -> MeasureLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.release()

    @contextlib.contextmanager
    def behind(self) -> Iterator[None]:
        """Hold the lock for the block once no thread waits for it in ``with`` (at once
        where this thread holds it already)."""
        if not self._lock._is_owned():  # type: ignore[attr-defined]
            with self._changed:
                self._changed.wait_for(lambda: self._waiting == 0)
        self._lock.acquire()
        try:
            yield
        finally:
            self._lock.release()

    def _is_owned(self) -> bool:
        """Whether this thread holds the lock (as ``threading.RLock``'s)."""
        return bool(self._lock._is_owned())  # type: ignore[attr-defined]
