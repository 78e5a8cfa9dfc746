"""``autoremat.scan``: ``lax.scan`` semantics, a schedule's memory.

Backprop through ``lax.scan`` stores every step's residuals, so memory grows
linearly with the sequence length ``T``. A schedule trades that memory for
recomputation; remat recomputes, it never approximates, so loss and gradients
equal a plain scan's. This module checks the arguments, flattens ``xs`` and
hands the steps to the schedule's kind (``Schedule.run``: ``_nested_scan`` or
``_binomial_scan``), the one place the builder dispatches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from jax import lax

from autoremat._schedule import Schedule, ScheduleError

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

    carry, ys = schedule.run(step, init, leaves, axes, steps, reverse)
    return carry, _move_out(ys, out_axes)


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
