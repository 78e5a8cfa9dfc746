"""Layer stacks: the presets a user would pick, tried first; what each tag costs; groups.

**Which scans.** A *layer stack* is a scan of at most ``SHORT_SCAN`` (128) steps whose
step does at least ``HEAVY_FLOPS`` (10^4) of matmul work (``StepCosts.flops``): the
layers of a network, not a recurrence of 10^4 light steps. The length decides: over
128 steps the stored carries (which nesting removes) grow with ``T`` and the
recurrence's search runs; up to 128, every step's residuals dominate and remat per
step -- the presets -- is what trades them. The FLOPs only leave out toy steps (a
tiny test cell: 32 FLOPs), whose whole scan costs microseconds. A short LSTM (the seed
cell at T=100: 1.6 MFLOP a step) counts as a stack: plain, remat of each step and the
dots policies are what its user would try first too.

**What the search does with one** (``LayerPlan``, used by the planner):

1. The study's only seed is ``full`` (every layer keeps nothing: the smallest preset,
   Flax's ``nn.remat`` and MaxText's default).
2. Then the presets (``preset_labels``, in that order) come before any other
   candidate: ``minimal`` (``dots_with_no_batch_dims``), ``checkpoint_dots``, no remat,
   MaxText's name presets over the step's tags, saving every tag, and the offloaded
   ones where the study's probe passed. Each is compiled and timed when it fits, never
   ruled out by the time model's guess, so the pick is never slower than a preset
   measured to fit.
3. Where a run decides the fit (a TPU or GPU: ``device_memory.VALIDATED``), a preset
   predicted over the budget is not compiled or run: what it keeps beyond ``full``
   (``LayerCosts.keeps``: the tags' and matmul outputs' bytes per layer, from the
   trace, times the layers) plus ``full``'s measured figure. A TPU's compiled estimate
   overshoots a layer stack by up to a third; the trace's bytes do not. A schedule of
   several groups needs more: each group scans a slice of the stacked parameters and
   their gradient is joined back (``SPLIT_OVERHEAD``, ``LayerCosts.split_bytes``). Elsewhere
   (a CPU) the compile's estimate decides, as for every candidate, at no trial's cost.
4. Once ``full`` is measured: the tags predicted fastest under the budget (``knapsack``:
   the most recompute FLOPs saved within the room left) and, for each preset over the
   budget (predicted, or by its own figure), a groups schedule
   (``autoremat._schedules.groups``) giving that preset to as many layers as the room
   pays for (``split``: per layer, what the preset keeps more than ``full``) and
   ``nothing`` to the rest.
5. Between two presets that were both measured: a preset over the budget by its own
   figure (no remat, typically, refused by the compiler with the size it needed) on as
   many layers as fit, the fastest preset timed within the budget on the rest
   (``LayerPlan.pair``; per layer, the difference of their figures). A pair found over
   the budget by its own figure is proposed again with fewer layers of the larger one.
6. Below ``full`` (its own figure over the budget): no per-layer schedule fits, since each
   keeps at least what ``full`` keeps. What can is remat over chunks of layers (Chen et
   al. 2016, ``nested``): ``n1 x n2`` with nothing saved at either level stores
   ``n1 + n2`` layer inputs instead of ``L``, for one more forward pass of every layer.
   The split storing fewest is tried first (``below_full``); a nested schedule is
   predicted from ``full``'s figure less the layer inputs it does not store (twice
   their bytes, ``STORED_PER_INPUT``) plus what its levels keep (``LayerCosts.extra``:
   meant to err low; a binomial one,
   ``full``'s less the inputs its snapshots do not store), and once an all-``nothing``
   one is found over the budget, from what that figure implies ``full`` costs there.

The trade-off: a preset costs a compile and a timing (a few seconds each on a TPU);
about ten of them are the price of never losing to one. The byte predictions ignore
what XLA fuses away, so a prediction within ``MARGIN`` of the budget is measured.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from autoremat._schedules.base import SHORT_SCAN, Schedule
from autoremat._schedules.binomial import BinomialSchedule
from autoremat._schedules.groups import GroupsSchedule
from autoremat._schedules.nested import NestedSchedule
from autoremat._schedules.nested_space import policy_choices
from autoremat._schedules.policy import NO_REMAT, Policy
from autoremat._search.named_policies import MAXTEXT, MAXTEXT_OFFLOADED

if TYPE_CHECKING:
    from autoremat._scan.checkpoint_names import StepCosts

#: A step of at least this many matmul FLOPs is heavy (the module docstring).
HEAVY_FLOPS: Final = 1e4
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
#: The fixed presets, by their label in the search space (``nested_space.POLICIES``).
FIXED: Final = ("dots_no_batch", "dots", NO_REMAT)
#: The platform's own offloaded preset (MaxText's ``minimal_offloaded``).
OFFLOADED: Final = ("offload_step",)
_ZERO: Final = ("nothing_saveable",)
_NO_BATCH: Final = ("dots_with_no_batch_dims_saveable", "checkpoint_dots_with_no_batch_dims")
_DOTS: Final = ("dots_saveable", "checkpoint_dots")
_ALL: Final = (NO_REMAT, "everything_saveable")


def is_layer_stack(seq_len: int, costs: StepCosts | None) -> bool:
    """The rule of the module docstring: at most ``SHORT_SCAN`` steps of at least
    ``HEAVY_FLOPS`` matmul FLOPs each."""
    return costs is not None and 2 <= seq_len <= SHORT_SCAN and costs.flops >= HEAVY_FLOPS


def preset_labels(platform: str, named: Mapping[str, Policy],
                  refused: frozenset[str] = frozenset()) -> list[str]:
    """The per-step policy labels of the presets, in the order they are tried (``full``,
    the seed, is not among them): ``FIXED``, MaxText's name presets the step has the tags
    of, saving every tag, then the offloaded ones; none ``refused`` by the probe."""
    choices = policy_choices(platform, "step", named)
    save_all = max((label for label, p in named.items() if p.name == "save_only_these_names"
                    and label.startswith("save(")), key=lambda lb: len(named[lb].names),
                   default=None)
    labels = [*FIXED, *(lb for lb in MAXTEXT if lb in named), *([save_all] if save_all else []),
              *OFFLOADED, *(lb for lb in MAXTEXT_OFFLOADED if lb in named)]
    return [lb for lb in labels if (lb == NO_REMAT or lb in choices) and lb not in refused]


def preset_params(label: str) -> dict[str, Any]:
    """The search-space params of remat of each step under ``label`` (depth 1)."""
    return {"kind": "nested", "depth": 1, "d1_policy": label, "d1_unroll": 1}


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
        if isinstance(schedule, NestedSchedule) and schedule.depth > 1:
            return self.nested_extra(schedule), False
        if isinstance(schedule, BinomialSchedule):  # stores that many layer inputs
            unstored = self.layers - min(schedule.snapshots, self.layers)
            return -unstored * self.input_bytes, False
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
        every layer that level's body spans (all of them for the outermost: the tags it
        saves stay for the whole backward pass), counted ``1 - MARGIN`` (on the TPU, 6x2
        keeping four tags at the outer level needed 0.3% less than all four on every
        layer). An outer level's bound is counted only where ``keeps`` is exact (not
        ``none``: an unwrapped body stores what its inner levels keep). A tag with no
        matmul to redo is left out: it may be the layer input, stored anyway."""
        levels = schedule.levels
        kept = levels[-1].length * self._bound(levels[-1].policy)[0]
        spans = self.layers
        for level in levels[:-1]:
            per_layer, exact = self._bound(level.policy)
            if exact:
                kept = max(kept, (1 - MARGIN) * spans * per_layer)
            spans = math.ceil(spans / level.length)
        return kept - (self.layers - stored(schedule, self.layers)) * self.input_bytes

    @property
    def input_bytes(self) -> float:
        """What ``full`` stores per layer, at most (``STORED_PER_INPUT``)."""
        return STORED_PER_INPUT * self.costs.carry_bytes

    def _bound(self, policy: Policy) -> tuple[float, bool]:
        """``keeps`` without the tags that redo no matmul (``nested_extra``)."""
        if policy.name != "save_only_these_names":
            return self.keeps(policy)
        tags = self.costs.tags
        return float(sum(tags[n].bytes for n in policy.names if n in tags and tags[n].flops)), True

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


