"""Chunk lengths: the divisors a level's length snaps to and the ``depth``-th-root split of
``T`` (``root_lengths``: the sqrt(T) and cube-root schedules of Chen et al. 2016) that the
``root`` constructor and the nested kind's search space use."""

from __future__ import annotations

import functools
import math
from typing import Final

from autoremat._errors import ScheduleError
from autoremat._schedules.policy import _show


def divisors(n: int) -> list[int]:
    """All divisors of ``n``, ascending."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


#: A length is snapped to a divisor of what it must tile when one is this close.
SNAP_TOLERANCE: Final = 0.25


@functools.lru_cache(maxsize=4096)  # the search snaps the same lengths again and again
def snap(length: int, remaining: int) -> int:
    """The divisor of ``remaining`` nearest ``length`` if within 25%, else ``length``."""
    best = min(divisors(remaining), key=lambda k: (abs(k - length), k))
    return best if abs(best - length) <= SNAP_TOLERANCE * length else length


def root_lengths(seq_len: int, depth: int) -> tuple[int, ...]:
    """``depth`` level lengths, outermost first, each near ``seq_len ** (1 / depth)``.

    Inner lengths are snapped to divisors (``snap``) so most ``T`` are tiled
    exactly; the outermost is ``ceil(T / prod(inner))`` (the builder runs any
    remainder). Every level is at least 2 long when ``2 ** depth <= T``.

    >>> root_lengths(10_000, 2), root_lengths(1_000, 3)
    ((100, 100), (10, 10, 10))
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ScheduleError(f"depth: expected an integer >= 1, got {_show(depth)}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ScheduleError(f"seq_len: expected an integer >= 1, got {_show(seq_len)}")
    remaining, inner = seq_len, []  # innermost first
    for i in range(depth - 1):
        target = round(remaining ** (1 / (depth - i)))
        length = max(2, snap(target, remaining))
        inner.append(length)
        remaining = math.ceil(remaining / length)
    return (remaining, *reversed(inner))
