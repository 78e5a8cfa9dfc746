"""``autoremat.scan``: ``lax.scan`` semantics, a schedule's memory.

Backprop through ``lax.scan`` stores every step's residuals, so memory grows
linearly with the sequence length ``T``. A schedule trades that memory for
recomputation; remat recomputes, it never approximates, so loss and gradients
equal a plain scan's. This module checks the arguments, flattens ``xs`` and
hands the steps to the schedule's kind (``Schedule.run``: ``nested_scan`` or
``binomial_scan``), the one place the builder dispatches.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from jax import lax

from autoremat._errors import ScheduleError
from autoremat._scan.as_tuned import check_stacked, inside_scan, left_scan, warn_options
from autoremat._scan.records import SCAN_RECORDS, ScanRecord
from autoremat._scan.step_trace import checked_step
from autoremat._schedules import plain, read_schedule
from autoremat._schedules.base import Schedule

Carry = TypeVar("Carry")
PyTree = Any


def scan(
    f: Callable[[Carry, Any], tuple[Carry, Any]],
    init: Carry,
    xs: PyTree = None,
    length: int | None = None,
    *,
    schedule: Schedule | str | os.PathLike[str] | None = None,
    reverse: bool = False,
    unroll: int | bool | None = None,
    axis: int = 0,
    out_axis: int | None = None,
) -> tuple[Carry, PyTree]:
    """``jax.lax.scan`` executed with a remat schedule.

    Same semantics as ``lax.scan(f, init, xs, length, reverse, unroll)``:
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
      schedule: the remat schedule, or the path of a schedule file (``autoremat.load_schedule``);
        ``None`` (default): the plain scan (``autoremat.plain``), no remat: the least time,
        memory linear in ``T``.
      reverse: scan from the last step to the first (outputs keep index order).
      unroll: as ``lax.scan``'s (an int, or ``True`` to unroll fully); overrides
        the schedule's ``unroll`` (its innermost loop). ``None``: the schedule's.
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
      >>> sched = autoremat.nested([10, 10])
      >>> c, ys = autoremat.scan(step, 0.0, jnp.ones(100), schedule=sched)
      >>> float(c), ys.shape
      (100.0, (100,))
    """
    if schedule is None:
        schedule = plain(scanned_length(xs, axis, length))
    return scan_axes(f, init, xs, length, schedule=schedule, reverse=reverse, unroll=unroll,
                     in_axes=axis, out_axes=axis if out_axis is None else out_axis)


def nbytes(tree: PyTree) -> int:
    """Bytes of a tree of arrays, tracers or avals (typed PRNG keys too: ``dtype.itemsize``)."""
    return sum(int(x.size) * int(x.dtype.itemsize) for x in jax.tree_util.tree_leaves(tree))


def scan_axes(
    f: Callable[[Carry, Any], tuple[Carry, Any]],
    init: Carry,
    xs: PyTree,
    length: int | None,
    *,
    schedule: Schedule | str | os.PathLike[str],
    reverse: bool = False,
    in_axes: PyTree = 0,
    out_axes: PyTree = 0,
    unroll: int | bool | None = None,
) -> tuple[Carry, PyTree]:
    """``scan`` with a scanned axis per input leaf and per output leaf.

    ``in_axes`` is an int or a prefix tree of ``xs``; ``out_axes`` an int or a
    prefix tree of the step's output ``y``. ``autoremat.linen.scan`` uses this.
    """
    schedule = as_schedule(schedule)
    token = inside_scan()
    if token is None:  # a scan inside another's step: part of that step's program
        return _scan_axes(f, init, xs, length, schedule, reverse, in_axes, out_axes, unroll)[:2]
    records = SCAN_RECORDS.get()
    if records is None:  # the measurement stage compiles with the options itself
        warn_options(schedule)
    try:
        carry, ys, steps = _scan_axes(f, init, xs, length, schedule, reverse, in_axes,
                                      out_axes, unroll)
    finally:
        left_scan(token)
    stacked = nbytes(ys)
    check_stacked(schedule, stacked, steps)
    if records is not None:
        shapes = tuple((tuple(int(d) for d in y.shape), str(y.dtype))
                       for y in jax.tree_util.tree_leaves(ys))
        records.append(ScanRecord(stacked, nbytes(carry), shapes))
    return carry, ys


def _scan_axes(f: Callable[[Carry, Any], tuple[Carry, Any]], init: Carry, xs: PyTree,
               length: int | None, schedule: Schedule, reverse: bool,
               in_axes: PyTree, out_axes: PyTree,
               unroll: int | bool | None) -> tuple[Carry, PyTree, int]:
    """The scan (``scan_axes``) and its number of steps."""
    if not callable(f):  # lax.scan's checks, in lax.scan's order
        raise TypeError(f"lax.scan: f argument should be a callable. (autoremat.scan with "
                        f"schedule {schedule.describe()}, got {type(f).__name__})")
    with_paths = jax.tree_util.tree_leaves_with_path(xs)
    paths = ["xs" + jax.tree_util.keystr(p) for p, _ in with_paths]
    leaves = [jnp.asarray(x) for _, x in with_paths]
    for path, x in zip(paths, leaves, strict=True):
        if x.ndim == 0:
            raise ValueError(f"scan got value with no leading axis to scan over: {path} is a "
                             f"scalar ({jax.typeof(x).str_short()}); give every xs leaf the "
                             "scanned axis, or close over it in the step")
    prefix = _prefix_leaves(in_axes, xs)
    axes = [_normalize_axis(a, x.ndim, "axis", path)
            for a, x, path in zip(prefix, leaves, paths, strict=True)]
    steps = _sequence_length(leaves, axes, length)

    init, forwarded, step = checked_step(f, init, xs, leaves, axes, schedule)
    if unroll is not None:
        schedule = replace(schedule, unroll=_unroll(unroll, steps))
    if steps == 0:
        moved = [jnp.moveaxis(x, a, 0) for x, a in zip(leaves, axes, strict=True)]
        carry, ys = lax.scan(step, init, moved, length=0, reverse=reverse)
        return carry, _move_out(ys, out_axes), steps
    if not any(forwarded):
        carry, ys = schedule.run(step, init, leaves, axes, steps, reverse)
        return carry, _move_out(ys, out_axes), steps
    # Carry leaves the step returns unchanged are forwarded, as lax.scan does:
    # closed over (held once, never in a checkpoint, never stacked or batched).
    init_leaves, init_def = jax.tree_util.tree_flatten(init)

    def full(kept: Sequence[Any]) -> Carry:
        it = iter(kept)
        return jax.tree_util.tree_unflatten(
            init_def, [v if f else next(it) for v, f in zip(init_leaves, forwarded, strict=True)])

    def moving(carry: Carry) -> list[Any]:
        return [v for v, f in zip(jax.tree_util.tree_leaves(carry), forwarded, strict=True)
                if not f]

    def inner(kept: list[Any], x_leaves: Sequence[jax.Array]) -> tuple[list[Any], PyTree]:
        carry, y = step(full(kept), x_leaves)
        return moving(carry), y

    kept, ys = schedule.run(inner, moving(init), leaves, axes, steps, reverse)
    return full(kept), _move_out(ys, out_axes), steps


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


def _normalize_axis(axis: Any, ndim: int, name: str, what: str = "an input") -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ValueError(f"{name}: expected an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: {axis} is out of range for {what} of rank {ndim}")
    return axis % ndim


def _sequence_length(leaves: list[jax.Array], axes: list[int], length: int | None) -> int:
    sizes = {jnp.shape(x)[a] for x, a in zip(leaves, axes, strict=True)}
    if len(sizes) > 1:
        raise ValueError(
            "scan got values with different leading axis sizes: "
            f"{', '.join(str(jnp.shape(x)[a]) for x, a in zip(leaves, axes, strict=True))}. "
            "(xs: every input must have the same size along the scanned axis)")
    if length is not None:
        given = length
        length = _concrete_int(length, "length", "`int`", ValueError)
        if isinstance(given, bool) or length < 0:
            raise ValueError(f"length: expected a non-negative int, got {length!r}")
        if sizes and sizes != {length}:
            raise ValueError(
                f"scan got `length` argument of {length} which disagrees with leading axis "
                f"sizes {[jnp.shape(x)[a] for x, a in zip(leaves, axes, strict=True)]}.")
        return length
    if not sizes:
        raise ValueError("scan got no values to scan over and `length` not provided. "
                         "(length: give it when xs is None or has no leaves)")
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


def _concrete_int(value: Any, name: str, expected: str,
                  error: type[Exception] = TypeError) -> int:
    """``value`` as a Python int; a traced value is a ``ConcretizationTypeError`` (as in lax.scan)."""
    if isinstance(value, jax.core.Tracer):
        raise jax.errors.ConcretizationTypeError(
            value, f"The `{name}` argument to `scan` expects a concrete {expected} value. "
            "(autoremat plans a schedule for a static T; for a dynamic length use "
            "lax.while_loop.)")
    try:
        return operator.index(value)
    except TypeError:
        raise error(f"{name}: expected {expected}, got {value!r} ({type(value).__name__})") from None


def _unroll(unroll: Any, steps: int) -> int:
    """``lax.scan``'s ``unroll`` (``True``: all ``steps``) as the schedule's ``unroll``."""
    value = _concrete_int(unroll, "unroll", "`int` or `bool`")
    if isinstance(unroll, bool):
        value = steps if unroll else 1
    if value < 0:
        raise ValueError(f"unroll: `unroll` must be a `bool` or a non-negative `int`, got {value}")
    return max(1, min(value, steps))


def as_schedule(schedule: Any) -> Schedule:
    """``schedule`` itself, or the schedule file at that path (the front ends' ``schedule=``)."""
    if isinstance(schedule, Schedule):
        return schedule
    if isinstance(schedule, (str, os.PathLike)):
        return read_schedule(schedule)
    raise ScheduleError(
        "schedule: expected an autoremat.Schedule or the path of a schedule file, got "
        f"{type(schedule).__name__}"
    )


def scanned_length(scanned_args: PyTree, arg_axes: PyTree, length: int | None) -> int:
    """The scan's length from its inputs' scanned axes (``in_axes`` prefix tree) and ``length``."""
    leaves = jax.tree_util.tree_leaves(scanned_args)
    axes = [
        _normalize_axis(a, jnp.ndim(x), "in_axes")
        for x, a in zip(leaves, _prefix_leaves(arg_axes, scanned_args), strict=True)
    ]
    return _sequence_length(leaves, axes, length)


def first_step(xs: PyTree, xs_axes: PyTree) -> PyTree:
    """The inputs of step 0: every leaf indexed at 0 along its scanned axis."""
    leaves, treedef = jax.tree_util.tree_flatten(xs)
    axes = _prefix_leaves(xs_axes, xs)
    firsts = [
        lax.index_in_dim(x, 0, _normalize_axis(a, jnp.ndim(x), "in_axes"), keepdims=False)
        for x, a in zip(leaves, axes, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, firsts)
