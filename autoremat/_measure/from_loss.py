"""A tunable step from unmodified code: a loss, its parameters, a batch and an optax optimizer.

``Problem.from_loss`` (``loss_problem`` here) builds the train step the tuner measures --
``value_and_grad`` of ``remat_scans(loss_fn, schedule)`` and the optax update
-- so a model nobody edited for autoremat can be tuned: its scans (however
written) run under each trial's schedule. ``seq_len`` is the longest scan's
length; the step's arguments are named ``params``, ``opt_state`` and the loss's
own parameter names, for the memory breakdown. ``first_steps`` cuts the batch
to its first ``n`` time steps (the problem's ``at_length``, for short timing
runs). ``linen_loss`` is the loss of a Flax linen model
(``autoremat.linen.problem``). This module does not import ``problem``
(which imports it lazily): it returns the ``Problem``'s fields.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import optax

from autoremat._errors import ProblemError
from autoremat._scan.checkpoint_names import checkpointed_steps, inner_remat_note
from autoremat._scan.remat_scans import (
    DEFAULT_MIN_LENGTH,
    RematScans,
    nothing_to_schedule,
    remat_scans,
    unroll_notes,
)
from autoremat._scan.rewrite import REWRITTEN, survey
from autoremat._schedules import plain
from autoremat._schedules.base import Schedule

Build = Callable[[Schedule], tuple[Callable[..., Any], tuple[Any, ...]]]


def loss_problem(loss_fn: Callable[..., Any], params: Any, batch: Sequence[Any],
                 optimizer: optax.GradientTransformation, *,
                 min_length: int | None = None,
                 fuse: bool | None = None
                 ) -> tuple[int, Build, tuple[str, ...], bool, tuple[str, ...]]:
    """``(seq_len, build, arg_names, fuse_choice, notes)`` of ``Problem.from_loss`` (see
    there); ``fuse_choice``: ``fuse`` is ``None`` and fusing moves something into a long
    scan; ``notes``: a remat inside a long scan's step (``checkpointed_steps``), a long
    scan's own ``unroll`` that the schedule's replaces (``unroll_notes``)."""
    min_length = DEFAULT_MIN_LENGTH if min_length is None else min_length
    if not callable(loss_fn):
        raise ProblemError(f"loss_fn: expected a callable loss_fn(params, *batch), got "
                           f"{type(loss_fn).__name__}")
    if not isinstance(batch, (tuple, list)):
        raise ProblemError(f"batch: expected a tuple of arrays, got {type(batch).__name__}")
    batch = tuple(batch)
    if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise ProblemError(f"optimizer: expected an optax GradientTransformation, got "
                           f"{type(optimizer).__name__}")
    RematScans(loss_fn, plain(1), min_length=min_length)  # refuses jax.grad(loss)
    try:
        closed = jax.make_jaxpr(loss_fn)(params, *batch)
    except Exception as e:
        raise ProblemError(f"loss_fn: calling loss_fn(params, *batch) failed: "
                           f"{type(e).__name__}: {e}") from None
    found = survey(closed.jaxpr, min_length)
    long = [s.length for s in found if s.action == REWRITTEN]
    if not long:
        raise ProblemError(f"loss_fn: {nothing_to_schedule(found, min_length)}")
    opt_state = optimizer.init(params)
    fusing = RematScans(loss_fn, plain(1), min_length=min_length, fuse=True)
    choice = fuse is None and any(  # ``Analysis.describe`` of a fused scan
        s.fusion.startswith("fused into the step")
        for s in fusing.describe(params, *batch).scans)

    def build(schedule: Schedule) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        # fixed, else the schedule's choice (fused where it makes none)
        loss = remat_scans(loss_fn, schedule, min_length=min_length,
                           fuse=fuse if fuse is not None or choice else True)

        def train_step(params: Any, opt_state: Any, *batch: Any) -> Any:
            value, grads = jax.value_and_grad(loss)(params, *batch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, value

        return train_step, (params, opt_state, *batch)

    note = inner_remat_note(checkpointed_steps(closed.jaxpr, min_length))
    notes = ((note,) if note else ()) + unroll_notes(found)
    return (max(long), build, ("params", "opt_state", *_batch_names(loss_fn, len(batch))),
            choice, notes)


def time_axes(batch: Sequence[Any], seq_len: int) -> list[int | None] | None:
    """Per leaf of ``batch``, its one axis of length ``seq_len`` (``None``: no such
    axis); ``None`` when some leaf has two (``B == T``: which is time is not known)
    or no leaf has one (the scan's length does not come from the batch)."""
    axes: list[int | None] = []
    for leaf in jax.tree_util.tree_leaves(tuple(batch)):
        found = [i for i, n in enumerate(getattr(leaf, "shape", ())) if n == seq_len]
        if len(found) > 1:
            return None
        axes.append(found[0] if found else None)
    return axes if any(a is not None for a in axes) else None


def first_steps(batch: Sequence[Any], axes: list[int | None], n: int) -> tuple[Any, ...]:
    """``batch`` with every leaf cut to its first ``n`` steps along its time axis
    (``time_axes``); a leaf placed on devices keeps its sharding."""
    leaves, tree = jax.tree_util.tree_flatten(tuple(batch))

    def cut(leaf: Any, axis: int | None) -> Any:
        if axis is None:
            return leaf
        part = leaf[(slice(None),) * axis + (slice(0, n),)]
        sharding = getattr(leaf, "sharding", None)
        return part if sharding is None else jax.device_put(part, sharding)

    return tuple(jax.tree_util.tree_unflatten(
        tree, [cut(leaf, a) for leaf, a in zip(leaves, axes, strict=True)]))


def _batch_names(loss_fn: Callable[..., Any], n: int) -> list[str]:
    """The loss's own names for its batch arguments, else ``batch0, batch1, ...``."""
    try:
        names = [p.name for p in inspect.signature(loss_fn).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:n + 1]
    except (TypeError, ValueError):
        names = []
    if len(names) != n or len(set(names) | {"params", "opt_state"}) != n + 2:
        names = [f"batch{i}" for i in range(n)]
    return names


def linen_loss(model: Any, loss: Callable[..., Any] | None) -> Callable[..., Any]:
    """``loss_fn(params, x, *targets)`` of a linen model: ``loss(model.apply(...), *targets)``;
    the default ``loss`` is the mean L2 loss (``optax.l2_loss(...).mean()``), as in the seed."""
    readout = loss or (lambda preds, y: optax.l2_loss(preds, y).mean())

    def loss_fn(params: Any, x: Any, *targets: Any) -> Any:
        return readout(model.apply({"params": params}, x), *targets)

    return loss_fn
