"""The scan builder: ``lax.scan`` semantics, a schedule's memory.

Backprop through ``lax.scan`` stores every step's residuals, so memory grows
linearly with the sequence length ``T``. Wrapping the whole loop in
``jax.checkpoint`` saves nothing, and remat of each step saves a constant
factor. Nesting does better (Chen et al. 2016, "Training Deep Nets with
Sublinear Memory Cost", arXiv 1604.06174): an outer scan over chunks whose
body -- the inner scan of one chunk -- is checkpointed keeps only the carries
at chunk boundaries, and recomputes one chunk at a time in the backward pass.
With ``d`` levels memory is ``O(d * T^(1/d))`` for ``d - 1`` extra forward
passes. Gradients are exact: remat recomputes, it never approximates.

Batch-major data (``axis=1``) is never transposed as a whole: each outer chunk
is sliced straight out of the original array, so the ``T x B x X`` copy that
``nn.scan(in_axes=1)`` makes (128 MB for the seed's input at ``T=10^5``) does
not exist.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from jax import lax

from autoremat._schedule import NO_REMAT, Level, Schedule, ScheduleError
from autoremat._schedule import pieces as _split

Carry = TypeVar("Carry")
PyTree = Any


def scan(
    f: Callable[[Carry, Any], tuple[Carry, Any]],
    init: Carry,
    xs: PyTree = None,
    length: int | None = None,
    *,
    schedule: Schedule,
    reverse: bool = False,
    axis: int = 0,
    out_axis: int | None = None,
) -> tuple[Carry, PyTree]:
    """``jax.lax.scan`` executed with a remat schedule.

    Same semantics as ``lax.scan(f, init, xs, length, reverse=reverse)``:
    ``f(carry, x) -> (carry, y)`` with pytree carry, pytree ``xs`` (or ``None``
    with ``length``), outputs stacked along the scanned axis. Loss and
    gradients equal a plain scan's (remat recomputes, it never approximates);
    only memory and time differ. See ``autoremat.Schedule`` for how the levels
    are run and how a schedule adapts to any ``T``.

    Args:
      f: the step.
      init: the initial carry.
      xs: the scanned inputs, or ``None``.
      length: the number of steps; required when ``xs`` is ``None``.
      schedule: the remat schedule (``autoremat.load_schedule`` reads one).
      reverse: scan from the last step to the first (outputs keep index order).
      axis: the axis of every ``xs`` leaf that is scanned, and the axis along
        which outputs are stacked. ``axis=1`` scans batch-major ``(B, T, ...)``
        data without a transposed copy of the whole sequence.
      out_axis: stack outputs along this axis instead of ``axis``. With
        batch-major inputs, ``axis=1, out_axis=0`` keeps the stacked outputs
        time-major, which avoids transposing a ``T x B x H`` stack (and its
        cotangent) when the consumer does not care about the layout.

    Returns:
      ``(final_carry, ys)`` like ``lax.scan``.

    Example:
      >>> import jax.numpy as jnp, autoremat
      >>> step = lambda c, x: (c + x, c * x)
      >>> sched = autoremat.Schedule.nested([10, 10])
      >>> c, ys = autoremat.scan(step, 0.0, jnp.ones(100), schedule=sched)
      >>> float(c), ys.shape
      (100.0, (100,))
    """
    return scan_axes(f, init, xs, length, schedule=schedule, reverse=reverse,
                     in_axes=axis, out_axes=axis if out_axis is None else out_axis)


def scan_axes(
    f: Callable[[Carry, Any], tuple[Carry, Any]],
    init: Carry,
    xs: PyTree,
    length: int | None,
    *,
    schedule: Schedule,
    reverse: bool = False,
    in_axes: PyTree = 0,
    out_axes: PyTree = 0,
) -> tuple[Carry, PyTree]:
    """``scan`` with a scanned axis per input leaf and per output leaf.

    ``in_axes`` is an int or a prefix tree of ``xs``; ``out_axes`` an int or a
    prefix tree of the step's output ``y``. ``autoremat.linen.scan`` uses this.
    """
    if not isinstance(schedule, Schedule):
        raise ScheduleError(
            f"schedule: expected an autoremat.Schedule (see autoremat.load_schedule), "
            f"got {type(schedule).__name__}"
        )
    leaves, treedef = jax.tree_util.tree_flatten(xs)
    leaves = [jnp.asarray(x) for x in leaves]
    prefix = _prefix_leaves(in_axes, xs)
    axes = [_normalize_axis(a, x.ndim, "axis") for a, x in zip(prefix, leaves, strict=True)]
    steps = _sequence_length(leaves, axes, length)

    def step(carry: Carry, x_leaves: Sequence[jax.Array]) -> tuple[Carry, PyTree]:
        return f(carry, jax.tree_util.tree_unflatten(treedef, list(x_leaves)))

    if steps == 0:
        moved = [jnp.moveaxis(x, a, 0) for x, a in zip(leaves, axes, strict=True)]
        carry, ys = lax.scan(step, init, moved, length=0, reverse=reverse)
        return carry, _move_out(ys, out_axes)

    if schedule.kind == "binomial":
        from autoremat._binomial import binomial_scan

        carry, ys = binomial_scan(step, init, leaves, axes, steps, schedule.snapshots,
                                  reverse, schedule.unroll)
        return carry, _move_out(ys, out_axes)
    pieces = _split(steps, schedule.lengths)
    order = reversed(pieces) if reverse else pieces
    carry = init
    outs: dict[int, PyTree] = {}
    for start, count, level in order:
        carry, outs[start] = _run_piece(
            step, carry, leaves, axes, start, count, schedule.levels[level:],
            schedule.unroll, reverse,
        )
    ys_parts = [outs[start] for start, _, _ in pieces]
    if len(ys_parts) == 1:
        ys = ys_parts[0]
    else:
        ys = jax.tree_util.tree_map(lambda *p: jnp.concatenate(p, axis=0), *ys_parts)
    return carry, _move_out(ys, out_axes)


def _checkpoint(fn: Callable[..., Any], level: Level) -> Callable[..., Any]:
    if level.policy.name == NO_REMAT:
        return fn
    # prevent_cse=False is safe (and faster) because every body is inside a scan.
    return jax.checkpoint(fn, policy=level.policy.resolve(), prevent_cse=False)


def _run_piece(
    step: Callable[..., Any],
    carry: Any,
    leaves: list[jax.Array],
    axes: list[int],
    start: int,
    count: int,
    levels: tuple[Level, ...],
    unroll: int,
    reverse: bool,
) -> tuple[Any, PyTree]:
    """Scan ``count`` chunks of ``levels[0]`` starting at step ``start``.

    Leaves scanned along axis 0 are reshaped to ``(count, chunk, ...)`` and fed
    to ``lax.scan`` (a free reshape). Leaves scanned along another axis are
    closed over and each chunk is sliced out in the body, so no transposed copy
    of the whole sequence is made; only a chunk is moved to axis 0.
    """
    inner = levels[1:]
    chunk = math.prod(lv.length for lv in inner)
    lead = [i for i, a in enumerate(axes) if a == 0]
    lead_xs = [
        lax.slice_in_dim(leaves[i], start, start + count * chunk, axis=0).reshape(
            (count, chunk, *leaves[i].shape[1:]) if inner else (count, *leaves[i].shape[1:])
        )
        for i in lead
    ]
    other = [i for i, a in enumerate(axes) if a != 0]
    other_xs = [leaves[i] for i in other]

    def body(c: Any, xs: tuple[jax.Array, list[jax.Array]]) -> tuple[Any, PyTree]:
        index, lead_chunk = xs
        offset = start + index * chunk
        x_chunk: list[Any] = [None] * len(leaves)
        for i, x in zip(lead, lead_chunk, strict=True):
            x_chunk[i] = x
        for i, x in zip(other, other_xs, strict=True):
            if inner:
                piece = lax.dynamic_slice_in_dim(x, offset, chunk, axis=axes[i])
                x_chunk[i] = jnp.moveaxis(piece, axes[i], 0)
            else:
                x_chunk[i] = lax.dynamic_index_in_dim(x, offset, axes[i], keepdims=False)
        if not inner:
            return step(c, x_chunk)
        return _nested(step, c, x_chunk, inner, unroll, reverse)

    body = _checkpoint(body, levels[0])
    indices = jnp.arange(count, dtype=jnp.int32)
    carry, ys = lax.scan(body, carry, (indices, lead_xs), reverse=reverse,
                         unroll=1 if inner else unroll)
    if inner:
        ys = jax.tree_util.tree_map(lambda y: y.reshape((count * chunk, *y.shape[2:])), ys)
    return carry, ys


def _nested(
    step: Callable[..., Any],
    carry: Any,
    x_leaves: list[jax.Array],
    levels: tuple[Level, ...],
    unroll: int,
    reverse: bool,
) -> tuple[Any, PyTree]:
    """Scan exactly ``prod(levels)`` steps of axis-0 inputs, nested by level."""
    head, inner = levels[0], levels[1:]
    if not inner:
        return lax.scan(_checkpoint(step, head), carry, x_leaves, length=head.length,
                        reverse=reverse, unroll=unroll)
    chunk = math.prod(lv.length for lv in inner)
    shaped = [x.reshape((head.length, chunk, *x.shape[1:])) for x in x_leaves]

    def body(c: Any, xs: list[jax.Array]) -> tuple[Any, PyTree]:
        return _nested(step, c, xs, inner, unroll, reverse)

    carry, ys = lax.scan(_checkpoint(body, head), carry, shaped, length=head.length,
                         reverse=reverse)
    ys = jax.tree_util.tree_map(lambda y: y.reshape((head.length * chunk, *y.shape[2:])), ys)
    return carry, ys


def _prefix_leaves(axes: PyTree, tree: PyTree) -> list[Any]:
    """The axis of every leaf of ``tree``, given a prefix tree (or int) ``axes``."""
    if isinstance(axes, int):
        return [axes] * len(jax.tree_util.tree_leaves(tree))
    try:
        expanded = jax.tree_util.tree_map(
            lambda a, sub: jax.tree_util.tree_map(lambda _: a, sub), axes, tree,
            is_leaf=lambda x: x is None,
        )
    except ValueError as e:
        raise ValueError(f"axis: must be an int or a prefix tree of xs ({e})") from None
    return jax.tree_util.tree_leaves(expanded)


def _normalize_axis(axis: Any, ndim: int, name: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ValueError(f"{name}: expected an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: {axis} is out of range for an input of rank {ndim}")
    return axis % ndim


def _sequence_length(leaves: list[jax.Array], axes: list[int], length: int | None) -> int:
    sizes = {jnp.shape(x)[a] for x, a in zip(leaves, axes, strict=True)}
    if len(sizes) > 1:
        raise ValueError(
            f"xs: every input must have the same size along the scanned axis, got "
            f"{sorted(sizes)}"
        )
    if length is not None:
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"length: expected a non-negative int, got {length!r}")
        if sizes and sizes != {length}:
            raise ValueError(f"length: {length} does not match the inputs' length {sizes.pop()}")
        return length
    if not sizes:
        raise ValueError("length: must be given when xs is None or has no leaves")
    return sizes.pop()


def _move_out(ys: PyTree, out_axes: PyTree) -> PyTree:
    if isinstance(out_axes, int) and out_axes == 0:
        return ys
    leaves, treedef = jax.tree_util.tree_flatten(ys)
    axes = _prefix_leaves(out_axes, ys)
    moved = []
    for y, a in zip(leaves, axes, strict=True):
        if not -y.ndim <= a < y.ndim:
            raise ValueError(
                f"axis: cannot stack per-step outputs of shape {y.shape[1:]} along axis {a}; "
                "return outputs with that axis or scan with axis=0"
            )
        moved.append(jnp.moveaxis(y, 0, a % y.ndim))
    return jax.tree_util.tree_unflatten(treedef, moved)
