"""A cost model of step time and memory from a schedule's structure, calibrated per study.

The tuner times few schedules, so it must guess which are worth timing. The
guess is a linear model over a schedule's structure (pure Python, no jax):

* from the kind's own ``Schedule.features`` (``autoremat._schedules.base.Features``):
  ``evaluations``, step evaluations of one forward + backward pass -- the
  recomputation -- less ``partial``, the re-runs that skip the matmuls (e.g.
  a level under a ``dots`` policy: only the elementwise part re-runs);
  ``boundaries``, checkpoint boundaries crossed (stacking a carry, entering a
  remat region); ``bookkeeping``, steps with dynamic restores;
* ``total_bytes``: the compiled total (or, before compiling, the memory
  model's guess) -- the memory traffic, which on CPU can cost as much as the
  recomputation it saves;
* ``loop``: ``T / unroll`` -- loop trips of the innermost scan;
* ``graphs``: those trips again when the step is compiled with XLA options
  (``Schedule.compiler_options``: on a GPU, command buffers that capture loops),
  so the fit can learn what the options save per trip;
* ``stacked``: ``T`` where the step's readout is unfused (its outputs stacked and read
  out after the loop), else 0: fused and unfused schedules of one step differ by about
  a constant (on a TPU unfused ran faster at the same memory,
  ``studies/results/tune_time_v5e_workers.md``), which no other feature tells apart --
  without it a fused candidate was predicted from unfused timings and timed to be cut;
* and a constant.

``TimeModel.fit`` is a weighted least squares on relative error over this
study's own timed trials, pulled (ridge) towards a prior so two or three
trials already give an order. The prior is per platform (``PRIORS``): what
one unit of each feature costs, in step evaluations, scaled by the study's
median seconds per unit. On a CPU it is "seconds proportional to
evaluations" (a partial re-run 0.4 of one). On a GPU a loop trip and
binomial's bookkeeping cost far more than the step's arithmetic, and the
seeds cannot tell (they all have ``unroll=1``, and binomial is not seeded
there), so the prior carries what a GPU measured on the seed LSTM at
T=10^4 (``docs/tuning.md``).
On a TPU (``TPU_PRIOR``) a loop trip costs 0.31 of a step evaluation and
binomial's evaluations are priced as plain's (``studies/results/search_tpu.md``).
``TimeModel.predict`` corrects the fit towards the measured / fitted ratio
of the nearest timed schedule of the same kind (``TimeModel.nearest``), and
``TimeModel.error`` (leave-one-out) says how far to trust it (the planner's
stop test).
Its sibling ``memory_model.MemoryModel`` predicts ``total_bytes`` before compiling.
Both only *order* candidates; every figure the tuner reports is measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from autoremat._schedules.base import Schedule
from autoremat._schedules.platforms import GPU_PLATFORMS

#: The ridge weight pulling the fit towards the prior (relative units).
_RIDGE = 0.1
#: Schedules this far apart (relative, in their most different feature) are unrelated.
_NEAR = 0.25
#: The prior cost of a partial re-run, as a fraction of a full step evaluation.
_PARTIAL_PRIOR = 0.4


@dataclass(frozen=True)
class Prior:
    """What one unit of each time feature costs, in step evaluations (``Structure.row``
    order; bytes, ``stacked`` and the constant excepted: they have no prior -- the fit
    learns them, from the first fused and unfused pair for ``stacked``).

    Attributes:
      partial: a partial re-run (its matmuls saved).
      boundaries: a checkpoint boundary crossed.
      bookkeeping: a step with dynamic restores (binomial).
      loop: a trip of the innermost loop (``T / unroll``).
      graphs: a loop trip compiled with XLA options, on top of ``loop`` (negative:
        what the options are expected to save).
    """

    partial: float = _PARTIAL_PRIOR
    boundaries: float = 0.0
    bookkeeping: float = 0.0
    loop: float = 0.0
    graphs: float = 0.0

    def weights(self) -> list[float]:
        """Per-unit costs in ``Structure.row`` order, in step evaluations."""
        return [1.0, self.partial, 0.0, self.boundaries, self.bookkeeping, self.loop,
                self.graphs, 0.0, 0.0]


#: The CPU's: seconds proportional to step evaluations (a partial re-run 0.4 of one).
CPU_PRIOR: Final = Prior()
#: A GPU's, in the units of ``Structure`` (plain: ``T`` evaluations, ``T`` loop trips),
#: from the seed LSTM train step at T=10^4 (figures: ``docs/tuning.md``): plain's times
#: at unroll 1 and 8 (``T e + T l`` and ``T e + T/8 l``) put a loop trip ``l`` at 2.0
#: step evaluations ``e``; binomial's times then leave 1.3-7.0 ``e`` a step of its
#: bookkeeping: 4 here. From a plain scan's time alone this predicts binomial's runs
#: within 20% (``tests/test_platform_costs.py``). Loop trips and bookkeeping are what the
#: seeds cannot calibrate on a GPU: all seeds have ``unroll=1``, none is binomial.
#: ``graphs`` is a hypothesis, not a measurement: command buffers that capture the
#: loop save half a trip's launch cost (-1.0), enough that the planner times one
#: such schedule; from then on the fit has the measured difference.
GPU_PRIOR: Final = Prior(loop=2.0, bookkeeping=4.0, graphs=-1.0)
#: A TPU's, the same way (``studies/search_tpu.py``'s priors stage, figures in
#: ``studies/results/search_tpu.md``): a loop trip ``l`` costs 0.31 of a step evaluation
#: ``e``. Binomial's evaluations at plain's ``e`` already make more than its measured
#: time (plain's evaluation stores residuals, binomial's re-runs store nothing), so no
#: bookkeeping cost is left to price (0): the prior ranks binomial slow, as measured,
#: and the fit takes over once a binomial schedule is timed.
TPU_PRIOR: Final = Prior(loop=0.31, bookkeeping=0.0)
#: Priors by ``Measurement.platform``; any other platform gets ``CPU_PRIOR``.
PRIORS: Final[dict[str, Prior]] = {**dict.fromkeys(GPU_PLATFORMS, GPU_PRIOR), "tpu": TPU_PRIOR}


def prior_for(platform: str) -> Prior:
    """The time model's prior on ``platform`` (``PRIORS``, else ``CPU_PRIOR``)."""
    return PRIORS.get(platform.lower(), CPU_PRIOR)


