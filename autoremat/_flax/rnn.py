"""``nn.RNN`` / ``nnx.RNN`` with a remat schedule: the steps both share.

Both originals scan a cell over the time axis with one ``lax.scan`` (memory
linear in ``T``); these run that scan under a schedule instead
(``autoremat.linen.scan`` / ``autoremat.nnx.scan``), so the residuals kept
for the backward pass shrink to the schedule's (``O(d * T^(1/d))`` carries
for ``d`` nested levels; Chen et al. 2016, arXiv 1604.06174) at the cost of
recomputing the forward pass. Around the scan -- reversing padded sequences,
``keep_order``, each sequence's last carry with ``seq_lengths`` -- the results
are the originals'; only that last carry is picked inside the loop rather than
from a stack of every step's carry.
"""

from __future__ import annotations

import dataclasses
from typing import Any

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
        """Whether each padded sequence's last carry is picked (not the final one)."""
        return self.seq_lengths is not None and self.return_carry

    def init(self, carry: PyTree) -> PyTree:
        """The scan's initial carry: with ``slice_carry``, also the picked carry and ``t``."""
        return (carry, carry, jnp.zeros((), jnp.int32)) if self.slice_carry else carry

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
    carry, outputs = scan_output
    if call.slice_carry:
        _, carry, _ = carry
    if call.reverse and call.keep_order:
        outputs = flip(outputs, call)
    return (carry, outputs) if call.return_carry else outputs


def scan_body(call: Call, steps: int) -> Any:
    """The per-step function: the cell; with ``slice_carry`` it also keeps the carry of
    step ``seq_lengths - 1`` (of each sequence), which the originals pick from a stack
    of all ``T`` carries -- same values, without that ``T x carry`` memory."""

    def step(cell: Any, carry: PyTree, x: jax.Array) -> tuple[PyTree, Any]:
        if not call.slice_carry:
            return cell(carry, x)
        assert call.seq_lengths is not None
        carry, picked, t = carry
        carry, y = cell(carry, x)
        hit = (call.seq_lengths - 1) % steps == t  # (*batch,); -1 picks the last step
        picked = jax.tree_util.tree_map(
            lambda new, old: jnp.where(hit.reshape(hit.shape + (1,) * (new.ndim - hit.ndim)),
                                       new, old), carry, picked)
        return (carry, picked, t + 1), y

    return step
