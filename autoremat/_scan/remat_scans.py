"""``autoremat.remat_scans``: any JAX function's long scans, run under a schedule.

Wrap the *loss* (or any function whose scans should be checkpointed), then
differentiate the wrapper::

    loss = autoremat.remat_scans(loss_fn, autoremat.nested([100, 100]))
    grads = jax.grad(loss)(params, x, y)

Every ``scan`` of length ``>= min_length`` the function reaches -- written
with ``lax.scan``, ``fori_loop`` (static bounds), ``nn.scan``, ``nn.RNN``,
``nnx.scan``, ``nnx.RNN`` or a library that lowers to ``lax.scan``, also
inside ``jit``, ``checkpoint``, ``cond``/``switch`` and short outer scans --
runs as ``autoremat.scan`` would run it: same values and gradients (remat
recomputes, it never approximates), the schedule's memory and time (``d``
nested levels keep ``O(d * T^(1/d))`` carries for ``d - 1`` extra forward
passes). The function is traced to a jaxpr at each call (once per
compilation under ``jax.jit``) and re-evaluated by ``rewrite.evaluate``.
"""

from __future__ import annotations

import functools
import numbers
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import jax
import numpy as np

from autoremat._errors import AutorematError, RematScansWarning
from autoremat._scan.checkpoint_names import checkpointed_steps, function_tags, inner_remat_note
from autoremat._scan.fuse_inline import flatten
from autoremat._scan.rewrite import REWRITTEN, TOO_SHORT, Context, FoundScan, evaluate, survey
from autoremat._scan.scan import as_schedule
from autoremat._schedules.base import Schedule
from autoremat._units import format_bytes

#: Scans shorter than this are left alone by default (layer stacks, short loops).
DEFAULT_MIN_LENGTH = 64

_DERIVATIVE_DOCS = ("Gradient of ", "Value and gradient of ", "Jacobian of ", "Hessian of ")


@dataclass(frozen=True)
class RewriteReport:
    """What ``remat_scans`` does to a function at given arguments (``describe``)."""

    schedule: str
    min_length: int
    scans: tuple[FoundScan, ...]
    notes: tuple[str, ...] = ()

    @property
    def rewritten(self) -> tuple[FoundScan, ...]:
        return tuple(s for s in self.scans if s.action == REWRITTEN)

    @property
    def left(self) -> tuple[FoundScan, ...]:
        """Long scans left as written (inside a custom derivative rule or another primitive)."""
        return tuple(s for s in self.scans if s.action not in (REWRITTEN, TOO_SHORT))

    def __str__(self) -> str:
        lines = [f"remat_scans: schedule {self.schedule}, min_length {self.min_length}: "
                 f"{len(self.rewritten)} of {len(self.scans)} scan(s) rewritten"]
        if not self.rewritten:
            lines.append(f"  warning: {nothing_to_schedule(self.scans, self.min_length)}")
        lines += [f"  note: {n}" for n in (*self.notes, *unroll_notes(self.scans))]
        for s in self.scans:
            inside = f"  inside {' > '.join(s.inside)}" if s.inside else ""
            unroll = f"  unroll {s.unroll}" if s.unroll != 1 else ""
            lines.append(f"  {s.action:<10} length {s.length:>8}  carry "
                         f"{format_bytes(s.carry_bytes):>9}{unroll}  {s.where}{inside}")
            if s.fusion:
                lines.append(f"    {s.fusion}")
        return "\n".join(lines)


def remat_scans(fn: Callable[..., Any], schedule: Schedule | str | os.PathLike[str], *,
                min_length: int = DEFAULT_MIN_LENGTH,
                static_argnums: int | Sequence[int] = (), fuse: bool | None = None) -> RematScans:
    """``fn`` with every scan of length ``>= min_length`` run under ``schedule``.

    Args:
      fn: any JAX-traceable function (a loss: wrap it, then differentiate).
      schedule: an ``autoremat.Schedule`` or a schedule file's path; one schedule
        serves every long scan (it adapts to each length).
      min_length: scans shorter than this are left as written.
      static_argnums: positional arguments that are not arrays (a model object,
        a flag); they are passed to ``fn`` as they are.
      fuse: move the per-step readout and loss that follow a long scan into its
        step (as ``autoremat.fuse_loss`` would): the ``(T, B, H)`` stacked outputs, their
        cotangent and the readout's residuals are then not kept, so memory goes below
        the floor of the unfused scan, for the same values and gradients; ``False``
        runs every equation after the scan as written. ``None`` (default): what the
        schedule records (``Schedule.fuse``, where the tuner chose), else ``True``.

    Returns:
      A callable with ``fn``'s signature; ``.describe(*args)`` reports which
      scans it rewrites without running anything.
    """
    return RematScans(fn, schedule, min_length=min_length, static_argnums=static_argnums,
                      fuse=fuse)


