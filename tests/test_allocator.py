"""The one reader of a device's allocator (``autoremat._measure.allocator``), on stand-ins:
no device here reports ``memory_stats()``."""

from __future__ import annotations

from typing import Any

from autoremat._measure.allocator import Stats, limit_bytes, read


class Device:
    def __init__(self, stats: Any) -> None:
        self._stats = stats

    def memory_stats(self) -> Any:
        if isinstance(self._stats, Exception):
            raise self._stats
        return self._stats


def test_a_reading_is_in_use_peak_reserved_and_limit() -> None:
    raw = {"bytes_in_use": 5, "peak_bytes_in_use": 3, "bytes_reserved": 2, "bytes_limit": 10}
    assert read(Device(raw)) == Stats(in_use=5, peak=5, reserved=2, limit=10)  # peak >= in use
    assert read(Device({"bytes_in_use": 5, "peak_bytes_in_use": 7})) == Stats(5, 7)


def test_no_reading_where_the_allocator_says_nothing() -> None:
    for stats in (None, {}, {"peak_bytes_in_use": 7}, {"bytes_in_use": 1, "peak_bytes_in_use": 0},
                  RuntimeError("no memory_stats on this backend")):
        assert read(Device(stats)) is None


def test_this_cpu_has_no_limit() -> None:
    assert limit_bytes() is None
