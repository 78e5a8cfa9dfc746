"""The names a step tags with ``jax.ad_checkpoint.checkpoint_name``, what each costs.

A policy such as ``save_only_these_names`` refers to values by the tags a model
gives them (MaxText: ``query_proj``, ``mlpwo``, ...). ``tagged_values`` finds
them in a traced step (nested ``jit``, ``checkpoint``, ``cond``, inner scans
included), with what keeping each costs -- its bytes per step -- and what
rematerializing it costs: the matmul FLOPs of everything it depends on inside
the step (``dot_general`` only; elementwise work is not counted), the work a
backward pass redoes when the value is not kept and nothing before it is.
``check_policy_names`` refuses a schedule whose policies name a tag the step
lacks: JAX would silently save nothing for it. Under ``remat_scans`` one schedule
serves every long scan of the function, so there a tag is checked against the
whole function's tags (``function_tags``), not each scan's.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

from autoremat._errors import ScheduleError
from autoremat._jax import (
    CALLS,
    CHECKPOINT_NAME,
    CHECKPOINT_NAME_PARAM,
    LENGTH,
    REMAT,
    SAME_BYTES,
    SCAN,
    SCAN_BODY,
    Jaxpr,
    Literal,
    scan_split,
    sub_jaxprs,
)
from autoremat._schedules.base import Schedule
from autoremat._schedules.policy import CARRY_NAME

_DOT = "dot_general"
#: The tags of the whole function ``remat_scans`` is evaluating (``function_tags``).
_FUNCTION_TAGS: Final[ContextVar[frozenset[str]]] = ContextVar("function_tags",
                                                              default=frozenset())


@dataclass(frozen=True)
class TaggedValue:
    """One ``checkpoint_name`` tag of a step.

    Attributes:
      name: the tag.
      bytes: bytes of the tagged value per step (the largest if tagged twice).
      flops: matmul FLOPs (``2 * M * N * K`` per ``dot_general``) the value depends
        on within its jaxpr since the tagged values before it (the module docstring).
    """

    name: str
    bytes: int
    flops: float

    @property
    def flops_per_byte(self) -> float:
        """Recompute work saved per byte kept: the search keeps the dearest first."""
        return self.flops / max(1, self.bytes)


def tagged_values(jaxpr: Jaxpr) -> dict[str, TaggedValue]:
    """Every tag in ``jaxpr`` and the jaxprs it holds, sorted by name."""
    found: dict[str, TaggedValue] = {}
    for inner in _all_jaxprs(jaxpr):
        for value in _tags(inner):
            old = found.get(value.name)
            if old is None or (value.bytes, value.flops) > (old.bytes, old.flops):
                found[value.name] = value
    return dict(sorted(found.items()))


def scanned_values(jaxpr: Jaxpr, length: int) -> dict[str, TaggedValue]:
    """The tags inside the bodies of ``jaxpr``'s scans of ``length`` steps: those a
    schedule for that scan can refer to (a tag outside the scan is not)."""
    found: dict[str, TaggedValue] = {}
    for inner in _all_jaxprs(jaxpr):
        for eqn in inner.eqns:
            if eqn.primitive is SCAN and eqn.params.get(LENGTH) == length:
                found.update(tagged_values(eqn.params[SCAN_BODY].jaxpr))
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class StepCosts:
    """What one step of a scan computes and what policies would keep of it, per step.

    Attributes:
      tags: its ``checkpoint_name`` tags (``tagged_values``).
      flops: matmul FLOPs (``dot_general``) of the step.
      dot_bytes: bytes of every matmul output (what ``dots_saveable`` keeps).
      dot_no_batch_bytes: bytes of the matmul outputs without batch dimensions
        (``dots_with_no_batch_dims_saveable``: the weight matmuls, not attention's).
      xs_bytes: bytes of what the scan scans over, every step's (a layer stack's
        stacked parameters).
      carry_bytes: bytes of the scan's carry (a layer stack's activations between
        layers: what remat of each layer stores per layer).
      dot_forms: the dots policies (``dots_with_no_batch_dims_saveable``,
        ``dots_saveable``) that keep exactly some of the tagged values (``dot_forms``):
        policy -> those tags.
    """

    tags: dict[str, TaggedValue]
    flops: float
    dot_bytes: int
    dot_no_batch_bytes: int
    xs_bytes: int = 0
    carry_bytes: int = 0
    dot_forms: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def scanned_costs(jaxpr: Jaxpr, length: int) -> StepCosts | None:
    """``StepCosts`` of the body of ``jaxpr``'s first scan of ``length`` steps (its inner
    jaxprs included; the tags of every such scan, ``scanned_values``); ``None`` when it
    has none."""
    for inner in _all_jaxprs(jaxpr):
        for eqn in inner.eqns:
            if eqn.primitive is SCAN and eqn.params.get(LENGTH) == length:
                body = eqn.params[SCAN_BODY].jaxpr
                dots = [e for j in _all_jaxprs(body) for e in j.eqns if e.primitive.name == _DOT]
                no_batch = [e for e in dots if not e.params["dimension_numbers"][1][0]]
                consts, carry = scan_split(eqn.params)
                return StepCosts(scanned_values(jaxpr, length), sum(_dot_flops(e) for e in dots),
                                 sum(_bytes(e.outvars[0].aval) for e in dots),
                                 sum(_bytes(e.outvars[0].aval) for e in no_batch),
                                 sum(_bytes(v.aval) for v in eqn.invars[consts + carry:]),
                                 sum(_bytes(v.aval) for v in eqn.invars[consts:consts + carry]),
                                 dot_forms(body))
    return None


#: The dots policies ``dot_forms`` reads, and whether each keeps batched matmuls too.
DOTS_POLICIES: Final = {"dots_with_no_batch_dims_saveable": False, "dots_saveable": True}


def dot_forms(body: Jaxpr) -> dict[str, tuple[str, ...]]:
    """The dots policies that keep exactly what a policy over names would in this step:
    every matmul output the policy keeps is tagged (directly, or after a transpose or
    reshape, through ``jnp.einsum``'s jit), and those tags name nothing else. Policy ->
    those tags (sorted); a policy with no such form is absent. The tags then say the
    same as the policy: ``save_only_these_names`` of them keeps the same bytes."""
    no_batch: dict[int, bool] = {}  # matmul (its equation's id) -> without batch dims
    tagged: dict[int, str] = {}  # matmul -> the tag naming its output
    other: set[str] = set()  # tags naming a value that is no matmul's output

    def walk(jaxpr: Jaxpr, origin: dict[Any, int]) -> None:
        for eqn in jaxpr.eqns:
            ins = [None if isinstance(v, Literal) else origin.get(v) for v in eqn.invars]
            name = eqn.primitive.name
            if name == _DOT:
                no_batch[id(eqn)] = not eqn.params["dimension_numbers"][1][0]
                origin[eqn.outvars[0]] = id(eqn)
            elif name in SAME_BYTES and ins and ins[0] is not None:
                origin[eqn.outvars[0]] = ins[0]
            elif name == CHECKPOINT_NAME:
                tag = str(eqn.params[CHECKPOINT_NAME_PARAM])
                if ins[0] is None:
                    other.add(tag)
                else:
                    tagged[ins[0]] = tag
            for inner in sub_jaxprs(eqn.params):
                call = name in CALLS and len(inner.invars) == len(eqn.invars)
                pairs = zip(inner.invars, ins, strict=True) if call else iter(())
                inside = {v: o for v, o in pairs if o is not None}
                walk(inner, inside)
                if call and len(inner.outvars) == len(eqn.outvars):
                    outs = zip(eqn.outvars, inner.outvars, strict=True)
                    origin.update({out: inside[v] for out, v in outs
                                   if not isinstance(v, Literal) and v in inside})

    walk(body, {})
    out: dict[str, tuple[str, ...]] = {}
    for policy, batched in DOTS_POLICIES.items():
        kept = [d for d, plain in no_batch.items() if plain or batched]
        if kept and all(d in tagged for d in kept):
            names = {tagged[d] for d in kept}
            if not names & other and not any(tagged[d] in names for d in tagged
                                             if d not in kept):
                out[policy] = tuple(sorted(names))
    return out


def checkpointed_steps(jaxpr: Jaxpr, min_length: int) -> list[int]:
    """The lengths of ``jaxpr``'s scans of ``>= min_length`` steps whose step holds a
    ``jax.checkpoint`` (``nn.remat``, ``nnx.remat``: a block remat'd inside the scanned
    step). A schedule's policies still decide what each step keeps -- JAX applies the
    outer checkpoint's policy to the values inside the inner one -- but where a level
    does no remat the inner one's policy acts, and it brings its own recompute
    (``studies/results/inner_remat.md``)."""
    found = []
    for inner in _all_jaxprs(jaxpr):
        for eqn in inner.eqns:
            if eqn.primitive is SCAN and eqn.params[LENGTH] >= min_length and any(
                    e.primitive is REMAT for j in _all_jaxprs(eqn.params[SCAN_BODY].jaxpr)
                    for e in j.eqns):
                found.append(int(eqn.params[LENGTH]))
    return found


def inner_remat_note(lengths: list[int]) -> str:
    """What ``checkpointed_steps`` found, said once (empty when nothing)."""
    if not lengths:
        return ""
    return (f"the step of the scan of length {', '.join(map(str, sorted(set(lengths))))} holds "
            "a jax.checkpoint (nn.remat / nnx.remat / jax.checkpoint around the block): the "
            "schedule's policies still decide what each step keeps, but a level with no remat "
            "runs that checkpoint's policy instead, and it adds its own recompute; remove it "
            "from the scanned block to let the schedule alone decide "
            "(docs/layer_stacks.md, 'A remat already inside the block')")


def _bytes(aval: Any) -> int:
    return int(math.prod(aval.shape) * aval.dtype.itemsize)


def check_policy_names(jaxpr: Jaxpr, schedule: Schedule) -> None:
    """A ``ScheduleError`` naming the level and the tag when a policy of ``schedule``
    refers to a tag the step (``jaxpr``) does not have."""
    wanted = [(where, policy) for where, policy in schedule.policies() if policy.names]
    if not wanted:
        return
    have = sorted(set(tagged_values(jaxpr)) | _FUNCTION_TAGS.get())
    for where, policy in wanted:  # the builder tags the chunk-boundary carry itself
        missing = [n for n in policy.names if n not in have and n != CARRY_NAME]
        if missing:
            tags = ", ".join(have) if have else "none"
            raise ScheduleError(
                f"{where}: {policy.name} names {', '.join(map(repr, missing))}, which the "
                f"scanned step does not tag (its jax.ad_checkpoint.checkpoint_name tags: {tags}); "
                "name only those tags, or tag the value in the step")


@contextlib.contextmanager
def function_tags(jaxpr: Jaxpr, schedule: Schedule) -> Iterator[None]:
    """While inside, ``check_policy_names`` also accepts every tag of ``jaxpr`` (the
    function ``remat_scans`` evaluates: a tag in another of its scans is not missing)."""
    if not any(policy.names for _, policy in schedule.policies()):
        yield
        return
    token = _FUNCTION_TAGS.set(frozenset(tagged_values(jaxpr)))
    try:
        yield
    finally:
        _FUNCTION_TAGS.reset(token)


def _all_jaxprs(jaxpr: Jaxpr) -> Iterator[Jaxpr]:
    yield jaxpr
    for eqn in jaxpr.eqns:
        for inner in sub_jaxprs(eqn.params):
            yield from _all_jaxprs(inner)


def _tags(jaxpr: Jaxpr) -> list[TaggedValue]:
    """The tags of one jaxpr (not its inner ones), with the matmul FLOPs since the tags
    before them."""
    ancestors: dict[Any, frozenset[int]] = {}  # var -> the dots since the last tags
    flops: dict[int, float] = {}
    out = []
    for i, eqn in enumerate(jaxpr.eqns):
        deps = frozenset().union(*(ancestors.get(v, frozenset()) for v in eqn.invars
                                   if not isinstance(v, Literal)))
        if eqn.primitive.name == _DOT:
            flops[i] = _dot_flops(eqn)
            deps = deps | {i}
        tagged = eqn.primitive.name == CHECKPOINT_NAME
        for v in eqn.outvars:
            ancestors[v] = frozenset() if tagged else deps
        if tagged:
            out.append(TaggedValue(str(eqn.params[CHECKPOINT_NAME_PARAM]),
                                   _bytes(eqn.outvars[0].aval),
                                   sum(flops[j] for j in deps)))
    return out


def _dot_flops(eqn: Any) -> float:
    (contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    return 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
