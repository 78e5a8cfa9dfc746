"""Lifted version of ``autoremat.scan``: ``flax.linen.scan`` with a remat schedule.

``autoremat.linen.scan`` takes the keyword arguments of ``flax.linen.scan``
plus ``schedule=`` and runs the loop through ``autoremat.scan``'s nested,
checkpointed scan instead of one ``lax.scan``. Outputs, gradients and the
parameter tree are those of ``nn.scan`` (parameters trained with one load into
the other; values agree to float rounding); only memory and time differ. With ``d`` levels of lengths
``n_1 .. n_d`` (``T = n_1 * ... * n_d``) and ``nothing_saveable`` on the outer
levels, the backward pass keeps about ``n_1 + ... + n_d`` carries plus one
innermost chunk of residuals -- ``O(d * T^(1/d))`` memory instead of
``O(T)`` -- for ``d - 1`` extra forward passes (Chen et al. 2016, "Training
Deep Nets with Sublinear Memory Cost", arXiv 1604.06174). Remat recomputes, it
never approximates: gradients are exact.

Switching a model is a two-line change: ``import autoremat`` and
``nn.scan`` -> ``autoremat.linen.scan`` with ``schedule=`` added. It works as
a method decorator and on a Module class, like ``nn.scan``::

    >>> import functools
    >>> import flax.linen as nn, jax, jax.numpy as jnp
    >>> import autoremat
    >>> class SimpleLSTM(nn.Module):
    ...     hidden_size: int
    ...     def setup(self):
    ...         self.cell = nn.OptimizedLSTMCell(self.hidden_size)
    ...     @functools.partial(autoremat.linen.scan, variable_broadcast="params",
    ...                        in_axes=1, out_axes=1, split_rngs={"params": False},
    ...                        schedule=autoremat.nested([10, 10]))
    ...     def forward(self, carry, x):
    ...         return self.cell(carry, x)
    ...     def __call__(self, x):
    ...         carry = self.cell.initialize_carry(jax.random.PRNGKey(0), x[:, 0].shape)
    ...         return self.forward(carry, x)[1]
    >>> x = jnp.ones((2, 100, 3))                     # (batch, time, features)
    >>> y, params = jax.jit(SimpleLSTM(8).init_with_output)(jax.random.PRNGKey(0), x)
    >>> y.shape                                        # apply() works the same way
    (2, 100, 8)
    >>> ScanCell = autoremat.linen.scan(
    ...     nn.OptimizedLSTMCell, variable_broadcast="params", split_rngs={"params": False},
    ...     in_axes=1, out_axes=1, schedule=autoremat.nested([10, 10]))
    >>> ScanCell.__name__
    'ScanOptimizedLSTMCell'

Differences from ``nn.scan``:

* ``unroll`` defaults to the schedule's ``unroll`` (given, it overrides it);
  ``_split_transpose`` is not accepted.
* ``nn.broadcast`` in ``out_axes`` (loop-invariant outputs) is not supported.
* Broadcast variables (``variable_broadcast``) are created, at ``init``, by
  running the body once on the first step's inputs outside the loop (under
  ``jit`` the rest of that step is dead code); the loop then reads them as
  constants. They must not depend on the data (``nn.scan`` checks this; this
  scan does not). Outside ``init`` that pass is only traced abstractly (no
  compute), so that rng counters -- and hence dropout masks -- advance exactly
  as in ``nn.scan``, whatever the schedule. With
  ``check_constancy_invariants=False`` there is no such pass (one trace of the
  step, as ``nn.scan`` then makes) except at ``init`` with broadcast variables
  to create, which ``nn.scan`` then leaves uncreated.
* ``variable_carry`` collections that are not mutable are passed through.

``autoremat.linen.problem(name, model, params, batch, optimizer)`` tunes a model
left as written (its ``nn.scan`` untouched): see ``autoremat.remat_scans``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import optax

from autoremat._errors import ProblemError
from autoremat._flax.linen_rnn import RNN as RNN
from autoremat._flax.linen_scan import scan as scan
from autoremat._measure.from_loss import linen_loss
from autoremat._measure.problem import Problem
from autoremat._scan.remat_scans import DEFAULT_MIN_LENGTH

__all__ = ["RNN", "problem", "scan"]


def problem(name: str, model: Any, params: Any, batch: Sequence[Any],
            optimizer: optax.GradientTransformation,
            loss: Callable[..., Any] | None = None, *,
            min_length: int = DEFAULT_MIN_LENGTH, fuse: bool | None = None) -> Problem:
    """An ``autoremat.Problem`` from a Flax linen model left as written.

    Args:
      name: a short name, recorded in schedules and studies.
      model: the ``nn.Module``; ``model.apply({"params": params}, batch[0])``
        gives its predictions.
      params: its parameters (``model.init(...)["params"]``).
      batch: ``(inputs, *targets)``, arrays of one training step.
      optimizer: an optax ``GradientTransformation``.
      loss: ``loss(predictions, *targets) -> scalar``; default the mean L2
        loss (``optax.l2_loss(...).mean()``), as in the original report.
      min_length: scans shorter than this are left as written.
      fuse: move the readout and the loss into the scan where they are
        separable in time (``autoremat.remat_scans(fuse=...)``); ``None`` (default):
        fused and unfused are both candidates of the search where fusing applies
        (``Problem.from_loss``), and the tuned schedule records which won.

    The model's scans (``nn.scan``, ``nn.RNN``, ...) run under each trial's
    schedule through ``autoremat.remat_scans`` (``Problem.from_loss``).
    """
    batch = tuple(batch)
    if not batch:
        raise ProblemError("batch: expected (inputs, *targets), got an empty tuple")
    found = Problem.from_loss(name, linen_loss(model, loss), params, batch, optimizer,
                              min_length=min_length, fuse=fuse)
    targets = ["y"] if len(batch) == 2 else [f"y{i}" for i in range(len(batch) - 1)]
    return replace(found, arg_names=("params", "opt_state", "x", *targets))
