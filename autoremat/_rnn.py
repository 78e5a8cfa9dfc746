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

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.recurrent import flip_sequences

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Call:
    """One RNN call's settings, the attributes overridden by the call's arguments."""

    axis: int  # the time axis of the inputs
    num_batch_dims: int
    time_major: bool
    reverse: bool
    keep_order: bool
    return_carry: bool
    seq_lengths: jax.Array | None

    @property
    def slice_carry(self) -> bool:
        """Whether every carry is stacked, to pick each padded sequence's last one."""
        return self.seq_lengths is not None and self.return_carry

    @property
    def out_axes(self) -> Any:
        return (0, self.axis) if self.slice_carry else self.axis

    def step_shape(self, inputs: jax.Array) -> tuple[int, ...]:
        return inputs.shape[:self.axis] + inputs.shape[self.axis + 1:]


def prepare(rnn: Any, inputs: jax.Array, seq_lengths: jax.Array | None,
            **overrides: bool | None) -> tuple[jax.Array, Call]:
    """Resolve the call's settings (as the originals) and reverse the inputs if asked."""
    opts = {k: getattr(rnn, k) if v is None else v for k, v in overrides.items()}
    nfeat = rnn.cell.num_feature_axes
    axis = 0 if opts["time_major"] else inputs.ndim - (nfeat + 1)
    call = Call(axis=axis % inputs.ndim, num_batch_dims=inputs.ndim - 1 - nfeat,
                seq_lengths=seq_lengths, **opts)
    if call.reverse:
        inputs = flip(inputs, call)
    return inputs, call


def flip(tree: PyTree, call: Call) -> PyTree:
    """Reverse each sequence in time, keeping padding at the end."""
    return jax.tree_util.tree_map(
        lambda x: flip_sequences(x, call.seq_lengths, num_batch_dims=call.num_batch_dims,
                                 time_major=call.time_major), tree)


def finish(scan_output: Any, call: Call) -> Any:
    """From the scan's output to the RNN's: the last valid carry, the outputs' order."""
    if call.slice_carry:
        assert call.seq_lengths is not None
        _, (carries, outputs) = scan_output
        last = call.seq_lengths - 1
        carry = jax.tree_util.tree_map(lambda x: x[last, jnp.arange(x.shape[1])], carries)
    else:
        carry, outputs = scan_output
    if call.reverse and call.keep_order:
        outputs = flip(outputs, call)
    return (carry, outputs) if call.return_carry else outputs


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

    def __call__(
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
        inputs, call = prepare(self, inputs, seq_lengths, return_carry=return_carry,
                               time_major=time_major, reverse=reverse, keep_order=keep_order)
        if initial_carry is None:
            key = jax.random.key(0) if init_key is None else init_key
            initial_carry = self.cell.initialize_carry(key, call.step_shape(inputs))
        scanned = scan(
            scan_body(call.slice_carry), schedule=self.schedule, unroll=self.unroll,
            in_axes=call.axis, out_axes=call.out_axes, variable_axes=self.variable_axes,
            variable_broadcast=self.variable_broadcast, variable_carry=self.variable_carry,
            split_rngs=self.split_rngs,
        )
        return finish(scanned(self.cell, initial_carry, inputs), call)