@dataclass(frozen=True)
class Structure:
    """What the model reads of one schedule at one ``T`` (see the module doc): the
    kind's own ``Schedule.features``, with ``evaluations`` less the partial ones,
    and the loop trips of its innermost scan."""

    kind: str
    evaluations: float
    partial: float
    boundaries: float
    bookkeeping: float
    loop: float
    terms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    graphs: float = 0.0
    stacked: float = 0.0
    lengths: tuple[int, ...] = ()
    saves: tuple[int, ...] = ()
    unroll: int = 1

    @classmethod
    def of(cls, schedule: Schedule, seq_len: int) -> Structure:
        f = schedule.features(seq_len)
        loop = seq_len / max(1, schedule.unroll)
        lengths, saves = _saves(schedule)
        fuse = getattr(schedule, "fuse", None)
        return cls(kind=schedule.kind + ("/unfused" if fuse is False else ""),
                   evaluations=f.evaluations - f.partial,
                   partial=f.partial, boundaries=f.boundaries, bookkeeping=f.bookkeeping,
                   loop=loop, terms=f.terms,
                   graphs=loop if schedule.compiler_options else 0.0,
                   stacked=float(seq_len) if fuse is False else 0.0,
                   lengths=lengths, saves=saves,
                   # a plain scan stores every step's residuals at any unroll
                   unroll=0 if saves == (_PLAIN,) else schedule.unroll)

    def stores_at_least(self, other: Structure) -> bool:
        """Surely needs at least ``other``'s memory: the same kind (unfused where it is
        fused, or as it is), at least its unroll, and at least as much of every stored
        term -- or the same level lengths with each level's policy saving at least as
        much (``_SAVES``)."""
        if self.kind not in (other.kind, other.kind.split("/")[0] + "/unfused"):
            return False
        if self.unroll < other.unroll:
            return False
        if all(a >= b for a, b in zip(self.terms, other.terms, strict=True)):
            return True
        return (bool(self.saves) and self.lengths == other.lengths
                and len(self.saves) == len(other.saves)
                and all(a >= b for a, b in zip(self.saves, other.saves, strict=True)))

    def row(self, total_bytes: float) -> list[float]:
        """The time model's features, in ``TimeModel`` column order."""
        return [self.evaluations, self.partial, total_bytes, self.boundaries, self.bookkeeping,
                self.loop, self.graphs, self.stacked, 1.0]


#: How much a nested level's policy saves, in order: a level under a policy further
#: down this table stores at least what it would store under one above (``Structure
#: .saves``). Policies not named (offload, names) are not ordered.
_SAVES: Final = {"nothing_saveable": 0, "dots_with_no_batch_dims_saveable": 1,
                 "checkpoint_dots_with_no_batch_dims": 1, "dots_saveable": 2,
                 "checkpoint_dots": 2, "everything_saveable": 3, "none": 3}
_PLAIN: Final = _SAVES["none"]


