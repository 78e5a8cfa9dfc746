"""A planner's clock: the seconds left to start compiles and timings before its deadline."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


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

    def compile_cost(self) -> float:
        """Mean seconds of one compile so far (0 before any)."""
        seconds = self.compile_seconds
        return sum(seconds) / len(seconds) if seconds else 0.0

    def time_left(self) -> float | None:
        """Seconds left (``None``: no deadline), less the compile and the ``reserve``
        kept back."""
        if self.deadline is None:
            return None
        reserve = self.compile_cost() if self.reserve_compile else 0.0
        return self.deadline - time.monotonic() - reserve - self.reserve
