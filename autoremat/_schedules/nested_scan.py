"""The nested kind's builder: ``lax.scan`` over chunks, bodies under ``jax.checkpoint``.

An outer scan over chunks whose checkpointed body is the inner scan of one
chunk keeps only the carries at chunk boundaries and recomputes one chunk at
a time in the backward pass (Chen et al. 2016, arXiv 1604.06174): ``d``
levels store ``O(d * T^(1/d))`` carries for ``d - 1`` extra forward passes.
Gradients are exact: remat recomputes, it never approximates.

Batch-major data (``axis=1``) is never transposed as a whole: each outer chunk
is sliced straight out of the original array, so the ``T x B x X`` copy that
``nn.scan(in_axes=1)`` makes (128 MB for the seed's input at ``T=10^5``) does
not exist.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from autoremat._schedules.policy import CARRY_NAME, NO_REMAT, Level

PyTree = Any


def nested_scan(
    step: Callable[..., Any],
    init: Any,
    leaves: list[jax.Array],
    axes: list[int],
    pieces: Sequence[tuple[int, int, int]],
    levels: tuple[Level, ...],
    unroll: int | bool,
    reverse: bool,
) -> tuple[Any, PyTree]:
    """Run each ``(start, count, level)`` piece (``nested.pieces``); outputs on axis 0."""
    carry = init
    outs: dict[int, PyTree] = {}
    for start, count, level in reversed(pieces) if reverse else pieces:
        carry, outs[start] = _run_piece(step, carry, leaves, axes, start, count, levels[level:],
                                        unroll, reverse)
    ys_parts = [outs[start] for start, _, _ in pieces]
    if len(ys_parts) == 1:
        return carry, ys_parts[0]
    return carry, jax.tree_util.tree_map(lambda *p: jnp.concatenate(p, axis=0), *ys_parts)


def _names_carry(level: Level) -> bool:
    """The level's policy names the chunk-boundary carry (``policy.CARRY_NAME``)."""
    return any(CARRY_NAME in v for _, v in level.policy.kwargs if isinstance(v, tuple))


def _named(carry: Any, level: Level) -> Any:
    """The carry entering a chunk, named ``CARRY_NAME`` when the level's policy saves or
    offloads it by that name (else as it is)."""
    if not _names_carry(level):
        return carry
    return jax.tree_util.tree_map(lambda c: checkpoint_name(c, CARRY_NAME), carry)


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
    unroll: int | bool,
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
        return _nested(step, _named(c, levels[0]), x_chunk, inner, unroll, reverse)

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
    unroll: int | bool,
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
        return _nested(step, _named(c, head), xs, inner, unroll, reverse)

    carry, ys = lax.scan(_checkpoint(body, head), carry, shaped, length=head.length,
                         reverse=reverse)
    ys = jax.tree_util.tree_map(lambda y: y.reshape((head.length * chunk, *y.shape[2:])), ys)
    return carry, ys