def stored(schedule: NestedSchedule, layers: int) -> int:
    """Layer inputs a nested schedule of ``layers`` stores at most at once: each level's
    chunk boundaries (the outermost count derived from ``layers``)."""
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


def split(layers: int, extra_per_layer: float, room: float) -> int | None:
    """How many of ``layers`` can keep ``extra_per_layer`` bytes more within ``room`` (at
    least one, fewer than all); ``None`` when not one can, or all can."""
    if extra_per_layer <= 0:
        return None
    k = math.floor(room / extra_per_layer)
    return k if 1 <= k < layers else None


@dataclass
class LayerPlan:
    """The planner's layer-stack side (module docstring): the presets' keys in order,
    ``full``'s measured figure, the proposals made from it. ``predicts``: the platform's
    fit is decided by a run (``device_memory.VALIDATED``), so a preset predicted over the
    budget is not run; elsewhere its compile decides, as for any candidate."""

    costs: LayerCosts
    budget_bytes: int
    predicts: bool = False
    first: list[str] = field(default_factory=list)  # schedule keys tried first, in order
    base: float | None = None  # full's measured fit_bytes
    #: ``full``'s figure as an all-``nothing`` nested schedule measured over implies it
    nested_base: float | None = None
    #: one policy on every layer, timed within the budget: ``(fit bytes, step s, policy)``
    fits: list[tuple[float, float, Policy]] = field(default_factory=list)
    #: one policy on every layer, over the budget by its own figure: ``(size, policy)``
    overs: list[tuple[float, Policy]] = field(default_factory=list)
    #: the latest pair proposed per policy over the budget (its schedule key)
    pairs: dict[Policy, str] = field(default_factory=dict)
    _seen: set[tuple[str, bool]] = field(default_factory=set)  # (key, timed) observed

    def priority(self, key: str) -> int | None:
        """The rank of a schedule tried first (``None``: an ordinary candidate)."""
        return self.first.index(key) if key in self.first else None

    def predicted(self, schedule: Schedule) -> tuple[float, bool] | None:
        """Predicted fit bytes (``full``'s measured figure plus what the schedule keeps
        more, ``LayerCosts.extra``) and whether it is exact (else a lower bound)."""
        extra = self.costs.extra(schedule)
        if extra is None or self.base is None:
            return None
        base = self.base
        if _chunked(schedule):
            base = max(base, self.nested_base or base)
        return base + extra[0], extra[1]

    def over(self, schedule: Schedule) -> bool:
        """Where the plan ``predicts``: over the budget by more than ``MARGIN`` (a lower
        bound: over at all), or at all once ``full`` itself is over it (a per-layer
        schedule keeps at least what ``full`` keeps)."""
        guess = self.predicted(schedule) if self.predicts else None
        if guess is None:
            return False
        per_layer = isinstance(schedule, GroupsSchedule) or _one_policy(schedule) is not None
        if per_layer and self.base is not None and self.base > self.budget_bytes:
            return True
        limit = self.budget_bytes * (1 + MARGIN) if guess[1] else self.budget_bytes
        return guess[0] > limit

    def observe(self, schedule: Schedule, size: int | None, presets: Mapping[str, Policy],
                step: float | None = None) -> list[Schedule]:
        """A sized or measured (``step``: timed) schedule: ``full``'s figure (``nothing_saveable``
        on every layer) brings the knapsack's tags and, where the plan ``predicts``, a
        groups schedule per preset predicted over the budget; a preset found over the
        budget by its own figure brings its groups schedules (against ``nothing``, and
        against the fastest preset that fits: ``pair``), and so does a new fastest preset
        within the budget for every preset over it. New candidates to try first, each
        proposed once; a pair replaces the earlier pair of its policy among them. A
        schedule seen again (every worker's trials are observed each round) is not."""
        if size is None or (schedule.key(), step is not None) in self._seen:
            return []
        self._seen.add((schedule.key(), step is not None))
        layers = self.costs.layers
        out: list[Schedule | None] = []
        policy = _one_policy(schedule)
        if _is_full(schedule) and self.base is None:
            self.base = float(size)
            kept = knapsack(self.costs, self.budget_bytes - self.base)
            if kept:
                out.append(NestedSchedule.build([layers], [Policy("save_only_these_names",
                                                                  args=kept)]))
            if self.predicts:
                out += [self._grouped(p, self.costs.keeps(p)) for p in presets.values()]
            if size > self.budget_bytes:
                nested = below_full(layers)
                out.append(None if nested is None or self.over(nested) else nested)
        elif policy is not None and self.base is not None and size > self.budget_bytes:
            self.overs.append((float(size), policy))
            out += [self._grouped(policy, ((size - self.base) / layers, True)),
                    self.pair(float(size), policy)]
        elif policy is not None and step is not None and size <= self.budget_bytes:
            fastest = min((s for _, s, _ in self.fits), default=None)
            self.fits.append((float(size), step, policy))
            if fastest is None or step < fastest:
                out += [self.pair(s, p) for s, p in self.overs]
        elif isinstance(schedule, GroupsSchedule) and size > self.budget_bytes:
            out.append(self._fewer(schedule, float(size)))
        elif _all_nothing(schedule) and size > self.budget_bytes:
            assert isinstance(schedule, NestedSchedule)
            implied = size + (layers - stored(schedule, layers)) * self.costs.input_bytes
            self.nested_base = max(self.nested_base or implied, implied)
        fresh = [s for s in out if s is not None and s.key() not in self.first]
        fresh = list({s.key(): s for s in fresh}.values())
        self.first += [s.key() for s in fresh]
        return fresh

    def pair(self, size: float, policy: Policy) -> Schedule | None:
        """``policy`` (over the budget at ``size`` on every layer) on as many layers as
        the room above the fastest preset timed within the budget pays for, that preset
        on the rest: per layer, the difference of the two figures."""
        best = min(self.fits, key=lambda f: f[1], default=None)
        if best is None or best[2] == policy:
            return None
        k = split(self.costs.layers, (size - best[0]) / self.costs.layers,
                  self.budget_bytes - best[0] - self.costs.split_bytes(2))
        if k is None:
            return None
        pair = GroupsSchedule.build([(k, policy), (self.costs.layers - k, best[2])])
        earlier = self.pairs.get(policy)
        if earlier is not None and earlier != pair.key() and earlier in self.first:
            self.first.remove(earlier)  # an ordinary candidate now: one pair tried first
        self.pairs[policy] = pair.key()
        return pair

    def _fewer(self, schedule: GroupsSchedule, size: float) -> Schedule | None:
        """A pair of groups over the budget at ``size``: fewer layers of its first policy,
        per layer what it measured more than its second policy's own figure."""
        spans = [(n, p) for _, n, p in schedule.spans(self.costs.layers)]
        if len(spans) != 2:
            return None
        (k, first), (_, rest) = spans
        floor = self.base if rest == Policy("nothing_saveable") else next(
            (s for s, _, p in self.fits if p == rest), None)
        overhead = self.costs.split_bytes(2)
        if floor is None or size <= floor + overhead:
            return None
        fewer = split(self.costs.layers, (size - floor - overhead) / k,
                      self.budget_bytes - floor - overhead)
        if fewer is None or fewer >= k:
            return None
        smaller = GroupsSchedule.build([(fewer, first), (self.costs.layers - fewer, rest)])
        if self.pairs.get(first) == schedule.key():
            self.pairs[first] = smaller.key()  # the pair of ``first`` now
        return smaller

    def _grouped(self, policy: Policy, per_layer: tuple[float, bool]) -> Schedule | None:
        """``policy`` on as many layers as the room pays for, ``nothing`` on the rest."""
        if self.base is None or not per_layer[1]:
            return None
        k = split(self.costs.layers, per_layer[0],
                  self.budget_bytes - self.base - self.costs.split_bytes(2))
        return None if k is None else GroupsSchedule.build(
            [(k, policy), (self.costs.layers - k, "nothing_saveable")])


