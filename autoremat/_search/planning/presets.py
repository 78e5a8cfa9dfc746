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
   candidate: JAX's ``dots_with_no_batch_dims_saveable`` (the weight matmuls' outputs;
   on a MaxText-shaped block what MaxText's ``minimal`` saves), ``dots_saveable``, no
   remat, MaxText's name presets over the step's tags (``minimal``, ``save_qkv_proj``,
   ...: each restricted to the names the step tags, ``maxtext_names.presets_over``),
   saving every tag, then the offloaded ones where the study's probe passed: the
   weight matmuls' outputs offloaded, and MaxText's ``qkv_proj_offloaded`` and
   ``minimal_offloaded`` over the tags. Each is compiled and timed when it fits, never
   ruled out by the time model's guess, so the pick is never slower than a preset
   measured to fit.
3. Where a run decides the fit (a TPU or GPU: ``device_memory.VALIDATED``), a preset
   predicted over the budget is not compiled or run: what it keeps beyond ``full``
   (``layer_costs.LayerCosts``: the tags' and matmul outputs' bytes per layer, from
   the trace, times the layers) plus ``full``'s measured figure. A TPU's compiled estimate
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
   keeps at least what ``full`` keeps; chunked schedules store fewer layer inputs
   (``autoremat._search.planning.layer_costs``). First Revolve (``binomial``) storing just
   enough fewer inputs at one input's bytes each, which recomputes fewest layers, then
   the nested ``n1 x n2`` storing fewest (``below_full``), nothing saved at either level
   (``LayerPlan._below_full``). Once one of them is found over the budget, the inputs
   it does not store say what ``full`` costs there (``nested_base``), and every chunked
   schedule is predicted from that.

The trade-off: a preset costs a compile and a timing (a few seconds each on a TPU);
about ten of them are the price of never losing to one. The byte predictions ignore
what XLA fuses away, so a prediction within ``MARGIN`` of the budget is measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from autoremat._measure import device_memory
from autoremat._schedules.base import SHORT_SCAN, Schedule
from autoremat._schedules.binomial import BinomialSchedule
from autoremat._schedules.groups import GroupsSchedule
from autoremat._schedules.maxtext_names import SEARCHED, SEARCHED_OFFLOADED
from autoremat._schedules.nested import NestedSchedule
from autoremat._schedules.nested_space import policy_choices
from autoremat._schedules.policy import NO_REMAT, Policy
from autoremat._search.planning.candidates import Candidate
from autoremat._search.planning.layer_costs import (
    MARGIN,
    LayerCosts,
    below_full,
    chunked,
    knapsack,
    stored,
)
from autoremat._search.planning.pool import Pool

if TYPE_CHECKING:
    from autoremat._scan.checkpoint_names import StepCosts

#: A step of at least this many matmul FLOPs is heavy (the module docstring).
HEAVY_FLOPS: Final = 1e4
#: The fixed presets, by their label in the search space (``nested_space.POLICIES``).
FIXED: Final = ("dots_no_batch", "dots", NO_REMAT)
#: The weight matmuls' outputs offloaded (by kind; MaxText's ``minimal_offloaded`` is by
#: name, among the named presets).
OFFLOADED: Final = ("offload_step",)


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
    labels = [*FIXED, *(lb for lb in SEARCHED if lb in named), *([save_all] if save_all else []),
              *OFFLOADED, *(lb for lb in SEARCHED_OFFLOADED if lb in named)]
    return [lb for lb in labels if (lb == NO_REMAT or lb in choices) and lb not in refused]


def preset_params(label: str) -> dict[str, Any]:
    """The search-space params of remat of each step under ``label`` (depth 1)."""
    return {"kind": "nested", "depth": 1, "d1_policy": label, "d1_unroll": 1}


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
    #: ``full``'s figure as a chunked schedule saving nothing, measured over, implies it
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
        if chunked(schedule):
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
                out += self._below_full(float(size))
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

    def _below_full(self, size: float) -> list[Schedule]:
        """``full`` over the budget at ``size`` (module docstring, 6.): Revolve storing
        as many layer inputs as leave the room, at one input's bytes each and one more
        (the fewest recomputed layers: ``binomial``), then the nested split storing
        fewest (``below_full``); those not predicted over."""
        carry = self.costs.costs.carry_bytes
        unstored = math.ceil((size - self.budget_bytes) / carry) + 1 if carry else 0
        keep = self.costs.layers - unstored
        tries = [BinomialSchedule(snapshots=keep) if 1 <= keep < self.costs.layers else None,
                 below_full(self.costs.layers)]
        return [t for t in tries if t is not None and not self.over(t)]

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


def _all_nothing(schedule: Schedule) -> bool:
    """A binomial schedule, or a nested one of several levels each saving nothing."""
    saves = [lv.policy.name for lv in schedule.levels] \
        if isinstance(schedule, NestedSchedule) else []
    return chunked(schedule) and all(name == "nothing_saveable" for name in saves)


def _is_full(schedule: Schedule) -> bool:
    policy = _one_policy(schedule)
    return policy is not None and policy.name == "nothing_saveable"


class Presets:
    """A layer stack's presets and its plan's proposals, tried before any other candidate
    (the module doc's steps 2-6): they join ``pool`` and are ranked first (``priority``)."""

    def __init__(self, costs: LayerCosts, pool: Pool, budget_bytes: int) -> None:
        self.pool = pool
        self.plan = LayerPlan(costs, budget_bytes,
                              predicts=pool.platform in device_memory.VALIDATED)
        for label in preset_labels(pool.platform, pool.named, pool.refused):
            schedule, params = pool.propose(preset_params(label))
            pool.add(schedule, params)
            self.plan.first.append(schedule.key())

    def priority(self, cand: Candidate) -> int | None:
        """The rank of a candidate tried before all others (``None``: an ordinary one)."""
        return self.plan.priority(cand.schedule.key())

    def over(self, schedule: Schedule) -> bool:
        """Predicted over the budget by what it keeps (``LayerPlan.over``)."""
        return self.plan.over(schedule)

    def observe(self, schedule: Schedule, size: int | None, step: float | None = None) -> None:
        """The plan sees a sized or measured (``step``: timed) schedule; its proposals join
        the pool (``LayerPlan.observe``)."""
        presets = policy_choices(self.pool.platform, "step", self.pool.named) \
            if self.plan.base is None else {}  # the presets matter only until ``full`` is seen
        for proposal in self.plan.observe(schedule, size, presets, step):
            self.pool.add(proposal, {})
