"""Flax NNX with a remat schedule: ``scan``, ``RNN`` and a tunable ``problem``.

``autoremat.nnx.scan`` is a drop-in for ``flax.nnx.scan`` over the time axis
and ``autoremat.nnx.RNN`` for ``flax.nnx.RNN`` (it works inside
``nnx.Bidirectional``): the same arguments plus ``schedule=``, the same
outputs, gradients and final module state; only memory and time differ. With
``d`` nested levels of lengths ``n_1 .. n_d`` the backward pass keeps about
``n_1 + ... + n_d`` carries plus one innermost chunk of residuals --
``O(d * T^(1/d))`` memory instead of ``O(T)`` -- for ``d - 1`` extra forward
passes (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost",
arXiv 1604.06174); a binomial schedule keeps a fixed number of carries
(Griewank & Walther's Revolve). Remat recomputes, it never approximates.

    >>> import jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> import autoremat, autoremat.nnx
    >>> cell = nnx.OptimizedLSTMCell(3, 8, rngs=nnx.Rngs(0))
    >>> @autoremat.nnx.scan(in_axes=(nnx.Carry, None, 1), out_axes=(nnx.Carry, 1),
    ...                     schedule=autoremat.nested([10, 10]))
    ... def forward(carry, cell, x):
    ...     return cell(carry, x)
    >>> x = jnp.ones((2, 100, 3))                      # (batch, time, features)
    >>> carry, ys = forward(cell.initialize_carry((2, 3), nnx.Rngs(0)), cell, x)
    >>> ys.shape
    (2, 100, 8)
    >>> rnn = autoremat.nnx.RNN(cell, schedule=autoremat.binomial(8))
    >>> rnn(x).shape
    (2, 100, 8)

Supported as in ``nnx.scan``: ``in_axes`` / ``out_axes`` with ``nnx.Carry``,
``None`` (broadcast inputs), ints, ``nnx.StateAxes`` for modules; module state
carried (mutations -- a counter, batch statistics, rng counts -- written
back), broadcast (mutations dropped, as ``nnx.scan`` drops them) or scanned;
rng streams are module state and advance exactly as in ``nnx.scan``; tree
mode (``graph=False``, ``graph_updates=False``; flax >= 0.12.6), Modules
and Variables returned from the step (scan over layers) and
``transform_metadata`` too: it is ``nnx.scan`` itself with the loop
replaced, so misuse gets ``nnx.scan``'s own errors, and the step is traced
no more often. Not supported, each with an error naming it: ``unroll=True``
(full unroll) and ``_split_transpose``.
``autoremat.nnx.remat_scans(fn, schedule)`` schedules the scans of unmodified
NNX code (a function of modules), keeping the modules' state updates.
Needs flax >= 0.12, the floor in pyproject.toml (``nnx.Optimizer(model, tx, wrt=...)``, ``update(model,
grads)``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx

from autoremat._errors import ProblemError
from autoremat._flax.nnx_remat_scans import remat_scans as remat_scans
from autoremat._flax.nnx_scan import scan
from autoremat._flax.rnn import finish, prepare, scan_body
from autoremat._measure.problem import Problem
from autoremat._scan.remat_scans import nothing_to_schedule, unroll_notes
from autoremat._scan.scan import as_schedule
from autoremat._schedules import plain
from autoremat._schedules.base import Schedule

__all__ = ["RNN", "problem", "remat_scans", "scan"]

PyTree = Any


class RNN(nnx.RNN):
    """``flax.nnx.RNN`` with its scan run under a remat schedule.

    The arguments of ``nnx.RNN`` (``time_major``, ``return_carry``,
    ``reverse``, ``keep_order``, ``state_axes``, ``broadcast_rngs``, ``rngs``;
    at call time ``initial_carry``, ``seq_lengths``, ``rngs`` and the
    overrides) plus ``schedule``; ``unroll`` defaults to ``schedule.unroll``.
    The cell's state is carried as in ``nnx.RNN`` (``state_axes`` default),
    but state the cell only reads -- its parameters -- is held once, not in
    every saved carry. Works inside ``nnx.Bidirectional``. With
    ``seq_lengths`` and ``return_carry=True`` each sequence's last carry is
    kept as the loop runs (``nnx.RNN`` stacks all ``T`` carries to pick it).
    """

    def __init__(
        self,
        cell: Any,
        *,
        schedule: Schedule | str | os.PathLike[str],
        time_major: bool = False,
        return_carry: bool = False,
        reverse: bool = False,
        keep_order: bool = False,
        unroll: int | None = None,
        state_axes: Any = None,
        broadcast_rngs: Any = None,
        rngs: Any = True,
    ) -> None:
        super().__init__(cell, time_major=time_major, return_carry=return_carry,
                         reverse=reverse, keep_order=keep_order, state_axes=state_axes,
                         broadcast_rngs=broadcast_rngs, rngs=rngs)
        self.schedule = as_schedule(schedule)
        self.unroll = unroll  # type: ignore[assignment]

    def __call__(
        self,
        inputs: jax.Array,
        *,
        initial_carry: PyTree | None = None,
        seq_lengths: jax.Array | None = None,
        return_carry: bool | None = None,
        time_major: bool | None = None,
        reverse: bool | None = None,
        keep_order: bool | None = None,
        rngs: Any = None,
    ) -> Any:
        inputs, call = prepare(self, inputs, seq_lengths, return_carry=return_carry,
                               time_major=time_major, reverse=reverse, keep_order=keep_order)
        rngs = self.rngs if rngs is None else rngs
        if isinstance(rngs, nnx.Rngs):
            rngs = rngs.carry.fork()
        if initial_carry is None:
            initial_carry = self.cell.initialize_carry(call.step_shape(inputs), rngs)
        axes: dict[Any, Any] = {nnx.All(nnx.RngState, self.broadcast_rngs): None,
                                **self.state_axes}
        scanned = nnx.split_rngs(splits=1, only=self.broadcast_rngs, squeeze=True)(scan(
            scan_body(call, inputs.shape[call.axis]), schedule=self.schedule,
            unroll=self.unroll, in_axes=(nnx.StateAxes(axes), nnx.Carry, call.axis),
            out_axes=(nnx.Carry, call.axis),
        ))
        return finish(scanned(self.cell, call.init(initial_carry), inputs), call)


def problem(
    name: str,
    model_fn: Callable[[Schedule], nnx.Module],
    loss_fn: Callable[..., jax.Array],
    optimizer_fn: Callable[[nnx.Module], nnx.Optimizer],
    batch: Sequence[Any],
    seq_len: int,
    *,
    min_length: int | None = None,
    fuse: bool | None = None,
) -> Problem:
    """An ``autoremat.Problem`` (for ``autoremat tune --problem``) from an NNX model.

    Args:
      name: a short name, recorded in schedules and studies.
      model_fn: ``model_fn(schedule) -> model``: the model, built so that its
        scan runs under ``schedule`` (``autoremat.nnx.scan`` / ``RNN``).
      loss_fn: ``loss_fn(model, *batch) -> scalar``.
      optimizer_fn: ``optimizer_fn(model) -> nnx.Optimizer``, e.g.
        ``lambda m: nnx.Optimizer(m, optax.adam(1e-3), wrt=nnx.Param)``.
      batch: example inputs of one training step (arrays), passed to ``loss_fn``.
      seq_len: the sequence length ``T`` the model scans (a layer stack: its layer count).
      min_length: ``None`` (default): the model's own scan runs the schedule, as above.
        An int: the model is left as written -- ``model_fn`` gets ``autoremat.plain(seq_len)``
        and may ignore it, its ``nnx.scan`` untouched -- and every scan of length
        ``>= min_length`` in ``loss_fn`` runs under the schedule through
        ``autoremat.nnx.remat_scans`` (fused or not, as ``fuse`` says); shorter scans are
        left as written. A layer stack sets it to its layer count (``remat_scans``'s
        default, 64, is above most). At most ``seq_len``; checked on an abstract model
        (``nnx.eval_shape``), refused when no scan is that long. With ``fuse=None``
        fused and unfused are both candidates only where fusing moves something (as in
        ``Problem.from_loss``; not for a layer stack, whose readout follows the last
        layer). ``Problem.notes`` says when the scanned step holds a remat.
      fuse: move the readout and loss after the scan into the scanned step where they
        are separable in time (``remat_scans``'s fusion): the model is built with the
        plain scan (``model_fn(autoremat.plain(seq_len))``) and ``loss_fn`` runs under
        ``remat_scans(loss_fn, schedule, fuse=True)``, so the ``(T, B, H)`` stacked
        outputs no schedule removes are not kept. ``False``: the model's own scan runs
        the schedule (``model_fn(schedule)``) and the readout stays outside. ``None``
        (default): both are candidates of the search (``Problem.fuse_choice``); each
        schedule's ``fuse`` decides (absent: fused), and the tuned one records it.

    Returns:
      A ``Problem`` whose step is one training step: ``nnx.value_and_grad`` of
      ``loss_fn`` w.r.t. the ``nnx.Param`` state, then ``optimizer.update``.
    """
    batch = tuple(batch)
    notes: tuple[str, ...] = ()
    choice = fuse is None
    if min_length is not None:
        _check_min_length(min_length, seq_len)
        notes, fusable = _survey(model_fn, loss_fn, batch, seq_len, min_length, choice)
        choice = choice and fusable

    def build(schedule: Schedule) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        fused = fuse if fuse is not None else schedule.fuse is not False
        loss: Callable[..., Any]
        if min_length is not None:  # the model as written, its long scans rewritten
            model = model_fn(plain(seq_len))
            loss = remat_scans(loss_fn, schedule, min_length=min_length, fuse=fused)
        else:
            model = model_fn(plain(seq_len) if fused else schedule)
            loss = (remat_scans(loss_fn, schedule, min_length=seq_len, fuse=True) if fused
                    else loss_fn)
        optimizer = optimizer_fn(model)
        graphdef, state = nnx.split((model, optimizer))

        def train_step(state: Any, *batch: Any) -> tuple[Any, jax.Array]:
            model, optimizer = nnx.merge(graphdef, state)
            value, grads = nnx.value_and_grad(loss)(model, *batch)
            optimizer.update(model, grads)
            return nnx.state((model, optimizer)), value

        return train_step, (state, *batch)

    return Problem(name=name, seq_len=seq_len, build=build, fuse_choice=choice,
                   notes=notes)


def _check_min_length(min_length: Any, seq_len: int) -> None:
    """``ProblemError`` naming ``min_length`` unless it is an int in ``1 .. seq_len``."""
    if isinstance(min_length, bool) or not isinstance(min_length, int) or min_length < 1:
        raise ProblemError(f"min_length: expected a positive int (the shortest scan to "
                           f"schedule, a layer stack's layer count) or None, got {min_length!r}")
    if min_length > seq_len:
        raise ProblemError(f"min_length: {min_length} is above seq_len={seq_len}, so the scan "
                           f"of seq_len steps would be left as written; pass min_length <= "
                           f"{seq_len}")


def _survey(model_fn: Callable[[Schedule], nnx.Module], loss_fn: Callable[..., jax.Array],
            batch: tuple[Any, ...], seq_len: int, min_length: int,
            fusing: bool) -> tuple[tuple[str, ...], bool]:
    """``(notes, fusable)`` of ``loss_fn``'s long scans: the notes of ``RewriteReport``
    (a remat inside the step), and whether fusing moves anything into them (asked only
    when ``fusing``; a layer stack's readout follows the last layer, so nothing is: the
    search then offers no unfused twin of each schedule). From an abstract model
    (``nnx.eval_shape``: nothing is initialized); ``ProblemError`` naming ``min_length``
    when no scan is that long."""
    model = nnx.eval_shape(lambda: model_fn(plain(seq_len)))
    report = remat_scans(loss_fn, plain(1), min_length=min_length, fuse=False).describe(
        model, *batch)
    fusable = fusing and any(
        s.fusion.startswith("fused into the step") for s in remat_scans(
            loss_fn, plain(1), min_length=min_length, fuse=True).describe(model, *batch).scans)
    if not report.rewritten:
        raise ProblemError(f"min_length: loss_fn(model, *batch): "
                           f"{nothing_to_schedule(report.scans, min_length)} (a layer "
                           "stack: min_length the layer count)")
    return (*report.notes, *unroll_notes(report.scans)), fusable
