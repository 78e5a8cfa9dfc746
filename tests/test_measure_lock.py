"""``MeasureLock``: re-entrant as ``threading.RLock``, and a ``first`` acquisition goes
before the plain ones waiting (a timing before the lowerings queued for the lock)."""

from __future__ import annotations

import threading

import pytest

from autoremat._measure.measure_lock import MeasureLock


def test_it_is_re_entrant_and_only_its_holder_releases_it() -> None:
    lock = MeasureLock()
    with lock:
        with lock.first():
            assert lock.owned()
        assert lock.owned()
        other: list[BaseException] = []

        def release_elsewhere() -> None:
            try:
                lock.release()
            except RuntimeError as e:
                other.append(e)

        t = threading.Thread(target=release_elsewhere)
        t.start()
        t.join(30)
        assert len(other) == 1 and lock.owned()
    assert not lock.owned()


def test_a_first_acquisition_goes_before_the_plain_ones_waiting() -> None:
    """Two plain acquisitions queue while a third thread holds the lock (lowerings
    behind one under way); a ``first`` one (a timing) queued after them gets it next."""
    lock = MeasureLock()
    order: list[str] = []
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            release.wait(30)

    def take(name: str, first: bool) -> None:
        with lock.first() if first else lock:
            order.append(name)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(30)
    threads = [threading.Thread(target=take, args=(f"lowering {i}", False)) for i in (1, 2)]
    for t in threads:
        t.start()
    timer = threading.Thread(target=take, args=("timing", True))
    timer.start()
    while lock._first == 0:  # the timing is waiting
        threading.Event().wait(0.001)
    release.set()
    for t in [holder, *threads, timer]:
        t.join(30)
    assert order[0] == "timing" and sorted(order[1:]) == ["lowering 1", "lowering 2"]


@pytest.mark.parametrize("first", [False, True])
def test_a_free_lock_is_taken_at_once(first: bool) -> None:
    lock = MeasureLock()
    with lock.first() if first else lock:
        assert lock.owned()
    assert not lock.owned()