class RematScans:
    """The wrapper ``remat_scans`` returns (see there)."""

    def __init__(self, fn: Callable[..., Any], schedule: Schedule | str | os.PathLike[str], *,
                 min_length: int = DEFAULT_MIN_LENGTH,
                 static_argnums: int | Sequence[int] = (), fuse: bool | None = None) -> None:
        if not callable(fn):
            raise AutorematError(f"fn: expected a callable, got {type(fn).__name__}")
        _refuse_derivative(fn)
        if isinstance(min_length, bool) or not isinstance(min_length, int) or min_length < 1:
            raise AutorematError(f"min_length: expected a positive int, got {min_length!r}")
        statics = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in statics):
            raise AutorematError(f"static_argnums: expected ints, got {static_argnums!r}")
        self.fn = fn
        self.schedule = as_schedule(schedule)
        self.min_length = min_length
        self.static_argnums = statics
        if fuse is not None and not isinstance(fuse, bool):
            raise AutorematError(f"fuse: expected True, False or None (the schedule's "
                                 f"choice), got {fuse!r}")
        tuned = self.schedule.fuse
        self.fuse: bool = fuse if fuse is not None else tuned if tuned is not None else True
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        closed, out_tree, leaves = self._trace(args, kwargs)
        if self.fuse:
            closed, _ = flatten(closed, leaves, self.min_length)
        found = survey(closed.jaxpr, self.min_length)
        _warn(found, self.min_length)
        ctx = Context(self.schedule, self.min_length, self.fuse)
        with function_tags(closed.jaxpr, self.schedule):
            outs = evaluate(closed.jaxpr, closed.consts, leaves, ctx)
        return jax.tree_util.tree_unflatten(out_tree, outs)

    def describe(self, *args: Any, **kwargs: Any) -> RewriteReport:
        """Which scans ``self(*args, **kwargs)`` rewrites and which it leaves; runs nothing.

        Arguments may be arrays or ``jax.ShapeDtypeStruct``s.
        """
        closed, _, leaves = self._trace(args, kwargs)
        notes: tuple[str, ...] = ()
        if self.fuse:
            closed, notes = flatten(closed, leaves, self.min_length)
        inner = inner_remat_note(checkpointed_steps(closed.jaxpr, self.min_length))
        notes = (*notes, inner) if inner else notes
        return RewriteReport(self.schedule.describe(), self.min_length,
                             tuple(survey(closed.jaxpr, self.min_length, fuse=self.fuse)), notes)

    def _trace(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, list[Any]]:
        n = len(args)
        statics = set()
        for i in self.static_argnums:
            if not -n <= i < n:
                raise AutorematError(f"static_argnums: {i} is out of range for {n} positional "
                                     "argument(s)")
            statics.add(i % n)
        dynamic = {i: a for i, a in enumerate(args) if i not in statics}
        leaves, treedef = jax.tree_util.tree_flatten((dynamic, kwargs))
        paths = [jax.tree_util.keystr(p)
                 for p, _ in jax.tree_util.tree_flatten_with_path((dynamic, kwargs))[0]]
        for path, leaf in zip(paths, leaves, strict=True):
            if not _array_like(leaf):
                raise AutorematError(_not_array_message(path, leaf))

        def flat(*flat_leaves: Any) -> Any:
            dyn, kw = jax.tree_util.tree_unflatten(treedef, flat_leaves)
            full = [dyn[i] if i in dyn else args[i] for i in range(n)]
            return self.fn(*full, **kw)

        closed, shape = jax.make_jaxpr(flat, return_shape=True)(*leaves)
        return closed, jax.tree_util.tree_structure(shape), leaves


def _array_like(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, numbers.Number,
                          jax.ShapeDtypeStruct)) or hasattr(x, "__jax_array__")


def _not_array_message(path: str, leaf: Any) -> str:
    _, index, rest = path.partition("[0][")
    if index:
        i = rest.split("]", 1)[0]
        return (f"fn's argument {i} holds a {type(leaf).__name__} (at args[{i}]"
                f"{rest.split(']', 1)[1]}), not an array: pass static_argnums=({i},) for "
                "arguments that are not arrays, or close over it (functools.partial)")
    name = path.split("'")[1] if "'" in path else path
    return (f"fn's keyword argument {name!r} holds a {type(leaf).__name__}, not an array: "
            "close over it (functools.partial) or pass it positionally with static_argnums")


