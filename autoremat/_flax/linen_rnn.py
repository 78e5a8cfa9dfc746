"""``autoremat.linen.RNN``: ``flax.linen.RNN`` with its scan run under a schedule."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from autoremat._flax.linen_scan import scan
from autoremat._flax.rnn import PyTree, finish, prepare, scan_body


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

    With ``seq_lengths`` and ``return_carry=True`` each sequence's last carry
    is kept as the loop runs (``nn.RNN`` stacks all ``T`` carries to pick it).
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
        if self.schedule is None:
            raise TypeError("autoremat.linen.RNN: missing the schedule= argument "
                            "(an autoremat.Schedule or a schedule file)")
        inputs, call = prepare(self, inputs, seq_lengths, return_carry=return_carry,
                               time_major=time_major, reverse=reverse, keep_order=keep_order)
        if initial_carry is None:
            key = jax.random.key(0) if init_key is None else init_key
            initial_carry = self.cell.initialize_carry(key, call.step_shape(inputs))
        scanned = scan(
            scan_body(call, inputs.shape[call.axis]), schedule=self.schedule,
            unroll=self.unroll, in_axes=call.axis, out_axes=call.axis,
            variable_axes=self.variable_axes,
            variable_broadcast=self.variable_broadcast, variable_carry=self.variable_carry,
            split_rngs=self.split_rngs,
        )
        return finish(scanned(self.cell, call.init(initial_carry), inputs), call)
