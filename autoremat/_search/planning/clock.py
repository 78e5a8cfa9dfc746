"""A planner's clock: the seconds left to start compiles and timings before its deadline,
and what a compile costs.

An unrolled scan compiles its body once per unrolled step: on a TPU a layer stack's
compile at unroll 8 took 6.5x its compile at unroll 1 (about 50 s against 8). So a
compile's cost is estimated by its unroll (``compile_cost_of``): the compiles measured at
that unroll, else those at unroll 1 scaled by ``1 + slope x (unroll - 1)``, the slope
fitted on the unrolled compiles measured (``UNROLL_SLOPE`` before any: the TPU's).

Compiles that run at once (``compile_pool``'s threads) share the host's cores, so each
takes longer than one alone while about as many end per minute. So the cost of a
compile is its seconds over how many ran at once (``overlap``: their seconds over the
wall time any of them ran) -- what one more compile costs the search -- not its own wall
time, which would stop a search with time left
(``studies/results/tune_time_v5e_workers.md``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Final

#: A compile at unroll ``u`` costs ``1 + UNROLL_SLOPE x (u - 1)`` times one at unroll 1,
#: before any unrolled compile was measured (a TPU layer stack's: 6.5x at unroll 8).
UNROLL_SLOPE: Final = 0.8


@dataclass
class Clock:
    """The deadline and what compiles cost so far.

    Attributes:
      reserve_compile: keep one compile's time back (a platform whose fit a run decides
        compiles the pick again for its proof of fit: ``proof``), so the tune ends within
        its time limit.
      deadline: ``time.monotonic()`` to finish by (``None``: none).
      compile_seconds: each compile's seconds so far.
      reserve: seconds kept back for work before the search stops (the leader re-timed
        with its challengers where their noise asks for it: ``autoremat._search.retime``).
    """

    reserve_compile: bool = False
    deadline: float | None = None
    compile_seconds: list[float] = field(default_factory=list)
    reserve: float = 0.0
    unrolls: list[int] = field(default_factory=list)  # each compile's unroll, as timed
    spans: list[tuple[float, float]] = field(default_factory=list)  # (start, end), where known

    def until(self, deadline: float | None) -> None:
        """Finish by ``deadline`` (``time.monotonic()``; ``None``: no limit)."""
        self.deadline = deadline

    def add_compile(self, seconds: float, unroll: int = 1, ended: float | None = None) -> None:
        """One compile's seconds, of a schedule at ``unroll``; ``ended``: when it ended
        (``time.monotonic()``), for ``overlap``."""
        self.compile_seconds.append(seconds)
        self.unrolls.append(unroll)
        if ended is not None:
            self.spans.append((ended - seconds, ended))

    def overlap(self) -> float:
        """How many compiles ran at once, on average: the seconds of those whose span is
        known over the wall time any of them ran (1: one at a time, or unknown)."""
        if len(self.spans) < 2:
            return 1.0
        busy, reach = 0.0, float("-inf")
        for start, end in sorted(self.spans):
            busy += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        total = sum(end - start for start, end in self.spans)
        return max(1.0, total / busy) if busy > 0 else 1.0

    def compile_cost_of(self, unroll: int) -> float:
        """About how long a compile at ``unroll`` takes (module doc); at unroll 1, or
        before any compile, ``compile_cost``."""
        mean = self.compile_cost()
        if unroll <= 1 or not self.compile_seconds:
            return mean
        return self._own_cost_of(unroll) / self.overlap()

    def _own_cost_of(self, unroll: int) -> float:
        """``compile_cost_of`` from the compiles' own seconds (no ``overlap``)."""
        mean = sum(self.compile_seconds) / len(self.compile_seconds)
        pairs = list(zip(self.unrolls, self.compile_seconds, strict=False))
        same = [s for u, s in pairs if u == unroll]
        if same:
            return sum(same) / len(same)
        ones = [s for u, s in pairs if u <= 1]
        base = sum(ones) / len(ones) if ones else mean
        slopes = [(s / base - 1.0) / (u - 1) for u, s in pairs if u > 1 and base > 0]
        slope = max(0.0, statistics.median(slopes)) if slopes else UNROLL_SLOPE
        return base * (1.0 + slope * (unroll - 1))

    def compile_cost(self) -> float:
        """Mean seconds of one compile so far over their ``overlap`` (0 before any)."""
        seconds = self.compile_seconds
        return sum(seconds) / len(seconds) / self.overlap() if seconds else 0.0

    def time_left(self) -> float | None:
        """Seconds left (``None``: no deadline), less the compile and the ``reserve``
        kept back."""
        if self.deadline is None:
            return None
        reserve = self.compile_cost() if self.reserve_compile else 0.0
        return self.deadline - time.monotonic() - reserve - self.reserve