def _one_policy(schedule: Schedule) -> Policy | None:
    """The policy of remat of each step (``None``: another schedule)."""
    if isinstance(schedule, NestedSchedule) and schedule.depth == 1:
        return schedule.levels[0].policy
    return None


def _chunked(schedule: Schedule) -> bool:
    """Stores fewer layer inputs than remat of each layer (nested, binomial)."""
    return isinstance(schedule, BinomialSchedule) or (
        isinstance(schedule, NestedSchedule) and schedule.depth > 1)


def _all_nothing(schedule: Schedule) -> bool:
    """A nested schedule of several levels, each saving nothing."""
    return isinstance(schedule, NestedSchedule) and schedule.depth > 1 and all(
        lv.policy.name == "nothing_saveable" for lv in schedule.levels)


def _is_full(schedule: Schedule) -> bool:
    policy = _one_policy(schedule)
    return policy is not None and policy.name == "nothing_saveable"


def _saved_names(policy: Policy) -> tuple[str, ...]:
    """The tags a name policy keeps on the device (an offloading one: its saved names)."""
    if policy.name == "save_and_offload_only_these_names":
        saved = dict(policy.kwargs).get("names_which_can_be_saved", ())
        return (saved,) if isinstance(saved, str) else tuple(saved)
    return policy.names
