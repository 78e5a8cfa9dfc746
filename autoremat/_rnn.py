"""``nn.RNN`` / ``nnx.RNN`` with a remat schedule: the shared steps, and the linen one.

Both originals scan a cell over the time axis with one ``lax.scan`` (memory
linear in ``T``); these run that scan under a schedule instead
(``autoremat.linen.scan`` / ``autoremat.nnx.scan``), so the residuals kept
for the backward pass shrink to the schedule's (``O(d * T^(1/d))`` carries
for ``d`` nested levels; Chen et al. 2016, arXiv 1604.06174) at the cost of
recomputing the forward pass. Everything around the scan -- reversing padded
sequences, ``keep_order``, picking each sequence's last carry with
``seq_lengths`` -- is done exactly as the originals do it.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.recurrent import flip_sequences

PyTree = Any


def time_axis(inputs: jax.Array, num_feature_axes: int, time_major: bool) -> tuple[int, int]:
    """The time axis of ``inputs`` and the number of batch axes (as the originals)."""
    axis = 0 if time_major else inputs.ndim - (num_feature_axes + 1)
    if axis < 0:
        axis += inputs.ndim
    batch = inputs.ndim - 1 - num_feature_axes
    return axis, batch


def flip(tree: PyTree, seq_lengths: jax.Array | None, num_batch_dims: int,
         time_major: bool) -> PyTree:
    """Reverse each sequence in time, keeping padding at the end."""
    return jax.tree_util.tree_map(
        lambda x: flip_sequences(x, seq_lengths, num_batch_dims=num_batch_dims,
                                 time_major=time_major), tree)


def finish(scan_output: Any, *, seq_lengths: jax.Array | None, slice_carry: bool,
           return_carry: bool, reverse: bool, keep_order: bool, num_batch_dims: int,
           time_major: bool) -> Any:
    """From the scan's output to the RNN's: the last valid carry, the outputs' order."""
    if slice_carry:
        assert seq_lengths is not None
        _, (carries, outputs) = scan_output
        last = seq_lengths - 1
        carry = jax.tree_util.tree_map(lambda x: x[last, jnp.arange(x.shape[1])], carries)
    else:
        carry, outputs = scan_output
    if reverse and keep_order:
        outputs = flip(outputs, seq_lengths, num_batch_dims, time_major)
    return (carry, outputs) if return_carry else outputs


def scan_body(slice_carry: bool) -> Any:
    """The per-step function: the cell, and with ``slice_carry`` every carry as output."""

    def step(cell: Any, carry: PyTree, x: jax.Array) -> tuple[PyTree, Any]:
        carry, y = cell(carry, x)
        return (carry, (carry, y)) if slice_carry else (carry, y)

    return step


class RNN(nn.RNN):
    """``flax.linen.RNN`` with its scan run under a remat schedule.

    The same attributes and call arguments as ``nn.RNN`` (``time_major``,
    ``return_carry``, ``reverse``, ``keep_order``, ``variable_axes``,
    ``variable_broadcast``, ``variable_carry``, ``split_rngs``; ``initial_carry``,
    ``init_key``, ``seq_lengths``), the same parameter tree, outputs and
    gradients, plus ``schedule`` (an ``autoremat.Schedule`` or the path of a
    schedule file). It works inside ``nn.Bidirectional``. ``unroll`` defaults
    to ``schedule.unroll``.

    Example::

        rnn = autoremat.linen.RNN(nn.OptimizedLSTMCell(128), schedule=schedule)

    With ``seq_lengths`` and ``return_carry=True`` every step's carry is
    stacked to pick each sequence's last one, as ``nn.RNN`` does (``T`` carries
    of memory on top of the schedule's).
    """

    schedule: Any = None
    unroll: int | None = None  # type: ignore[assignment]

    def __call__(  # type: ignore[override]
        self,
        inputs: jax.Array,
        *,
        initial_carry: PyTree | None = None,
        init_key: jax.Array | None = None,
        seq_lengths: jax.Array | None = None,
        return_carry: bool | None = None,
        time_major: bool | None = None,
        reverse: bool | None = None,
        keep_order: bool | None = None,
    ) -> Any:
        from autoremat.linen import scan

        if self.schedule is None:
            raise TypeError("autoremat.linen.RNN: missing the schedule= argument "
                            "(an autoremat.Schedule or a schedule file)")
        return_carry = self.return_carry if return_carry is None else return_carry
        time_major = self.time_major if time_major is None else time_major
        reverse = self.reverse if reverse is None else reverse
        keep_order = self.keep_order if keep_order is None else keep_order
        axis, nbatch = time_axis(inputs, self.cell.num_feature_axes, time_major)
        if reverse:
            inputs = flip(inputs, seq_lengths, nbatch, time_major)
        if initial_carry is None:
            key = jax.random.key(0) if init_key is None else init_key
            initial_carry = self.cell.initialize_carry(
                key, inputs.shape[:axis] + inputs.shape[axis + 1:])
        slice_carry = seq_lengths is not None and return_carry
        scanned = scan(
            scan_body(slice_carry), schedule=self.schedule, unroll=self.unroll,
            in_axes=axis, out_axes=(0, axis) if slice_carry else axis,
            variable_axes=self.variable_axes, variable_broadcast=self.variable_broadcast,
            variable_carry=self.variable_carry, split_rngs=self.split_rngs,
        )
        return finish(scanned(self.cell, initial_carry, inputs), seq_lengths=seq_lengths,
                      slice_carry=slice_carry, return_carry=return_carry, reverse=reverse,
                      keep_order=keep_order, num_batch_dims=nbatch, time_major=time_major)
