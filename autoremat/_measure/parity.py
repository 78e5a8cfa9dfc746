"""Does a tuned schedule still compile to the figure its tune measured?

``autoremat show schedule.yaml --problem ...`` compiles the problem's step under the
schedule (compile and size only: ``memory_analysis()``, nothing is run) and compares
its total with the one the schedule's ``meta`` records. A program that is not the one
measured -- the readout moved out of the step, other sizes, another device -- shows
here as a difference, before a training job finds it out of memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from autoremat._measure.measure import measure
from autoremat._measure.problem import Problem
from autoremat._schedules.base import Schedule

#: A compiled total within this share of the tuned one is the same program's.
SAME: Final = 0.02


@dataclass(frozen=True)
class Parity:
    """A schedule's compiled total here beside the tuned one (``check_parity``).

    Attributes:
      tuned_bytes: ``meta['total_bytes']``, or ``None`` (not written by ``tune``).
      compiled_bytes: the step's total compiled here (arguments + outputs + temp - alias),
        or ``None`` when it did not compile (``reason`` says why).
      reason: why it did not compile (``""`` when it did).
    """

    tuned_bytes: int | None
    compiled_bytes: int | None
    reason: str = ""

    @property
    def ratio(self) -> float | None:
        """Compiled / tuned, where both are known."""
        if not self.tuned_bytes or self.compiled_bytes is None:
            return None
        return self.compiled_bytes / self.tuned_bytes

    @property
    def same(self) -> bool:
        """Compiled within ``SAME`` of the tuned total (no tuned figure: nothing differs)."""
        ratio = self.ratio
        if self.compiled_bytes is None:
            return False
        return ratio is None or abs(ratio - 1) <= SAME


def check_parity(schedule: Schedule, problem: Problem) -> Parity:
    """Compile ``problem``'s step under ``schedule`` and compare its total with the tuned one."""
    tuned = schedule.meta.get("total_bytes")
    m = measure(problem, schedule, run=False)
    return Parity(tuned if isinstance(tuned, int) else None, m.total_bytes,
                  "" if m.total_bytes is not None else m.reason)
