"""The binomial (Revolve) scan: ``O(log T)`` stored carries, the fewest re-runs.

A ``jax.custom_vjp`` around the whole loop (Griewank & Walther 2000,
"Algorithm 799: Revolve"; its tables are ``autoremat._schedules.revolve``):

* forward: one ``lax.scan`` over the ``T`` steps that also writes the carry
  into a buffer of ``s`` slots at the tables' positions -- ``s`` carries, no
  per-step residuals;
* backward: a ``lax.scan`` over the reversals (last step first); each
  restores a slot, re-advances to the step it reverses (storing new snapshots
  on the way) and runs that step's ``jax.vjp``
  (``autoremat._schedules.binomial_backward``). With ``backward: static`` a
  gradient runs ``Backward.run`` (only scans of static length); otherwise two
  equal implementations behind a ``jax.custom_jvp`` (``_Loop.backward``): a
  gradient runs ``Backward.run_loops`` (``lax.fori_loop``s of dynamic length:
  XLA hoists the step's constants and moves collectives out of the loop), and
  differentiating the backward (grad of grad, ``jax.hessian``) goes through
  ``Backward.run``. Both run exactly the tables' step evaluations (none
  masked; padding ops run no step).

Values the step closes over (Flax parameters, ...) are made explicit with
``jax.closure_convert`` so their cotangents are summed over the reversals.
``symbolic_zeros`` tells which inputs are differentiated: cotangents of the
others (a data input ``xs``, an integer carry) are never built, and unused
outputs' cotangents are never read.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from autoremat import _jax as ji
from autoremat._errors import ScheduleError
from autoremat._schedules.binomial_backward import Backward, zero
from autoremat._schedules.revolve import Tables, tables

PyTree = Any


def binomial_scan(
    step: Callable[[Any, list[jax.Array]], tuple[Any, PyTree]],
    init: PyTree,
    leaves: list[jax.Array],
    axes: list[int],
    steps: int,
    snapshots: int,
    reverse: bool,
    unroll: int,
    label: str,
    static: bool = False,
) -> tuple[PyTree, PyTree]:
    """Run ``steps >= 1`` steps of ``step(carry, x_leaves)``; outputs stacked on axis 0.

    ``label`` (the schedule's ``describe()``) names it in errors; ``static``: a
    gradient runs the static-scan backward too (``BinomialSchedule.backward``).
    """
    x_first = [lax.index_in_dim(x, 0, a, keepdims=False) for x, a in zip(leaves, axes, strict=True)]
    fn, consts = jax.closure_convert(step, init, x_first)
    loop = _Loop(fn, tables(steps, snapshots), tuple(axes), reverse, unroll, label, static)
    return loop.run(init, leaves, consts)


def _under_linearize() -> bool:
    """Whether this trace runs inside ``jax.linearize`` (a frame of its code on the
    stack): ``linearize`` and ``grad`` trace alike, so the tracer cannot tell."""
    code = getattr(inspect.unwrap(jax.linearize), "__code__", None)
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False

class _Loop:
    """One binomial scan: the step (closure-converted), the Revolve tables, the layout."""

    def __init__(self, fn: Callable[..., Any], tables_: Tables, axes: tuple[int, ...],
                 reverse: bool, unroll: int, label: str, static: bool) -> None:
        self.fn, self.tables, self.axes = fn, tables_, axes
        self.reverse, self.unroll, self.label, self.static = reverse, unroll, label, static
        self.steps = tables_.seq_len

    # -- helpers -------------------------------------------------------------
    def index(self, position: jax.Array) -> jax.Array:
        """Data index of scan position ``position``."""
        return self.steps - 1 - position if self.reverse else position

    def x_at(self, xs: Sequence[jax.Array], index: jax.Array) -> list[jax.Array]:
        return [lax.dynamic_index_in_dim(x, index, a, keepdims=False)
                for x, a in zip(xs, self.axes, strict=True)]

    def call(self, carry: PyTree, x: list[jax.Array], consts: Sequence[Any]) -> tuple[PyTree, PyTree]:
        return self.fn(carry, x, *consts)

    # -- the custom VJP ----------------------------------------------------------
    def run(self, init: PyTree, xs: list[jax.Array], consts: list[Any]) -> tuple[PyTree, PyTree]:
        """The loop under a ``jax.custom_vjp``; in pure forward mode (``jax.jvp``,
        ``jax.jacfwd``) the plain forward sweep, whose JVP stores nothing either."""
        if ji.traced_by("JVPTracer", init, xs, consts) and getattr(
                jax.config, "jax_use_direct_linearize", True):
            return self.forward(init, xs, consts, keep=False)[0]
        if ji.traced_by("LinearizeTracer", init, xs, consts) and _under_linearize():
            raise ScheduleError(
                f"schedule {self.label!r}: jax.linearize is not supported by the binomial "
                "kind: its backward pass is a custom VJP, which has no forward-mode linear "
                "map. Use jax.jvp (supported), or a nested schedule (e.g. autoremat.root(T, 2)) "
                "for jax.linearize.")

        @jax.custom_vjp
        def loop(init: PyTree, xs: list[jax.Array], consts: list[Any]) -> tuple[PyTree, PyTree]:
            return self.forward(init, xs, consts, keep=False)[0]

        def fwd(init: PyTree, xs: list[Any], consts: list[Any]) -> tuple[Any, Any]:
            value = lambda t: jax.tree_util.tree_map(lambda p: p.value, t)  # noqa: E731
            flags = lambda t: jax.tree_util.tree_map(lambda p: p.perturbed, t)  # noqa: E731
            init_v, xs_v, consts_v = value(init), value(xs), value(consts)
            out, slots = self.forward(init_v, xs_v, consts_v, keep=True)
            # Which inputs are differentiated, as tree structure (None: not).
            marks = tuple(
                tuple(() if f else None for f in jax.tree_util.tree_leaves(flags(t)))
                for t in (init, xs, consts)
            )
            return out, (init_v, xs_v, consts_v, slots, marks)

        def bwd(res: Any, cts: tuple[PyTree, PyTree]) -> tuple[Any, Any, Any]:
            return self.backward(res, cts)

        loop.defvjp(fwd, bwd, symbolic_zeros=True)
        return loop(init, xs, consts)

    def forward(self, init: PyTree, xs: list[jax.Array], consts: list[Any],
                keep: bool) -> tuple[tuple[PyTree, PyTree], Any]:
        """All ``T`` steps; with ``keep``, also the snapshots of the tables (``s`` slots)."""
        p = self.tables
        carry_leaves = jax.tree_util.tree_leaves(init)
        # From the carry itself (not jnp.zeros(shape)): inside shard_map the buffer then has
        # the carry's varying manual axes, as lax.scan's carry types must match.
        slots = [jnp.broadcast_to(jnp.zeros_like(c), (p.snapshots, *jnp.shape(c)))
                 for c in carry_leaves]
        positions = jnp.asarray(np.append(p.forward_positions, self.steps))
        targets = jnp.asarray(np.append(p.forward_slots, 0))

        def body(state: tuple[Any, ...], index: jax.Array) -> tuple[tuple[Any, ...], PyTree]:
            carry, slots, k = state
            if keep:
                position = self.index(index)
                take = position == positions[k]
                slot = targets[k]
                slots = [
                    lax.dynamic_update_index_in_dim(
                        buf, jnp.where(take, c, lax.dynamic_index_in_dim(buf, slot, 0, False)),
                        slot, 0)
                    for buf, c in zip(slots, jax.tree_util.tree_leaves(carry), strict=True)
                ]
                k = k + take.astype(jnp.int32)
            carry, y = self.call(carry, self.x_at(xs, index), consts)
            return (carry, slots, k), y

        state = (init, slots if keep else [], jnp.int32(0))
        (carry, slots, _), ys = lax.scan(body, state, jnp.arange(self.steps, dtype=jnp.int32),
                                         reverse=self.reverse, unroll=self.unroll)
        return (carry, ys), slots

    def backward(self, res: Any, cts: tuple[PyTree, PyTree]) -> tuple[Any, Any, Any]:
        """The reversals, last step first: restore, re-advance, the step's VJP.

        With ``static`` (``backward: static``), ``Backward.run``: only scans of
        static length, differentiable as it is. Otherwise two equal
        implementations behind one ``jax.custom_jvp``: the primal is
        ``Backward.run_loops`` (re-advances as ``lax.fori_loop``s of dynamic
        length: what a gradient runs, as fast as before and with XLA's loop
        optimisations intact -- hoisted constants, collectives after the loop);
        its derivative is that of ``Backward.run`` (only scans of static length),
        so the backward itself can be differentiated, forward or reverse (grad of
        grad, hessians), also after ``jit``."""
        if self.static:
            return Backward(self, res).run(cts)
        marks = res[4]
        res_leaves, res_tree = jax.tree_util.tree_flatten(res[:4])
        ct_leaves, ct_tree = jax.tree_util.tree_flatten(cts, is_leaf=zero)
        zeros = [zero(t) for t in ct_leaves]
        count = len(res_leaves)

        def rebuild(arrays: Sequence[Any]) -> tuple[Any, Any]:
            it = iter(arrays[count:])
            c = [t if z else next(it) for t, z in zip(ct_leaves, zeros, strict=True)]
            return ((*jax.tree_util.tree_unflatten(res_tree, list(arrays[:count])), marks),
                    jax.tree_util.tree_unflatten(ct_tree, c))

        def loops(*arrays: Any) -> Any:
            r, c = rebuild(arrays)
            return Backward(self, r).run_loops(c)

        def static(*arrays: Any) -> Any:
            r, c = rebuild(arrays)
            return Backward(self, r).run(c)

        f = jax.custom_jvp(loops)
        f.defjvp(lambda primals, tangents: jax.jvp(static, primals, tangents))
        return f(*res_leaves, *[t for t, z in zip(ct_leaves, zeros, strict=True) if not z])