def _refuse_derivative(fn: Callable[..., Any]) -> None:
    """A function made by ``jax.grad`` (& co.) has its residuals stacked already: refuse it."""
    seen: Any = fn
    for _ in range(16):
        doc = getattr(seen, "__doc__", None) or ""
        if doc.startswith(_DERIVATIVE_DOCS):
            name = getattr(getattr(fn, "__wrapped__", fn), "__name__", "the loss")
            raise AutorematError(
                f"fn: {doc.split(' with respect', 1)[0]!r} already differentiates, so its "
                "scans' residuals are stacked before remat_scans sees them and nothing would be "
                f"saved; wrap the loss, then differentiate: jax.grad(autoremat.remat_scans("
                f"{name}, schedule))")
        seen = getattr(seen, "__wrapped__", None)
        if seen is None:
            return


#: What a primitive that holds a long scan is, in a sentence: why its scan is left.
_LEFT_WHY: Final = {
    "custom_vjp_call": "a custom_vjp rule (a hand-written derivative, as a kernel's "
                       "reference path has), whose backward pass is its own",
    "custom_jvp_call": "a custom_jvp rule, whose derivative is its own",
    "pallas_call": "a kernel (pallas_call), whose loop and memory are the kernel's own",
    "while": "a while loop, which reverse mode does not differentiate",
    "shard_map": "a shard_map, whose body remat_scans does not enter",
}


def _left_why(action: str) -> str:
    inside = action.removeprefix("left: inside ")
    for prefix, why in _LEFT_WHY.items():
        if inside.startswith(prefix):
            return why
    return f"a {inside}, whose body remat_scans does not enter"


def nothing_to_schedule(found: Sequence[FoundScan], min_length: int) -> str:
    """One sentence: why a function has no scan ``remat_scans`` rewrites -- what was found
    (no scan; scans shorter than ``min_length``; long scans inside a primitive it does not
    enter) and what can and cannot be done about it."""
    left = [s for s in found if s.action not in (REWRITTEN, TOO_SHORT)]
    short = sorted({s.length for s in found if s.action == TOO_SHORT})
    parts = []
    if left:
        parts.append("; ".join(sorted({
            f"its scan of length {s.length} at {s.where} is inside {_left_why(s.action)}"
            for s in left})) + ": autoremat cannot schedule a loop there")
    if short:
        parts.append(f"its other scans are shorter than min_length={min_length} (lengths "
                     f"{short}): pass min_length={short[0]} where they loop over time"
                     if left else
                     f"its scans are shorter than min_length={min_length} (lengths {short}): "
                     f"pass min_length={short[0]} where they loop over time")
    if not found:
        parts.append("it has no scan: autoremat schedules sequential loops (lax.scan and "
                     "what lowers to it: fori_loop with static bounds, nn.scan, nn.RNN, "
                     "nnx.scan); a parallel form such as lax.associative_scan or a "
                     "convolution keeps no per-step residuals to schedule")
    return f"no scan of length >= min_length={min_length} to schedule: " + "; ".join(parts)


def unroll_notes(found: Sequence[FoundScan]) -> tuple[str, ...]:
    """A sentence per rewritten scan whose own ``unroll`` the schedule's replaces."""
    return tuple(dict.fromkeys(
        f"the scan at {s.where} sets unroll={s.unroll}: a schedule runs it with the "
        "schedule's own unroll (the search tries unrolls itself)"
        for s in found if s.action == REWRITTEN and s.unroll != 1))


def _warn(found: list[FoundScan], min_length: int) -> None:
    for s in found:
        if s.action not in (REWRITTEN, TOO_SHORT):
            warnings.warn(
                f"remat_scans: the scan of length {s.length} at {s.where} is inside "
                f"{_left_why(s.action)}, and is left as written", RematScansWarning,
                stacklevel=3)
        elif s.backward:
            warnings.warn(
                f"remat_scans: the scan of length {s.length} at {s.where} runs backward over "
                "another scan's stacked outputs -- does fn already differentiate (jax.grad "
                "inside)? Then nothing is saved: wrap the loss, then differentiate.",
                RematScansWarning, stacklevel=3)
    if not any(s.action == REWRITTEN for s in found):
        warnings.warn(f"remat_scans: {nothing_to_schedule(found, min_length)}; nothing is "
                      "rewritten", RematScansWarning, stacklevel=3)
