"""The binomial (Revolve) scan: ``O(log T)`` stored carries, the fewest re-runs.

A ``jax.custom_vjp`` around the whole loop (Griewank & Walther 2000,
"Algorithm 799: Revolve"; its tables are ``autoremat._schedules.revolve``):

* forward: one ``lax.scan`` over the ``T`` steps that also writes the carry
  into a buffer of ``s`` slots at the tables' positions -- ``s`` carries, no
  per-step residuals;
* backward: a ``lax.scan`` over the reversals; each restores a slot,
  re-advances (``lax.fori_loop``, storing new snapshots on the way) to the
  step it reverses and runs that step's ``jax.vjp``.

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
from jax.custom_derivatives import SymbolicZero

from autoremat._errors import ScheduleError
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
) -> tuple[PyTree, PyTree]:
    """Run ``steps >= 1`` steps of ``step(carry, x_leaves)``; outputs stacked on axis 0.

    ``label`` (the schedule's ``describe()``) names it in errors.
    """
    x_first = [lax.index_in_dim(x, 0, a, keepdims=False) for x, a in zip(leaves, axes, strict=True)]
    fn, consts = jax.closure_convert(step, init, x_first)
    loop = _Loop(fn, tables(steps, snapshots), tuple(axes), reverse, unroll, label)
    return loop.run(init, leaves, consts)


def _traced_by(name: str, *trees: Any) -> bool:
    """Whether a leaf is a tracer of JAX's ``ad.<name>`` (``JVPTracer``: forward mode;
    ``LinearizeTracer``: reverse mode). Private classes: with a jax without them
    the answer is ``False`` and JAX's own errors apply."""
    from jax._src.interpreters import ad

    kind = getattr(ad, name, None)
    return isinstance(kind, type) and any(
        isinstance(leaf, kind) for leaf in jax.tree_util.tree_leaves(trees))


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


