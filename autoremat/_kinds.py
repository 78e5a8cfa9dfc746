"""The table of schedule kinds: ``kind:`` name -> its ``Schedule`` subclass.

Adding a kind is one module (a frozen ``Schedule`` subclass, see
``CONTRIBUTING.md``) and one entry here. Everything that differs by kind --
parsing and validation (``Schedule.from_data``), ``describe``/``explain``,
the cost model (``bounds.cost``), the search space (``_space``), the builder
(``_scan.scan_axes``) and the tests' gradient matrix -- is looked up here.
"""

from __future__ import annotations

from typing import Final

from autoremat._binomial import BinomialSchedule
from autoremat._nested import NestedSchedule
from autoremat._schedule import COMMON_KEYS, Schedule

#: In this order the tuner samples ``kind`` and enqueues the kinds' seeds.
KINDS: Final[dict[str, type[Schedule]]] = {
    k.kind: k for k in (NestedSchedule, BinomialSchedule)
}
#: A mapping without ``kind:`` is of this kind (files written before kinds existed).
DEFAULT_KIND: Final = "nested"


def top_keys() -> tuple[str, ...]:
    """Every top-level key of a schedule file, of any kind."""
    return (*COMMON_KEYS[:2], *(f for k in KINDS.values() for f in k.FIELDS), *COMMON_KEYS[2:])
