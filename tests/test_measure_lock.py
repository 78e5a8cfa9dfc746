"""The measure lock: a build or lowering (``behind()``) gives way to a measurement waiting."""

from __future__ import annotations

import threading
import time

from autoremat._measure.measure_lock import MeasureLock


def _until(condition: object, seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:  # type: ignore[operator]
        time.sleep(0.001)


def test_work_queued_behind_waits_for_a_waiting_measurement_not_the_work_under_way() -> None:
    """A lowering under way ends first; then the timing that waited for the lock runs before
    the lowering queued after it asked (a plain lock is not fair: the device idled behind
    several lowerings)."""
    lock = MeasureLock()
    order: list[str] = []
    inside, go = threading.Event(), threading.Event()

    def under_way() -> None:
        with lock.behind():
            inside.set()
            go.wait(30)
            order.append("lowering under way")

    def timing() -> None:
        with lock:
            order.append("timing")

    def queued() -> None:
        with lock.behind():
            order.append("lowering queued")

    threads = [threading.Thread(target=under_way)]
    threads[0].start()
    assert inside.wait(30)
    threads.append(threading.Thread(target=timing))
    threads[1].start()
    _until(lambda: lock._waiting == 1)
    threads.append(threading.Thread(target=queued))
    threads[2].start()
    go.set()
    for t in threads:
        t.join(30)
    assert order == ["lowering under way", "timing", "lowering queued"]
    assert not lock._is_owned()


def test_the_holder_goes_behind_itself_without_waiting() -> None:
    """A thread holding the lock (a measurement whose work compiles) takes it ``behind()``
    again at once, even while another waits for it: no deadlock."""
    lock = MeasureLock()
    done = threading.Event()
    with lock:
        other = threading.Thread(target=lambda: (lock.acquire(), lock.release(), done.set()))
        other.start()
        _until(lambda: lock._waiting == 1)
        with lock.behind():
            assert lock._is_owned()
        assert lock._is_owned()
    other.join(30)
    assert done.is_set() and not lock._is_owned()
