"""Per-primitive rules: is an equation on time-stacked operands the same computation per step?

``remat_scans`` moves the readout and the loss that follow a long scan into
the scanned step (``fuse_readout``). An equation can move only when it acts
on each time step independently. ``per_step(eqn, axes)`` decides that for one
equation, given the time axis of each operand that is stacked along time
(``None``: the operand does not come from the scan). It returns a ``PerStep``
-- the equation's parameters with the time axis removed, the time axis of its
outputs, and how every other operand is read inside the step -- or a string
saying why the equation mixes time steps.

The rules are exact re-indexings (no approximation): elementwise operations
(``add``, ``sub``, ``integer_pow``, ``select_n``, ...), ``dot_general`` that
contracts a non-time axis (a ``Dense``), ``transpose``/``reshape``/
``broadcast_in_dim``/``squeeze`` that keep time one axis, reductions over
other axes, and ``gather`` that treats time as a batch or a full-slice axis.
``reduce_sum`` over the time axis (and a ``dot_general`` contracting time
with an operand stacked along time) is a *time reduction*: per step it is the
same reduction over the other axes, and the steps' results are added up in
the scan's carry. Anything else is left as written by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from autoremat import _jax as ji

#: Operand modes inside the step.
STEP = "step"  # a value computed in the step (stacked along time outside)
CONST = "const"  # loop-invariant, read as it is
SQUEEZE = "squeeze"  # loop-invariant with a size-1 time axis: squeezed once
ALIGNED = "aligned"  # not from the scan but stacked along time (targets, a mask): sliced
SPLAT = "splat"  # a broadcast of a loop-invariant scalar along time: made per step instead

ELEMENTWISE = frozenset({
    "abs", "acos", "acosh", "add", "and", "asin", "asinh", "atan", "atan2", "atanh", "cbrt",
    "ceil", "clamp", "complex", "conj", "convert_element_type", "copy", "copy_p", "cos", "cosh",
    "digamma", "div", "eq", "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "ge",
    "gt", "imag", "integer_pow", "is_finite", "le", "lgamma", "log", "log1p", "logistic", "lt",
    "max", "min", "mul", "ne", "neg", "nextafter", "not", "or", "pow", "real", "reciprocal",
    "reduce_precision", "rem", "round", "rsqrt", "select_n", "sign", "sin", "sinh", "sqrt",
    "square", "stop_gradient", "sub", "tan", "tanh", "xor", "shift_left",
    "shift_right_arithmetic", "shift_right_logical", "population_count",
})
PER_STEP_REDUCTIONS = frozenset(
    ["reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "argmax", "argmin"])


@dataclass(frozen=True)
class Operand:
    """How one operand is read inside the step: ``mode`` and, for ``squeeze``/``aligned``/
    ``splat``, its time axis outside; for ``splat``, the scalar broadcast (``source``)."""

    mode: str
    axis: int | None = None
    source: Any = None


@dataclass(frozen=True)
class PerStep:
    """One equation run per step.

    Attributes:
      params: the equation's parameters for one step's operands.
      out_axes: per output, its time axis outside; ``None`` for a time reduction
        (the step's result is added into an accumulator).
      operands: per operand, how the step reads it.
      identity: the per-step equation does nothing (a reduction over time only):
        its one step operand is its result.
      call: for a ``jit`` or ``custom_jvp`` call, how its body runs per step
        (``fuse_calls.Call``); the equation is then not re-bound.
    """

    params: Mapping[str, Any]
    out_axes: tuple[int | None, ...]
    operands: tuple[Operand, ...]
    identity: bool = False
    call: Any = None

    @property
    def reduces_time(self) -> bool:
        return self.out_axes == (None,)


def _drop(dims: Sequence[int], k: int) -> tuple[int, ...]:
    """``dims`` without ``k``, the ones above it renumbered (axis ``k`` removed)."""
    return tuple(int(d) - (d > k) for d in dims if d != k)


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(getattr(v.aval, "shape", ()))


CUMULATIVE = frozenset(["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"])


def per_step(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    """``eqn`` per time step, given its operands' time axes (``None``: not from the scan);
    a string saying why it is not separable in time otherwise."""
    name = eqn.primitive.name
    if name in ELEMENTWISE:
        return _elementwise(eqn, axes)
    if name in CUMULATIVE:
        return _cumulative(eqn, axes)
    rule = _RULES.get(name)
    if rule is None:
        return f"{name} is not known to act on each time step separately"
    return rule(eqn, axes)


def with_splats(rule: PerStep, eqn: Any, producer: Mapping[Any, Any]) -> PerStep:
    """``rule`` with each aligned operand that is a broadcast of a scalar (``zeros_like``,
    ``full``) made per step from the scalar instead of sliced from a ``T``-long array."""
    operands = []
    for v, o in zip(eqn.invars, rule.operands, strict=True):
        made = producer.get(v) if o.mode == ALIGNED and not isinstance(v, ji.Literal) else None
        if (made is not None and made.primitive.name == "broadcast_in_dim"
                and len(made.invars) == 1 and not _shape(made.invars[0])):
            o = Operand(SPLAT, o.axis, made.invars[0])
        operands.append(o)
    return PerStep(rule.params, rule.out_axes, tuple(operands), rule.identity, rule.call)


def _cumulative(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    (k,) = axes
    assert k is not None
    axis = int(eqn.params["axis"])
    if axis == k:
        return f"{eqn.primitive.name} over the time axis mixes time steps"
    return PerStep({**eqn.params, "axis": axis - (axis > k)}, (k,), (Operand(STEP),))


def _slice(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    (k,) = axes
    assert k is not None
    start, limit = tuple(eqn.params["start_indices"]), tuple(eqn.params["limit_indices"])
    strides = eqn.params.get("strides")
    size = _shape(eqn.invars[0])[k]
    if start[k] != 0 or limit[k] != size or (strides is not None and strides[k] != 1):
        return "slice takes some of the time steps (not each step separately)"
    drop = lambda t: None if t is None else tuple(t[:k]) + tuple(t[k + 1:])  # noqa: E731
    return PerStep({**eqn.params, "start_indices": drop(start), "limit_indices": drop(limit),
                    "strides": drop(strides)}, (k,), (Operand(STEP),))


def _concatenate(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    stacked = {a for a in axes if a is not None}
    if len(stacked) != 1:
        return "concatenate combines operands stacked along different axes"
    (k,) = stacked
    dim = int(eqn.params["dimension"])
    if dim == k:
        return "concatenate along the time axis"
    operands = tuple(Operand(STEP) if a is not None else Operand(ALIGNED, k) for a in axes)
    return PerStep({**eqn.params, "dimension": dim - (dim > k)}, (k,), operands)


def _others(eqn: Any, axes: Sequence[int | None], k: int, size: int) -> tuple[Operand, ...] | str:
    """Operands of an elementwise equation: stacked ones, scalars, aligned or size-1 ones."""
    rank = len(_shape(eqn.invars[[a is not None for a in axes].index(True)]))
    out = []
    for v, a in zip(eqn.invars, axes, strict=True):
        shape = _shape(v)
        if a is not None:
            out.append(Operand(STEP))
        elif not shape:
            out.append(Operand(CONST))
        elif len(shape) != rank:
            return f"{eqn.primitive.name} broadcasts operands of different ranks"
        elif shape[k] == size:
            out.append(Operand(ALIGNED, k))
        elif shape[k] == 1:
            out.append(Operand(SQUEEZE, k))
        else:
            return f"{eqn.primitive.name}: an operand has {shape[k]} steps, not {size}"
    return tuple(out)


def _elementwise(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    stacked = {a for a in axes if a is not None}
    if len(stacked) != 1:
        return f"{eqn.primitive.name} combines operands stacked along different axes"
    (k,) = stacked
    size = _shape(eqn.invars[list(axes).index(k)])[k]
    operands = _others(eqn, axes, k, size)
    if isinstance(operands, str):
        return operands
    return PerStep(dict(eqn.params), (k,) * len(eqn.outvars), operands)


def _dot_general(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lc, rc, lb, rb = (tuple(int(d) for d in x) for x in (lc, rc, lb, rb))
    ka, kb = axes
    shapes = [_shape(v) for v in eqn.invars]
    if ka is None or kb is None:  # one operand stacked: which one, and its partner's axis
        side = 0 if ka is not None else 1
        k = ka if ka is not None else kb
        assert k is not None
        mine_c, other_c = (lc, rc) if side == 0 else (rc, lc)
        mine_b, other_b = (lb, rb) if side == 0 else (rb, lb)
        if k in mine_c:
            j = other_c[mine_c.index(k)]
        elif k in mine_b:
            j = other_b[mine_b.index(k)]
        else:
            j = None
        if j is not None and shapes[1 - side][j] != shapes[side][k]:
            return "dot_general pairs the time axis with an axis of another length"
        ka, kb = (k, j) if side == 0 else (j, k)
        operands = tuple(Operand(STEP) if s == side
                         else Operand(CONST) if j is None else Operand(ALIGNED, j)
                         for s in (0, 1))
    else:
        operands = (Operand(STEP), Operand(STEP))
    if ka is not None and kb is not None:
        if ka in lc and rc[lc.index(ka)] == kb:
            i, out = lc.index(ka), None  # contracts time with time: a time reduction
            lc, rc = lc[:i] + lc[i + 1:], rc[:i] + rc[i + 1:]
        elif ka in lb and rb[lb.index(ka)] == kb:
            i = lb.index(ka)
            out = i
            lb, rb = lb[:i] + lb[i + 1:], rb[:i] + rb[i + 1:]
        else:
            return ("dot_general pairs each step with every other step (attention-like: it "
                    "mixes time steps)")
        dims = ((_drop(lc, ka), _drop(rc, kb)), (_drop(lb, ka), _drop(rb, kb)))
    elif ka is not None:
        if ka in lc or ka in lb:
            return "dot_general contracts the time axis with a loop-invariant operand"
        free = [d for d in range(len(shapes[0])) if d not in lc and d not in lb]
        out = len(lb) + free.index(ka)
        dims = ((_drop(lc, ka), rc), (_drop(lb, ka), rb))
    else:
        assert kb is not None
        if kb in rc or kb in rb:
            return "dot_general contracts the time axis with a loop-invariant operand"
        lfree = [d for d in range(len(shapes[0])) if d not in lc and d not in lb]
        rfree = [d for d in range(len(shapes[1])) if d not in rc and d not in rb]
        out = len(lb) + len(lfree) + rfree.index(kb)
        dims = ((lc, _drop(rc, kb)), (lb, _drop(rb, kb)))
    return PerStep({**eqn.params, "dimension_numbers": dims}, (out,), operands)


def _transpose(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    (k,) = axes
    assert k is not None
    perm = tuple(int(p) for p in eqn.params["permutation"])
    return PerStep({**eqn.params, "permutation": _drop(perm, k)}, (perm.index(k),),
                   (Operand(STEP),))


def _broadcast_in_dim(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    if len(eqn.invars) != 1:
        return "broadcast_in_dim with dynamic shapes"
    (k,) = axes
    assert k is not None
    dims = tuple(int(d) for d in eqn.params["broadcast_dimensions"])
    j = dims[k]
    shape = tuple(eqn.params["shape"])
    new_dims = tuple(d - (d > j) for i, d in enumerate(dims) if i != k)
    return PerStep({**eqn.params, "shape": shape[:j] + shape[j + 1:],
                    "broadcast_dimensions": new_dims}, (j,), (Operand(STEP),))


def _reshape(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    (k,) = axes[:1]
    assert k is not None
    if len(eqn.invars) != 1 or eqn.params.get("dimensions") is not None:
        return "reshape with dynamic shapes or a dimension order"
    old, new = _shape(eqn.invars[0]), tuple(int(n) for n in eqn.params["new_sizes"])
    before, after = prod(old[:k]), prod(old[k + 1:])
    for j in range(len(new)):
        if new[j] == old[k] and prod(new[:j]) == before and prod(new[j + 1:]) == after:
            return PerStep({**eqn.params, "new_sizes": new[:j] + new[j + 1:]}, (j,),
                           (Operand(STEP),))
    return "reshape merges the time axis with another axis"


def _squeeze(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    (k,) = axes
    assert k is not None
    dims = tuple(int(d) for d in eqn.params["dimensions"])
    if k in dims:
        return "squeeze removes the time axis"
    return PerStep({**eqn.params, "dimensions": _drop(dims, k)},
                   (k - sum(d < k for d in dims),), (Operand(STEP),))


def _reduce(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    (k,) = axes
    assert k is not None
    dims = tuple(int(d) for d in eqn.params["axes"])
    name = eqn.primitive.name
    if k not in dims:
        return PerStep({**eqn.params, "axes": _drop(dims, k)},
                       (k - sum(d < k for d in dims),), (Operand(STEP),))
    if name != "reduce_sum":
        return f"{name} over the time axis (only a sum over time is accumulated in the carry)"
    rest = _drop(dims, k)
    return PerStep({**eqn.params, "axes": rest}, (None,), (Operand(STEP),), identity=not rest)


def _gather(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    ko, ki = axes
    if ko is None:
        return "gather indexes a loop-invariant array with per-step indices"
    dn = eqn.params["dimension_numbers"]
    slices = tuple(int(s) for s in eqn.params["slice_sizes"])
    op_shape, idx_shape, out_rank = _shape(eqn.invars[0]), _shape(eqn.invars[1]), len(
        _shape(eqn.outvars[0]))
    op_b = tuple(dn.operand_batching_dims)
    idx_b = tuple(dn.start_indices_batching_dims)
    offset = tuple(int(d) for d in dn.offset_dims)
    if ko in dn.start_index_map or ko in dn.collapsed_slice_dims:
        return "gather indexes along the time axis"
    if ko in op_b:  # time is a batch axis of operand and indices (take_along_axis)
        p = op_b.index(ko)
        j = int(idx_b[p])
        if ki is not None and ki != j:
            return "gather's indices are stacked along another axis than its operand"
        batch_out = [d for d in range(out_rank) if d not in offset]
        out = batch_out[j]
        new = dn._replace(
            offset_dims=_drop(offset, out),
            collapsed_slice_dims=_drop(dn.collapsed_slice_dims, ko),
            start_index_map=_drop(dn.start_index_map, ko),
            operand_batching_dims=_drop(op_b[:p] + op_b[p + 1:], ko),
            start_indices_batching_dims=_drop(idx_b[:p] + idx_b[p + 1:], j))
        idx = Operand(STEP) if ki is not None else Operand(ALIGNED, j)
        if idx_shape[j] != op_shape[ko]:
            return "gather's indices have another number of steps"
    else:  # time is a sliced axis taken whole; the indices do not depend on time
        if ki is not None or slices[ko] != op_shape[ko]:
            return "gather takes part of the time axis"
        kept = [d for d in range(len(op_shape)) if d not in dn.collapsed_slice_dims
                and d not in op_b]
        out = offset[kept.index(ko)]
        new = dn._replace(
            offset_dims=_drop(offset, out),
            collapsed_slice_dims=_drop(dn.collapsed_slice_dims, ko),
            start_index_map=_drop(dn.start_index_map, ko),
            operand_batching_dims=_drop(op_b, ko))
        idx = Operand(CONST)
    return PerStep({**eqn.params, "dimension_numbers": new,
                    "slice_sizes": slices[:ko] + slices[ko + 1:]}, (out,),
                   (Operand(STEP), idx))


_RULES: dict[str, Any] = {
    "dot_general": _dot_general,
    "transpose": _transpose,
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "squeeze": _squeeze,
    "gather": _gather,
    "slice": _slice,
    "concatenate": _concatenate,
    **{name: _reduce for name in PER_STEP_REDUCTIONS},
}
