"""A planner's candidate: one schedule of the pool, and what screening found of it.

``Candidate`` (its params, structure, compiled executable) and ``Verdict`` (why it will
not be timed) are shared by the planner (``autoremat._search.planning.planner``), its compiles
ahead (``ahead``) and the worker.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Final

from autoremat._measure.measure import Compiled
from autoremat._measure.measurement import Measurement
from autoremat._schedules.base import Schedule
from autoremat._search.planning.predict import Structure


class Verdict(enum.Enum):
    """Why a candidate will not be timed by this planner (``UNDECIDED``: it still may be)."""

    UNDECIDED = "not decided yet: it may still be timed"
    MEASURED = "measured"
    SURELY_OVER = "over budget (stores more than one that is)"
    #: sized over the budget by more than any run's peak was under its sized figure
    #: (``Standings.overstated``; a platform whose fit a run decides)
    OVER_AT_RUNTIME = "over budget at run time, by its size less the most a size overstated"
    NO_EXECUTABLE = "sized, no executable (over budget, or released after timing)"
    DOMINATED = "dominated"  # its executable is kept (``Planner.next(dominated=True)``)
    REFUSED = "uses a choice or combination the study's probe left out"
    #: its compile (an unrolled one costs more: ``Clock.compile_cost_of``) would end past
    #: the time limit, while cheaper ones still fit
    TOO_LATE = "its compile would end past the time limit"


@dataclass(frozen=True)
class TooLate:
    """A candidate not compiled (``Verdict.TOO_LATE``): its compile, of about ``seconds``
    (estimated by its unroll: ``Clock.compile_cost_of``), would end past the time limit,
    while cheaper compiles still fit. ``schedule``: its one-line description."""

    schedule: str
    seconds: float


#: ``Planner.choose``'s "one was compiled: the models moved, rank again".
AGAIN: Final = "again"


@dataclass
class Candidate:
    """One schedule in the pool: its params (``space``), structure, and what screening found.
    Its verdict is written by its pool alone (``Pool.mark``)."""

    schedule: Schedule
    params: dict[str, Any]
    structure: Structure
    compiled: Compiled | None = None
    _verdict: Verdict = field(default=Verdict.UNDECIDED)

    @property
    def verdict(self) -> Verdict:
        """Why this planner will not time it (``UNDECIDED``: it still may be)."""
        return self._verdict

    @property
    def sized(self) -> Measurement | None:
        return None if self.compiled is None else self.compiled.measurement