def _saves(schedule: Schedule) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A nested schedule's level lengths and each level's ``_SAVES`` rank (``((), ())``:
    another kind, or a policy not in the table)."""
    levels = getattr(schedule, "levels", None)
    if not levels:
        return (), ()
    ranks = [_SAVES.get(level.policy.name) for level in levels]
    if any(r is None for r in ranks):
        return (), ()
    return tuple(level.length for level in levels), tuple(r for r in ranks if r is not None)


def _dot(coef: Sequence[float], row: Sequence[float]) -> float:
    return sum(c * x for c, x in zip(coef, row, strict=True))


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; ``None`` when singular."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def _ridge(rows: list[list[float]], ys: list[float], prior: list[float],
           weights: list[float], ridge: float = _RIDGE) -> list[float]:
    """``argmin sum w (x.c - y)^2 + ridge |s (c - prior)|^2``, columns scaled by ``s``."""
    k = len(prior)
    scale = [max((abs(r[j]) for r in rows), default=0.0) or 1.0 for j in range(k)]
    lam = ridge
    top = max(weights, default=1.0) or 1.0
    weights = [w / top for w in weights]
    ys_scale = max((abs(y) for y in ys), default=1.0) or 1.0
    ys = [y / ys_scale for y in ys]
    prior = [p / ys_scale for p in prior]
    a = [[lam * (i == j) for j in range(k)] for i in range(k)]
    b = [lam * prior[i] * scale[i] for i in range(k)]
    for r, y, w in zip(rows, ys, weights, strict=True):
        z = [r[j] / scale[j] for j in range(k)]
        for i in range(k):
            b[i] += w * z[i] * y
            for j in range(k):
                a[i][j] += w * z[i] * z[j]
    coef = _solve(a, b)
    if coef is None:
        return [p * ys_scale for p in prior]
    return [c / s * ys_scale for c, s in zip(coef, scale, strict=True)]


class TimeModel:
    """Step seconds from ``Structure.row``; ``None`` until one trial was timed.
    ``platform``: whose prior the fit is pulled towards (``prior_for``)."""

    def __init__(self, platform: str = "cpu") -> None:
        self.prior = prior_for(platform)
        self.coef: list[float] | None = None
        self.floor = 0.0
        self.points = 0
        self.error = 0.0
        self.good: Sequence[tuple[Structure, float, float]] = ()

    def fit(self, points: Sequence[tuple[Structure, float, float]]) -> None:
        """``points``: (structure, total bytes, measured step seconds) of timed trials."""
        good = [(s, b, y) for s, b, y in points if y > 0 and math.isfinite(y)]
        self.points = len(good)
        self.good = good
        if not good:
            self.coef = None
            return
        self.coef = self._fit(good)
        self.floor = 0.25 * min(y for _, _, y in good)
        self.error = self._error(good)

    def _fit(self, good: Sequence[tuple[Structure, float, float]]) -> list[float]:
        """The ridge fit, pulled towards the prior's per-unit costs times the median
        seconds per prior unit of ``good``."""
        weights = self.prior.weights()
        per_eval = sorted(y / max(1e-30, _dot(weights, s.row(b)))
                          for s, b, y in good)[len(good) // 2]
        prior = [w * per_eval for w in weights]
        rows = [s.row(b) for s, b, _ in good]
        ys = [y for _, _, y in good]
        return _ridge(rows, ys, prior, [1.0 / y**2 for y in ys])

    def _error(self, good: Sequence[tuple[Structure, float, float]]) -> float:
        """The median relative error of leave-one-out predictions (0 below 3 points):
        how far a prediction may be off, which widens the planner's stop test."""
        if len(good) < 3:
            return 0.0
        errs = []
        for i, (s, b, y) in enumerate(good):
            coef = self._fit([*good[:i], *good[i + 1:]])
            errs.append(abs(_dot(coef, s.row(b)) - y) / y)
        return sorted(errs)[len(errs) // 2]

    def _linear(self, row: list[float]) -> float:
        assert self.coef is not None
        return _dot(self.coef, row)

    def nearest(self, structure: Structure, total_bytes: float) -> tuple[float, float]:
        """``(d, ratio)``: the distance to the nearest timed schedule of the same kind
        (0: the same features; 1: ``_NEAR`` apart or more in some feature, or none
        timed) and that schedule's measured / linear-predicted seconds."""
        row = structure.row(total_bytes)
        best = (1.0, 1.0)
        for s, b, y in self.good:
            if s.kind != structure.kind:
                continue
            other = s.row(b)
            gap = max((abs(x - z) / max(abs(x), abs(z)) for x, z in zip(row, other, strict=True)
                       if x or z), default=0.0)
            d = min(1.0, gap / _NEAR)
            if d < best[0]:
                linear = self._linear(other)
                best = (d, y / linear if linear > 0 else 1.0)
        return best

    def predict(self, structure: Structure, total_bytes: float) -> float | None:
        """The linear model, corrected towards the nearest timed schedule's own error
        (fully at distance 0, not at all from ``_NEAR`` on: a family the model gets
        wrong on this machine is predicted from its measured members)."""
        if self.coef is None:
            return None
        value = self._linear(structure.row(total_bytes))
        d, ratio = self.nearest(structure, total_bytes)
        return max(self.floor, value * ratio ** (1.0 - d))
