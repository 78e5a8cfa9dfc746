"""The nested kind: chunked scans, each level's body under ``jax.checkpoint``.

Chen et al. 2016 ("Training Deep Nets with Sublinear Memory Cost", arXiv
1604.06174): an outer scan over chunks whose body -- the inner scan of one
chunk -- is checkpointed keeps only the carries at chunk boundaries and
recomputes one chunk at a time in the backward pass. With ``d`` levels memory
is ``O(d * T^(1/d))`` for ``d - 1`` extra forward passes. The builder is
``autoremat._schedules.nested_scan``, its search space ``nested_space``; this module
(pure Python) owns the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import autoremat._schedules.nested_space as nested_space
from autoremat._errors import ScheduleError
from autoremat._schedules.base import NO_NAMES, Check, Features, Param, Schedule, at
from autoremat._schedules.nested_space import Named
from autoremat._schedules.policy import (
    FACTORY_POLICIES,
    NO_REMAT,
    Level,
    Policy,
    _as_names,
    check_levels,
    mapping_of,
)
from autoremat.bounds import Cost

#: More than 64 levels of length >= 2 tile more than 2^64 steps.
MAX_LEVELS: Final = 64
LEVEL_KEYS: Final = ("length", "policy")
#: Policies under which a level stores its body's residuals instead of
#: recomputing them in the backward pass (the cost model; the name policies that
#: keep all but a few tags are counted here).
KEEPS_EVERYTHING: Final = ("none", "everything_saveable", "save_anything_except_these_names",
                            "save_any_names_but_these")
#: Policies whose re-run skips the matmuls (their outputs are saved): a partial re-run
#: (a policy keeping some tags is counted as one).
PARTIAL: Final = ("dots", "offload_dot", "save_only_these_names",
                   "save_and_offload_only_these_names")
#: Of those, the ones whose saved values stay on the device (partial residuals).
PARTIAL_ON_DEVICE: Final = ("dots", "save_only_these_names")



@dataclass(frozen=True, kw_only=True)
class NestedSchedule(Schedule):
    """``kind: nested`` -- levels of chunked scans, outermost first.

    * Level ``i`` is a ``lax.scan`` whose body -- the whole scan of level
      ``i + 1``, or the user's step at the innermost level -- is wrapped in
      ``jax.checkpoint(policy=levels[i].policy)``. ``policy: none`` leaves the
      body unwrapped. A one-level schedule is a plain scan, optionally with
      per-step remat.
    * ``unroll`` is the ``lax.scan`` unroll of the innermost level.
    * Any sequence length ``T`` runs. The inner lengths are fixed chunk sizes;
      the outermost count is derived from ``T``. When ``T`` is not a multiple
      of the chunk, the rest is run as a mixed-radix remainder: with chunk
      sizes ``c_i = n_{i+1} * ... * n_d``, ``T`` is split into
      ``q_1 c_1 + q_2 c_2 + ... + q_d`` (``q_i < n_i`` for ``i > 1``); each
      part is a scan of ``q_i`` chunks at level ``i`` with the same inner
      levels (``pieces``). Memory stays that of the schedule plus at most
      ``d`` short scans. ``T`` smaller than a chunk skips the outer levels.
    * Every JAX transformation works (grad of any order, jvp, vmap, jit):
      the builder is plain ``lax.scan`` and ``jax.checkpoint``.

    Attributes:
      levels: the levels, outermost first (1 to ``MAX_LEVELS``).
    """

    kind: ClassVar[str] = "nested"
    FIELDS: ClassVar[Mapping[str, str]] = {
        "levels": "levels: [{length: 100, policy: nothing_saveable}]"}

    levels: tuple[Level, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", check_levels("levels", self.levels, MAX_LEVELS))
        super().__post_init__()

    @classmethod
    def build(cls, lengths: Sequence[int],
              policies: str | Policy | Sequence[str | Policy | Mapping[str, Any]] = "nothing_saveable",
              *, unroll: int = 1, meta: Mapping[str, Any] | None = None) -> NestedSchedule:
        """``autoremat.nested``: one policy for every level, or one per level."""
        lengths = tuple(lengths)
        if isinstance(policies, (str, Policy)):
            policies = (policies,) * len(lengths)
        policies = tuple(policies)
        if len(policies) != len(lengths):
            raise ScheduleError(
                f"policies: got {len(policies)} policies for {len(lengths)} levels")
        levels = []
        for i, (n, p) in enumerate(zip(lengths, policies, strict=True)):
            with at(f"levels[{i}]"):
                levels.append(Level(n, Policy.from_data(p)))
        return cls(levels=tuple(levels), unroll=unroll, meta=dict(meta or {}))

    def policies(self) -> list[tuple[str, Policy]]:
        return [(f"levels[{i}].policy", lv.policy) for i, lv in enumerate(self.levels)]

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(lv.length for lv in self.levels)

    @property
    def depth(self) -> int:
        return len(self.levels)

    @property
    def tuned_length(self) -> int:
        """The sequence length the levels tile exactly (their product)."""
        return math.prod(self.lengths)

    # -- the file form -------------------------------------------------------------
    @classmethod
    def parse_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        return {"levels": parse_levels(data["levels"], "levels")}

    def fields_data(self) -> dict[str, Any]:
        return {"levels": levels_data(self.levels)}

    # -- summaries -----------------------------------------------------------------
    def describe(self) -> str:
        lengths = "x".join(str(n) for n in self.lengths)
        policies = "/".join(policy_label(lv.policy) for lv in self.levels)
        return f"{lengths} {policies} unroll={self.unroll}{self.options_note()}"

    def explain(self) -> list[str]:
        lines = [f"  depth {self.depth}, tiles T = {self.tuned_length} exactly (any T runs)"]
        for i, lv in enumerate(self.levels):
            where = "outermost" if i == 0 else ("innermost" if i == self.depth - 1 else "")
            lines.append(f"  level {i}: length {lv.length:>7}, policy {lv.policy.to_data()}"
                         + (f"  ({where})" if where and self.depth > 1 else ""))
            meaning = lv.policy.explain_names()
            if meaning:
                lines.append(f"           {meaning}")
        lines.append(f"  unroll (innermost): {self.unroll}")
        return lines

    def cost(self, seq_len: int) -> Cost:
        """A model (``autoremat.bounds``): a level keeping everything stores its
        steps' residuals, counted as one carry per step; a partial policy is
        counted as recomputing its body in full."""
        levels = self.levels
        evaluations, stored, extra = 0, 0, 0
        for _, count, level in pieces(seq_len, self.lengths):
            piece = (Level(count, levels[level].policy), *levels[level + 1:])
            chunk = math.prod(lv.length for lv in levels[level + 1:])
            recomputes = sum(lv.policy.name not in KEEPS_EVERYTHING for lv in piece)
            evaluations += count * chunk * (1 + recomputes)
            kept, peak = _stored(piece)
            stored += kept
            extra = max(extra, peak - kept)
        return Cost(seq_len, evaluations, stored + extra)

    def features(self, seq_len: int) -> Features:
        """``partial``: evaluations re-run under ``dots`` policies; ``boundaries``:
        iterations of the outer (non-innermost) levels, forward and backward;
        ``terms``: the backward's peak (``level_terms``)."""
        lengths = self.lengths
        boundaries = 2.0 * sum(math.prod(lengths[:i + 1]) for i in range(len(lengths) - 1))
        return Features(evaluations=float(self.cost(seq_len).evaluations),
                        partial=self._partial(seq_len), boundaries=boundaries,
                        terms=level_terms(self.levels, seq_len)[1])

    def timing_length(self, seq_len: int, short: int) -> int:
        """Whole chunks of the outermost level (the inner levels as they are), at
        least two: every cost but the outer loop's trips is per chunk, so the
        step time scales with the chunk count (``features`` is linear in it)."""
        chunk = math.prod(self.lengths[1:])
        return min(seq_len, chunk * max(2, -(-short // chunk)))

    def _partial(self, seq_len: int) -> float:
        """Step evaluations re-run under ``dots`` policies (their matmuls saved)."""
        levels, total = self.levels, 0
        for _, count, level in pieces(seq_len, self.lengths):
            chunk = math.prod(self.lengths[level + 1:])
            total += count * chunk * sum(lv.policy.name.startswith(PARTIAL)
                                         for lv in levels[level:])
        return float(total)

    def run(self, step: Callable[..., Any], init: Any, leaves: list[Any], axes: list[int],
            steps: int, reverse: bool) -> tuple[Any, Any]:
        from autoremat._schedules.nested_scan import nested_scan

        return nested_scan(step, init, leaves, axes, pieces(steps, self.lengths), self.levels,
                           self.unroll, reverse)

    # -- the search space (``nested_space``) ------------------------------------------
    @classmethod
    def parameters(cls, seq_len: int, platform: str, chosen: Mapping[str, Any],
                   named: Named = NO_NAMES) -> list[Param]:
        """``nested_space.parameters``: depth, inner lengths, a policy per level, unroll."""
        return nested_space.parameters(seq_len, platform, chosen, named)

    @classmethod
    def tied_moves(cls, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``nested_space.unrolled_inner``: the innermost level fully unrolled."""
        return nested_space.unrolled_inner(params)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], seq_len: int, platform: str,
                    named: Named = NO_NAMES) -> NestedSchedule:
        lengths, policies, unroll = nested_space.from_params(params, seq_len, platform, named)
        return cls.build(lengths, policies, unroll=unroll)

    @classmethod
    def seed_params(cls, seq_len: int, platform: str = "cpu") -> list[dict[str, Any]]:
        """On every platform: plain scan, per-step remat, sqrt(T) two levels (outer ``nothing``,
        inner chunk stored) and cube-root three levels (``nothing/nothing/everything``).

        On a CPU also (``T >= 1000``) three levels of short chunks, ``T/100 x 10 x 10``
        ``nothing/dots/everything``: the innermost 10 steps stored whole, the
        middle level re-run without its matmuls. On the seed LSTM the latter was
        the fastest or within 5% of the fastest of a 101-schedule grid in 7 of
        8 T=10^4 grids measured (``studies/bench_tune.py``; 19% in the eighth,
        on a loaded machine) -- short chunks keep the backward's working set
        small -- and the cost model, which reads no cache effects, does not
        find it by itself. On a TPU it was never the pick, so it is a CPU seed only
        (``studies/results/tune_time.md``).

        Off a CPU instead, third: ``T/4 x 4`` ``nothing/everything`` with the four
        steps unrolled (``nested_space.UNROLLED_CHUNK``). Its memory is ``T/4``
        carries plus four steps' residuals -- under per-step remat's ``T`` carries
        wherever a step's residuals are under ``T/4`` carries -- and its time one
        forward recompute, as per-step remat, with a quarter of the loop's
        iterations, each four steps the compiler fuses across. An accelerator pays
        for each loop iteration, so this seed runs near the search's pick, faster
        than per-step remat and sqrt(T), where a move of one parameter at a time
        from the other seeds takes many trials to get there
        (``studies/results/tune_time.md``)."""
        return nested_space.seed_params(seq_len, platform)

    @classmethod
    def checks(cls, seq_len: int, platform: str,
               named: Named = NO_NAMES) -> Mapping[str, Check]:
        """Each offload placement this platform offers, on its own
        (``nested_space.check_levels``). XLA:GPU has refused offload in a scan's backward
        ("Expected instruction to have shape equal to ...", jax 0.11.2) and
        given wrong gradients for offloaded scan residuals (openxla/xla 46231, fixed by
        46308); XLA:TPU refuses a value offloaded at two loops' depth (maxtext PR 4995)."""
        return {label: Check(cls.build(lengths, policies), offloads=True)
                for label, (lengths, policies)
                in nested_space.check_levels(seq_len, platform, named).items()}

    @classmethod
    def examples(cls) -> Sequence[Schedule]:
        """1-4 levels, every kind of policy, T smaller than one chunk, remainders."""
        build = cls.build
        return [build((4, 4)), build((2, 3)), build((10, 10), "dots_saveable"),
                build((10, 10, 10)), build((10, 10, 10)),
                build((2, 2, 3, 4), "dots_with_no_batch_dims_saveable"), build((1,)),
                build((7,), "everything_saveable"), build((4, 5, 6)), build((30, 30)),
                build((3,), NO_REMAT), build((3, 2)), build((3, 4, 5, 2)),
                build((25, 40), "dots_saveable"), build((2, 5, 10, 10))]


def parse_levels(raw: Any, field: str) -> Any:
    """A YAML list of ``{length, policy}`` mappings as ``Level``s (``field`` names it in
    errors); anything but a list is returned as it is, for the constructor to refuse."""
    if not isinstance(raw, list):
        return raw
    levels = []
    for i, raw_item in enumerate(raw):
        where = f"{field}[{i}]"
        item = mapping_of(raw_item, LEVEL_KEYS,
                          "a mapping like {length: 100, policy: nothing_saveable}", where)
        if "length" not in item:
            raise ScheduleError(f"{where}.length: missing; give a positive integer")
        with at(where):
            levels.append(Level(item["length"],
                                Policy.from_data(item.get("policy", "nothing_saveable"))))
    return tuple(levels)


def levels_data(levels: tuple[Level, ...]) -> list[dict[str, Any]]:
    """The YAML form of ``levels`` (the inverse of ``parse_levels``)."""
    return [{"length": lv.length, "policy": lv.policy.to_data()} for lv in levels]


def pieces(steps: int, lengths: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Split ``steps`` into ``(start, chunk_count, level)`` parts, mixed radix.

    Level ``k`` chunks hold ``prod(lengths[k+1:])`` steps; the innermost level's
    chunk is one step, so every ``steps`` is covered exactly.
    """
    out, start = [], 0
    for level in range(len(lengths)):
        chunk = math.prod(lengths[level + 1:])
        count = (steps - start) // chunk
        if count:
            out.append((start, count, level))
            start += count * chunk
    assert start == steps
    return out


def _stored(levels: tuple[Level, ...]) -> tuple[int, int]:
    """(carries kept from the forward pass, peak during the backward) of one run."""
    head, inner = levels[0], levels[1:]
    if not inner:
        return head.length, head.length
    kept, peak = _stored(inner)
    if head.policy.name in KEEPS_EVERYTHING:
        return head.length * kept, (head.length - 1) * kept + peak
    return head.length, head.length + peak


_Terms = tuple[float, float, float]


def level_terms(levels: tuple[Level, ...], steps: int) -> tuple[_Terms, _Terms]:
    """(kept, peak) of levels covering ``steps`` steps, as (carries, steps' full
    residuals, steps' partial residuals (dots policies)): ``Features.terms``.

    A remat level stores what its policy saves of every step below it, whatever the
    inner levels save: under ``everything`` each step whole, as plain does, under
    ``dots`` each step's dots (compiled totals, seed LSTM: ``2000x5 everything/nothing``
    70.8 GB where plain is 68.7 GB and ``10000 nothing`` 10.8 GB; on a CPU and a TPU
    alike, ``tests/test_search.py``). Only a level without remat (``none``) keeps just what its
    inner levels keep."""
    head, inner = levels[0], levels[1:]
    n = min(head.length, steps) if not inner else math.ceil(
        steps / math.prod(lv.length for lv in inner))
    chunk = steps / max(1, n)
    name = head.policy.name
    if name in KEEPS_EVERYTHING and (name != NO_REMAT or not inner):  # every step, whole
        kept: _Terms = (0.0, n * chunk, 0.0)
        return kept, _add(kept, (0.0, 1.0, 0.0))
    if not inner:
        kept = (float(n), 0.0, steps if name.startswith(PARTIAL_ON_DEVICE) else 0.0)
        return kept, _add(kept, (0.0, 1.0, 0.0))
    kept_i, peak_i = level_terms(inner, max(1, round(chunk)))
    if name == NO_REMAT:
        return _scale(kept_i, n), _add(_scale(kept_i, n - 1), peak_i)
    kept = (float(n), 0.0, n * chunk if name.startswith(PARTIAL_ON_DEVICE) else 0.0)
    return kept, _add(kept, peak_i)


def _scale(t: _Terms, k: float) -> _Terms:
    return (t[0] * k, t[1] * k, t[2] * k)


def _add(a: _Terms, b: _Terms) -> _Terms:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def policy_label(policy: Policy) -> str:
    if policy.name == "save_and_offload_only_these_names":
        kw = dict(policy.kwargs)
        saved = ",".join(_as_names(kw.get("names_which_can_be_saved", ())))
        moved = ",".join(_as_names(kw.get("names_which_can_be_offloaded", ())))
        return f"save({saved})+offload({moved})" if policy.kwargs else \
            f"save_and_offload({','.join(policy.args)})"
    if policy.name in FACTORY_POLICIES:
        names = ",".join(policy.args) or ",".join(k for k, _ in policy.kwargs)
        return f"{policy.name}({names})"
    return policy.short
