"""The lock a measurement holds against other threads' Python: ``device_memory.MEASURE_LOCK``.

A re-entrant lock, as ``threading.RLock``, with one difference: a step's timing
(``first``) goes before every thread still waiting for it. ``RLock`` wakes its
waiters in no order, and a tuner's compile threads queue their lowerings on it: on a
TPU a compiled step waited about 3 s to be timed, behind lowerings queued after its
compile had ended, while the device stood idle
(``studies/results/tune_time_v5e_workers.md``). A lowering under way still ends first:
a trace cannot be cut short.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class MeasureLock:
    """A re-entrant lock whose ``first`` acquisitions go before the plain ones waiting."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._first = 0  # threads waiting in ``first``

    def acquire(self, first: bool = False) -> bool:
        """Wait for the lock (held already by this thread: at once); ``first``: before
        the threads waiting without it."""
        me = threading.get_ident()
        with self._changed:
            if self._owner == me:
                self._depth += 1
                return True
            self._first += first
            try:
                self._changed.wait_for(
                    lambda: self._owner is None and (first or self._first == 0))
            finally:
                self._first -= first
            self._owner, self._depth = me, 1
        return True

    def release(self) -> None:
        with self._changed:
            if self._owner != threading.get_ident():
                raise RuntimeError("MeasureLock released by a thread that does not hold it")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._changed.notify_all()

    def owned(self) -> bool:
        """Whether this thread holds the lock."""
        return self._owner == threading.get_ident()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    @contextlib.contextmanager
    def first(self) -> Iterator[None]:
        """The lock, before the threads waiting for it without ``first`` (a timing)."""
        self.acquire(first=True)
        try:
            yield
        finally:
            self.release()
