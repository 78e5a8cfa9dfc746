"""What a layer stack's schedules keep, from one trace of its step (``StepCosts``).

The byte arithmetic the layer-stack search predicts with (``presets.LayerPlan``): what
each per-layer policy keeps beyond ``nothing_saveable`` (``LayerCosts.keeps``: the tags'
and matmul outputs' bytes per layer), summed over a per-layer or groups schedule
(``extra``: exact), bounded for chunked ones (``nested_extra``: meant to err low), what
splitting into groups costs (``SPLIT_OVERHEAD``), the knapsack over the tags (most
recompute FLOPs saved for the bytes) and the chunked split that stores fewest layer
inputs (``below_full``).

**Chunked schedules** (nested, Chen et al. 2016; binomial, Griewank & Walther 2000)
recompute whole layers and store fewer layer inputs than remat of each layer: ``n1 x n2``
stores ``n1 + n2`` (``stored``), Revolve its snapshots. Their prediction subtracts
``STORED_PER_INPUT`` inputs' bytes per input not stored and adds what their levels keep:
the innermost level's policy on its chunk, an outer level's on every layer it spans
(``1 - MARGIN`` of it). The trade-off: one more forward pass of every layer (nested), or
of the fewest layers for the inputs dropped (binomial).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from autoremat._schedules.base import Schedule
from autoremat._schedules.binomial import BinomialSchedule
from autoremat._schedules.groups import GroupsSchedule
from autoremat._schedules.nested import NestedSchedule
from autoremat._schedules.policy import NO_REMAT, Policy

if TYPE_CHECKING:
    from autoremat._scan.checkpoint_names import StepCosts

#: A prediction within this fraction over the budget is measured, not ruled out.
MARGIN: Final = 0.05
#: The knapsack tries every subset of at most this many tags (else the greedy ranking).
MAX_EXACT_TAGS: Final = 14
#: What a schedule of ``n >= 2`` groups needs more than one scan, per group, as a
#: fraction of the scanned inputs' bytes (``StepCosts.xs_bytes``: a stack's parameters):
#: each group's scan takes a slice of them and its gradient is joined back. Measured
#: on a CPU (6 layers, d_model 64: 0.99x for 2 groups, 1.46x for 3); not yet on a TPU.
SPLIT_OVERHEAD: Final = 0.5
#: What remat of each layer stores per layer, at most, in layer inputs' bytes (its carry,
#: ``StepCosts.carry_bytes``): a chunked schedule's prediction subtracts this much per
#: layer input it does not store, so it errs low. On the TPU the built-in stack's
#: ``6x4 nothing/nothing`` needed 700 MB less than ``full`` for 14 inputs of 33.5 MB
#: not stored (1.5x).
STORED_PER_INPUT: Final = 2.0
_ZERO: Final = ("nothing_saveable",)
_NO_BATCH: Final = ("dots_with_no_batch_dims_saveable", "checkpoint_dots_with_no_batch_dims")
_DOTS: Final = ("dots_saveable", "checkpoint_dots")
_ALL: Final = (NO_REMAT, "everything_saveable")


@dataclass(frozen=True)
class LayerCosts:
    """What each per-layer policy keeps, from the trace (``StepCosts``), over ``layers``."""

    layers: int
    costs: StepCosts

    def keeps(self, policy: Policy) -> tuple[float, bool]:
        """Bytes one layer under ``policy`` keeps beyond ``nothing_saveable``, and whether
        that is exact (else a lower bound: no remat keeps every residual, counted as
        every matmul output and tag)."""
        tags = self.costs.tags
        if policy.name in _ZERO or (policy.offloads and not _saved_names(policy)):
            return 0.0, True
        if policy.name in _NO_BATCH:
            return float(self.costs.dot_no_batch_bytes), True
        if policy.name in _DOTS:
            return float(self.costs.dot_bytes), True
        if policy.name == "save_only_these_names" or policy.offloads:
            return float(sum(tags[n].bytes for n in _saved_names(policy) if n in tags)), True
        if policy.name in _ALL:
            return float(max(self.costs.dot_bytes, sum(t.bytes for t in tags.values()))), False
        if policy.name in ("save_anything_except_these_names", "save_any_names_but_these"):
            return float(sum(t.bytes for n, t in tags.items() if n not in policy.names)), False
        return 0.0, False

    def extra(self, schedule: Schedule) -> tuple[float, bool] | None:
        """``keeps`` summed over the layers of a per-layer schedule (remat of each step,
        or groups); for a nested one a lower bound (``nested_extra``); ``None`` for any
        other."""
        if isinstance(schedule, BinomialSchedule):  # stores that many layer inputs
            return -(self.layers - stored(schedule, self.layers)) * self.input_bytes, False
        if chunked(schedule):
            assert isinstance(schedule, NestedSchedule)
            return self.nested_extra(schedule), False
        if isinstance(schedule, NestedSchedule):
            spans = [(self.layers, schedule.levels[0].policy)]
        elif isinstance(schedule, GroupsSchedule):
            spans = [(n, p) for _, n, p in schedule.spans(self.layers)]
        else:
            return None
        kept = [(n * b, exact) for n, p in spans for b, exact in [self.keeps(p)]]
        return sum(b for b, _ in kept) + self.split_bytes(len(spans)), all(e for _, e in kept)

    def nested_extra(self, schedule: NestedSchedule) -> float:
        """At least what a nested schedule keeps beyond ``full``, less the layer inputs it
        does not store (``stored``; may be negative): its innermost level's policy on that
        level's layers (recomputed together in the backward pass), or an outer level's on
        every layer that level's body spans (all of them for the outermost: what it saves
        stays for the whole backward pass), counted ``1 - MARGIN`` (on the TPU, 6x2
        keeping four tags at the outer level needed 0.3% less than all four on every
        layer; outer ``dots`` and ``dots_with_no_batch_dims`` levels needed more than
        their matmuls on every layer). Not for an outer ``none`` level: an unwrapped body
        stores what its inner levels keep."""
        levels = schedule.levels
        kept = levels[-1].length * self._bound(levels[-1].policy)
        spans = self.layers
        for level in levels[:-1]:
            if level.policy.name != NO_REMAT:
                kept = max(kept, (1 - MARGIN) * spans * self._bound(level.policy))
            spans = math.ceil(spans / level.length)
        return kept - (self.layers - stored(schedule, self.layers)) * self.input_bytes

    @property
    def input_bytes(self) -> float:
        """What ``full`` stores per layer, at most (``STORED_PER_INPUT``)."""
        return STORED_PER_INPUT * self.costs.carry_bytes

    def _bound(self, policy: Policy) -> float:
        """At least what ``policy`` keeps per layer (``nested_extra``): ``keeps``, its
        lower bound where not exact, counting no tag that redoes no matmul (it may be the
        layer input, stored anyway)."""
        tags = {n: t for n, t in self.costs.tags.items() if t.flops}
        if policy.name == "save_only_these_names":
            return float(sum(tags[n].bytes for n in policy.names if n in tags))
        if policy.name in ("save_anything_except_these_names", "save_any_names_but_these"):
            return float(sum(t.bytes for n, t in tags.items() if n not in policy.names))
        if policy.name in _ALL:
            return float(max(self.costs.dot_bytes, sum(t.bytes for t in tags.values())))
        return self.keeps(policy)[0]

    def split_bytes(self, groups: int) -> float:
        """Bytes a schedule of ``groups`` groups needs beyond what its layers keep
        (``SPLIT_OVERHEAD``; none for one group)."""
        return SPLIT_OVERHEAD * groups * self.costs.xs_bytes if groups > 1 else 0.0

    def table(self) -> list[dict[str, Any]]:
        """Per tag: bytes per layer, over all layers, and the matmul FLOPs a layer redoes
        when it is not kept (``TaggedValue``), dearest per byte first."""
        ranked = sorted(self.costs.tags.values(), key=lambda t: (-t.flops_per_byte, t.name))
        return [{"name": t.name, "bytes_per_layer": t.bytes, "bytes": t.bytes * self.layers,
                 "flops_per_layer": t.flops} for t in ranked]


def knapsack(costs: LayerCosts, room: float) -> tuple[str, ...]:
    """The tags whose bytes over every layer fit in ``room`` and save the most recompute
    FLOPs: every subset of up to ``MAX_EXACT_TAGS`` tags, else the dearest per byte
    first. Empty when none fits."""
    tags = [t for t in costs.costs.tags.values() if t.bytes * costs.layers <= room]
    if len(tags) > MAX_EXACT_TAGS:
        tags.sort(key=lambda t: -t.flops_per_byte)
        chosen, used = [], 0.0
        for t in tags:
            if used + t.bytes * costs.layers <= room:
                chosen.append(t.name)
                used += t.bytes * costs.layers
        return tuple(sorted(chosen))
    best: tuple[float, tuple[str, ...]] = (0.0, ())
    for k in range(1, len(tags) + 1):
        for subset in itertools.combinations(tags, k):
            if sum(t.bytes for t in subset) * costs.layers <= room:
                best = max(best, (sum(t.flops for t in subset),
                                  tuple(sorted(t.name for t in subset))))
    return best[1]


def chunked(schedule: Schedule) -> bool:
    """Recomputes whole layers, storing fewer layer inputs than remat of each layer (a
    binomial schedule, a nested one of several levels)."""
    return isinstance(schedule, BinomialSchedule) or (
        isinstance(schedule, NestedSchedule) and schedule.depth > 1)


def stored(schedule: Schedule, layers: int) -> int:
    """Layer inputs a chunked schedule of ``layers`` stores at most at once: a binomial
    one its snapshots; a nested one each level's chunk boundaries (the outermost count
    derived from ``layers``)."""
    if isinstance(schedule, BinomialSchedule):
        return min(schedule.snapshots, layers)
    assert isinstance(schedule, NestedSchedule)
    inner = schedule.lengths[1:]
    return math.ceil(layers / math.prod(inner)) + sum(inner)


def below_full(layers: int) -> NestedSchedule | None:
    """Remat over chunks of layers storing fewest layer inputs (module docstring, 6.):
    ``n1 x n2 = layers`` with the least ``n1 + n2`` (the shorter inner), nothing saved at
    either level; ``None`` for fewer than 4 layers or a prime count."""
    splits = [(d + layers // d, layers // d, d) for d in range(2, math.isqrt(layers) + 1)
              if layers % d == 0]
    if not splits:
        return None
    _, outer, inner = min(splits)
    return NestedSchedule.build([outer, inner], "nothing_saveable")


def _saved_names(policy: Policy) -> tuple[str, ...]:
    """The tags a name policy keeps on the device (an offloading one: its saved names)."""
    if policy.name == "save_and_offload_only_these_names":
        saved = dict(policy.kwargs).get("names_which_can_be_saved", ())
        return (saved,) if isinstance(saved, str) else tuple(saved)
    return policy.names