def _inexact(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _zero(x: Any) -> bool:
    return isinstance(x, SymbolicZero)


class _Loop:
    """One binomial scan: the step (closure-converted), the Revolve tables, the layout."""

    def __init__(self, fn: Callable[..., Any], tables_: Tables, axes: tuple[int, ...],
                 reverse: bool, unroll: int, label: str) -> None:
        self.fn, self.tables, self.axes = fn, tables_, axes
        self.reverse, self.unroll, self.label = reverse, unroll, label
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

    def advance(self, carry: PyTree, position: jax.Array, count: jax.Array,
                xs: Sequence[jax.Array], consts: Sequence[Any]) -> tuple[PyTree, jax.Array]:
        def body(_: Any, state: tuple[PyTree, jax.Array]) -> tuple[PyTree, jax.Array]:
            c, p = state
            c, _ = self.call(c, self.x_at(xs, self.index(p)), consts)
            return c, p + 1

        return lax.fori_loop(0, count, body, (carry, position))

    # -- the custom VJP ----------------------------------------------------------
    def run(self, init: PyTree, xs: list[jax.Array], consts: list[Any]) -> tuple[PyTree, PyTree]:
        """The loop under a ``jax.custom_vjp``; in pure forward mode (``jax.jvp``,
        ``jax.jacfwd``) the plain forward sweep, whose JVP stores nothing either."""
        if _traced_by("JVPTracer", init, xs, consts) and getattr(
                jax.config, "jax_use_direct_linearize", True):
            return self.forward(init, xs, consts, keep=False)[0]
        if _traced_by("LinearizeTracer", init, xs, consts) and _under_linearize():
            raise ScheduleError(
                f"schedule {self.label!r}: jax.linearize is not supported by the binomial "
                "kind: its backward pass is a custom VJP, which has no forward-mode linear "
                "map. Use jax.jvp (supported), or a nested schedule (e.g. Schedule.root(T, 2)) "
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
            if _traced_by("LinearizeTracer", res[:4]):
                raise ScheduleError(
                    f"schedule {self.label!r}: the binomial kind's backward pass cannot be "
                    "differentiated in reverse mode (grad of grad, jax.jacrev of a gradient): "
                    "its re-advances are loops of dynamic length. Use a nested schedule "
                    "(e.g. Schedule.root(T, 2)) or forward-over-reverse (jax.jacfwd(jax.grad(f)), "
                    "jax.hessian).")
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
        """The reversals, last step first: restore, re-advance, the step's VJP."""
        return _Backward(self, res).run(cts)


class _Backward:
    """One backward pass of a ``_Loop``: which inputs are differentiated, the
    residuals (``init``, ``xs``, ``consts``, the snapshot slots) and the tables as
    arrays. ``run`` scans the reversals; each ``reversal`` ``restore``s a carry,
    ``readvance``s it to the step it reverses and runs ``vjp_step``."""

    def __init__(self, loop: _Loop, res: Any) -> None:
        init, self.xs, self.consts, self.slots, (init_m, xs_m, consts_m) = res
        self.loop, self.init_marks = loop, init_m
        self.carry_leaves, self.carry_tree = jax.tree_util.tree_flatten(init)
        self.diff = [_inexact(c) for c in self.carry_leaves]  # carry leaves with a cotangent
        self.x_diff = [m is not None for m in xs_m]
        self.k_diff = [m is not None for m in consts_m]
        p = loop.tables
        self.restore_slot = jnp.asarray(p.restore_slot)
        self.restore_pos = jnp.asarray(p.restore_position)
        self.pair_start = jnp.asarray(p.pair_start)
        self.pair_adv = jnp.asarray(np.append(p.pair_advance, 0))  # padded: never empty
        self.pair_slot = jnp.asarray(np.append(p.pair_slot, -1))
        self.initial = p.snapshots

    def run(self, cts: tuple[PyTree, PyTree]) -> tuple[Any, Any, Any]:
        ct_carry, ct_ys = cts
        ct_c = [
            jnp.zeros_like(c) if _zero(t) else t
            for c, t, d in zip(self.carry_leaves, jax.tree_util.tree_leaves(
                ct_carry, is_leaf=_zero), self.diff, strict=True) if d
        ]
        ct_y_leaves = jax.tree_util.tree_leaves(ct_ys, is_leaf=_zero)

        def body(state: tuple[Any, ...], index: jax.Array) -> tuple[tuple[Any, ...], Any]:
            return self.reversal(state, index, ct_y_leaves)

        acc = [jnp.zeros_like(k) for k, d in zip(self.consts, self.k_diff, strict=True) if d]
        (ct_c, _, acc), dxs = lax.scan(
            body, (ct_c, self.slots, acc), jnp.arange(self.loop.steps, dtype=jnp.int32),
            reverse=not self.loop.reverse,
        )
        return self.cotangents(ct_c, dxs, acc)

    def reversal(self, state: tuple[Any, ...], index: jax.Array,
                 ct_y_leaves: list[Any]) -> tuple[tuple[Any, ...], Any]:
        """Reverse the step at data index ``index``: ``(ct_c, slots, acc) -> (..., dx)``."""
        ct_c, slots, acc = state
        k = self.loop.steps - 1 - self.loop.index(index)  # reversal number
        carry = self.restore(slots, k)
        carry, _, slots = lax.fori_loop(self.pair_start[k], self.pair_start[k + 1],
                                        self.readvance, (carry, self.restore_pos[k], slots))
        x = self.loop.x_at(self.xs, index)
        ct_y = [t if _zero(t) else lax.dynamic_index_in_dim(t, index, 0, False)
                for t in ct_y_leaves]
        ct_y = [t for t in ct_y if _keep_y(t)]
        ct_c, dx, dk = self.vjp_step(carry, x, ct_c, ct_y)
        acc = [a + g for a, g in zip(acc, dk, strict=True)]
        return (ct_c, slots, acc), dx

    def restore(self, slots: list[jax.Array], k: jax.Array) -> list[jax.Array]:
        """The carry leaves reversal ``k`` starts from: a snapshot slot, or ``init``."""
        slot = self.restore_slot[k]
        use_init = slot == self.initial
        safe = jnp.minimum(slot, self.initial - 1)
        return [jnp.where(use_init, c0, lax.dynamic_index_in_dim(buf, safe, 0, False))
                for c0, buf in zip(self.carry_leaves, slots, strict=True)]

    def readvance(self, j: jax.Array, state: tuple[Any, ...]) -> tuple[Any, ...]:
        """Pair ``j`` of the tables: advance ``pair_adv[j]`` steps, then store the carry
        in slot ``pair_slot[j]`` (none if ``-1``)."""
        carry, position, slots = state
        c, position = self.loop.advance(jax.tree_util.tree_unflatten(self.carry_tree, carry),
                                        position, self.pair_adv[j], self.xs, self.consts)
        carry = jax.tree_util.tree_leaves(c)
        target = self.pair_slot[j]
        take = target >= 0
        t = jnp.maximum(target, 0)
        slots = [
            lax.dynamic_update_index_in_dim(
                buf, jnp.where(take, c, lax.dynamic_index_in_dim(buf, t, 0, False)), t, 0)
            for buf, c in zip(slots, carry, strict=True)
        ]
        return carry, position, slots

    def vjp_step(self, carry: list[jax.Array], x: list[jax.Array], ct_c: list[jax.Array],
                 ct_y: list[Any]) -> tuple[list[jax.Array], list[jax.Array], list[Any]]:
        """The step's VJP w.r.t. the differentiated carry, ``x`` and consts leaves."""
        diff, x_diff, k_diff, consts = self.diff, self.x_diff, self.k_diff, self.consts

        def f(c_d: list[jax.Array], x_d: list[jax.Array], k_d: list[Any]) -> Any:
            it_c, it_x, it_k = iter(c_d), iter(x_d), iter(k_d)
            c = [next(it_c) if d else v for v, d in zip(carry, diff, strict=True)]
            xx = [next(it_x) if d else v for v, d in zip(x, x_diff, strict=True)]
            kk = [next(it_k) if d else v for v, d in zip(consts, k_diff, strict=True)]
            new_c, y = self.loop.call(jax.tree_util.tree_unflatten(self.carry_tree, c), xx, kk)
            new_leaves = jax.tree_util.tree_leaves(new_c)
            y_leaves = jax.tree_util.tree_leaves(y)
            return ([v for v, d in zip(new_leaves, diff, strict=True) if d],
                    [v for v in y_leaves if _inexact(v)])

        primals = (
            [v for v, d in zip(carry, diff, strict=True) if d],
            [v for v, d in zip(x, x_diff, strict=True) if d],
            [v for v, d in zip(consts, k_diff, strict=True) if d],
        )
        (_, y_out), pullback = jax.vjp(f, *primals)
        ct_y_full = [jnp.zeros_like(v) if _zero(t) else t.astype(v.dtype)
                     for v, t in zip(y_out, ct_y, strict=True)]
        return pullback((ct_c, ct_y_full))

    def cotangents(self, ct_c: list[jax.Array], dxs: list[jax.Array],
                   acc: list[Any]) -> tuple[Any, Any, Any]:
        """The cotangents of ``(init, xs, consts)``, ``None`` where nobody asked for one."""
        it = iter(ct_c)
        ct_init = [next(it) if d else None for d in self.diff]
        ct_init = [c if m is not None else None
                   for c, m in zip(ct_init, self.init_marks, strict=True)]
        it_x = iter(dxs)
        ct_xs = [jnp.moveaxis(next(it_x), 0, a) if d else None
                 for d, a in zip(self.x_diff, self.loop.axes, strict=True)]
        it_k = iter(acc)
        ct_k = [next(it_k) if d else None for d in self.k_diff]
        return (jax.tree_util.tree_unflatten(self.carry_tree, ct_init), ct_xs, ct_k)


def _keep_y(t: Any) -> bool:
    """Output cotangents passed to the step's VJP: those of inexact outputs."""
    if isinstance(t, SymbolicZero):
        aval: Any = t.aval
        return jnp.issubdtype(aval.dtype, jnp.inexact)
    return _inexact(t) and jnp.result_type(t) != jax.dtypes.float0
