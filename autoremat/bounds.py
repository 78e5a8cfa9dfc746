"""How much recomputation a schedule costs, and the least any schedule can.

Reversing ``T`` steps of a scan (the backward pass) needs every step's input
carry, in reverse order. Storing all ``T`` is the plain scan; storing fewer
means running steps forward again from a stored carry. With ``s`` carries
stored at a time, the fewest forward steps is known in closed form
(Griewank 1992, "Achieving logarithmic growth of temporal and spatial
complexity in reverse automatic differentiation"; Griewank & Walther 2000,
"Algorithm 799: Revolve", ACM TOMS 26(1)):

* ``max_steps(s, r) = C(s + r, s)`` steps can be reversed with ``s`` stored
  carries when no step is advanced more than ``r`` times;
* reversing ``T`` steps then takes at least ``min_advances(T, s) = r T -
  C(s + r, s + 1)`` advances, with the least ``r`` such that
  ``max_steps(s, r) >= T``: memory ``O(log T)`` for work ``O(T log T)``.

The model counts carries, the state the step passes on, and *step
evaluations*, every run of the step function. ``s`` counts the carries a
schedule stores besides the scan's own initial carry (which its caller holds
anyway); Revolve's ``snaps`` counts that initial carry instead, and our
binomial schedule spends the same slot on the carry in hand when the backward
pass starts, so the two agree. A training step with the binomial schedule of
``s`` snapshots runs the step ``min_evaluations(T, s) = min_advances(T, s) + T
+ 1`` times: ``T - 1`` forward steps of the first sweep (part of
``min_advances``), the last step's forward (its output must exist before the
backward pass starts), one run per reversed step (its VJP), and the
re-advances in between.

``cost(schedule, T)`` gives any schedule's evaluations and peak stored
carries in the same units (each kind defines its own, ``Schedule.cost``), so
the tuner's front can show a *recompute factor*
(evaluations / ``T``: 1 for the plain scan, 2 for per-step remat) and the
distance to the optimum at the same memory. For nested schedules it is a
model (see ``autoremat.nested``): a level whose policy keeps everything (``none``,
``everything_saveable``) stores its steps' residuals, counted as one carry per
step, and a partial policy (``dots_saveable``, ...) is counted as recomputing
its body in full. Such a schedule can beat the carry-only optimum on
evaluations, since it stores more than carries.

Pure Python; no jax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "Cost",
    "cost",
    "distance_to_optimum",
    "max_steps",
    "min_advances",
    "min_evaluations",
    "optimal_cost",
    "repetitions",
]

def _check(name: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")


def max_steps(snapshots: int, repetitions: int) -> int:
    """The most steps reversible with ``snapshots`` carries, ``repetitions`` advances each.

    ``C(snapshots + repetitions, snapshots)`` (Griewank & Walther's beta).

    >>> max_steps(3, 2)
    10
    """
    _check("snapshots", snapshots, 1)
    _check("repetitions", repetitions, 0)
    return math.comb(snapshots + repetitions, snapshots)


def repetitions(seq_len: int, snapshots: int) -> int:
    """The least ``r`` with ``max_steps(snapshots, r) >= seq_len``."""
    _check("seq_len", seq_len, 1)
    _check("snapshots", snapshots, 1)
    if snapshots == 1:
        return seq_len - 1
    r, reach = 0, 1
    while reach < seq_len:
        r += 1
        reach = reach * (snapshots + r) // r
    return r


def min_advances(seq_len: int, snapshots: int) -> int:
    """The fewest forward steps to reverse ``seq_len`` steps with ``snapshots`` carries.

    Revolve's optimum ``r T - C(s + r, s + 1)``; ``T (T - 1) / 2`` for one
    snapshot, ``T - 1`` (one sweep) from ``T - 1`` snapshots on. Reversals
    themselves are not counted (see ``min_evaluations``).

    >>> min_advances(10, 3), min_advances(10, 1), min_advances(10, 9)
    (15, 45, 9)
    """
    _check("seq_len", seq_len, 1)
    _check("snapshots", snapshots, 1)
    r = repetitions(seq_len, snapshots)
    if r == 0:
        return 0
    return r * seq_len - math.comb(snapshots + r, snapshots + 1)


def min_evaluations(seq_len: int, snapshots: int) -> int:
    """Step evaluations of a training step under the binomial schedule (the optimum).

    ``min_advances + T + 1``: the advances, one VJP per step, and the forward
    of the last step, which the backward pass cannot reuse.
    """
    return min_advances(seq_len, snapshots) + seq_len + 1


@dataclass(frozen=True)
class Cost:
    """What a schedule costs on a length-``seq_len`` scan, in the carry model.

    Attributes:
      seq_len: ``T``.
      evaluations: step evaluations in one forward + backward pass.
      stored_carries: the most carries (or one step's residuals, counted as
        one) held for the backward pass at once, besides the initial carry.
    """

    seq_len: int
    evaluations: int
    stored_carries: int

    @property
    def recompute_factor(self) -> float:
        """``evaluations / T``: 1.0 plain scan, 2.0 per-step remat."""
        return self.evaluations / self.seq_len


class Costed(Protocol):
    """Anything with a cost model: every ``autoremat.Schedule`` (each kind defines it)."""

    def cost(self, seq_len: int) -> Cost: ...


def optimal_cost(seq_len: int, stored_carries: int) -> Cost:
    """The least evaluations any schedule needs with ``stored_carries`` carries."""
    _check("seq_len", seq_len, 1)
    _check("stored_carries", stored_carries, 1)
    s = min(stored_carries, seq_len)
    return Cost(seq_len, min_evaluations(seq_len, s), s)


def cost(schedule: Costed, seq_len: int) -> Cost:
    """The evaluations and peak stored carries of ``schedule`` at ``T = seq_len``.

    Exact for the binomial kind (what it executes); a model for nested
    schedules (see the module docstring), following ``autoremat.Schedule``'s
    rule for any ``T`` (mixed-radix remainder pieces).
    """
    _check("seq_len", seq_len, 1)
    return schedule.cost(seq_len)


def distance_to_optimum(schedule: Costed, seq_len: int) -> float:
    """``cost(schedule).evaluations`` over the optimum at the same stored carries.

    1.0 for the binomial kind; above 1 the schedule recomputes more than it
    must for its memory; below 1 it stores residuals, not just carries.
    """
    own = cost(schedule, seq_len)
    return own.evaluations / optimal_cost(seq_len, own.stored_carries).evaluations
