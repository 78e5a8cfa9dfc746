"""The backward pass of a binomial scan (``binomial_scan``): the reversals.

``Backward`` holds one pass's residuals (``init``, ``xs``, the constants, the
snapshot slots) and which inputs are differentiated. Two equal implementations,
which run exactly the Revolve tables' step evaluations (Griewank & Walther 2000):

* ``run_loops``: re-advances as ``lax.fori_loop``s of dynamic length -- XLA
  hoists the step's loop invariants and moves collectives out of them; on a
  GPU the host reads each iteration's loop test back;
* ``run``: only scans of static length (``revolve.program``: per reversal a
  ``lax.switch`` over its number of ops, each op a switch over fixed-length
  re-advance scans), so it can be differentiated (grad of grad) and has no loop
  of dynamic length (``backward: static``).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from autoremat._schedules.revolve import Program, program

PyTree = Any


def _inexact(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def zero(x: Any) -> bool:
    return isinstance(x, SymbolicZero)


class Backward:
    """One backward pass of a ``_Loop``: which inputs are differentiated, the
    residuals (``init``, ``xs``, ``consts``, the snapshot slots) and the ops of
    ``revolve.program``. ``run`` scans the reversals; each ``reversal``
    ``restore``s a carry, runs its ``ops`` (each ``op`` ``advance``s a static
    number of steps, keeping the carries the tables snapshot, and writes them
    into their slots) and ``vjp_step``: no loop has a dynamic trip count, so it
    can be differentiated. ``run_loops`` computes the same with ``fori_loop``s
    (what a plain gradient runs)."""

    def __init__(self, loop: Any, res: Any) -> None:
        init, self.xs, self.consts, self.slots, (init_m, xs_m, consts_m) = res
        self.loop, self.init_marks = loop, init_m
        self.carry_leaves, self.carry_tree = jax.tree_util.tree_flatten(init)
        self.diff = [_inexact(c) for c in self.carry_leaves]  # carry leaves with a cotangent
        self.x_diff = [m is not None for m in xs_m]
        self.k_diff = [m is not None for m in consts_m]
        self.initial = loop.tables.snapshots

    @functools.cached_property
    def program(self) -> Program:
        """The static ops (built only when ``run`` traces: a gradient does not)."""
        return program(self.loop.steps, self.loop.tables.snapshots)

    def incoming(self, cts: tuple[PyTree, PyTree]) -> tuple[list[Any], list[Any]]:
        """The differentiated carry leaves' cotangents (zeros for symbolic zeros) and the
        outputs' cotangent leaves (symbolic zeros kept: never read)."""
        ct_carry, ct_ys = cts
        ct_c = [
            jnp.zeros_like(c) if zero(t) else t
            for c, t, d in zip(self.carry_leaves, jax.tree_util.tree_leaves(
                ct_carry, is_leaf=zero), self.diff, strict=True) if d
        ]
        return ct_c, jax.tree_util.tree_leaves(ct_ys, is_leaf=zero)

    def run(self, cts: tuple[PyTree, PyTree]) -> tuple[Any, Any, Any]:
        ct_c, ct_y_leaves = self.incoming(cts)

        def body(state: tuple[Any, ...], index: jax.Array) -> tuple[tuple[Any, ...], Any]:
            return self.reversal(state, index, ct_y_leaves)

        acc = [jnp.zeros_like(k) for k, d in zip(self.consts, self.k_diff, strict=True) if d]
        (_, ct_c, acc), dxs = lax.scan(
            body, (self.slots, ct_c, acc), jnp.arange(self.loop.steps, dtype=jnp.int32),
            reverse=not self.loop.reverse)
        return self.cotangents(ct_c, dxs, acc)

    def reversal(self, state: tuple[Any, ...], index: jax.Array,
                 ct_y_leaves: list[Any]) -> tuple[tuple[Any, ...], Any]:
        """Reverse the step at data index ``index``: restore, its ops (a switch over
        the bucket sizes), its VJP. ``(slots, ct_c, acc) -> (..., dx)``. The VJP is
        in no conditional, so XLA treats it as in a plain loop: it hoists what the
        step computes of its constants (a concatenated kernel, ...) and, under a
        mesh, sums the constants' cotangents across devices once, after the loop."""
        slots, ct_c, acc = state
        p = self.program
        k = self.loop.steps - 1 - self.loop.index(index)  # reversal number
        carry = self.restore(slots, jnp.asarray(p.restore_slot)[k])
        branches = [functools.partial(self.ops, n) for n in p.sizes]
        carry, slots = lax.switch(jnp.asarray(p.bucket)[k], branches,
                                  (carry, slots, jnp.asarray(p.start)[k]))
        x = self.loop.x_at(self.xs, index)
        ct_y = [t if zero(t) else lax.dynamic_index_in_dim(t, index, 0, False)
                for t in ct_y_leaves]
        ct_y = [t for t in ct_y if _keep_y(t)]
        ct_c, dx, dk = self.vjp_step(carry, x, ct_c, ct_y)
        acc = [a + g for a, g in zip(acc, dk, strict=True)]
        return (slots, ct_c, acc), dx

    def ops(self, count: int, state: tuple[Any, ...]) -> tuple[Any, ...]:
        """Ops ``start .. start + count`` (``count`` static) of the program."""
        carry, slots, start = state
        if count == 0:
            return carry, slots
        p = self.program
        table = [jnp.asarray(a) for a in (p.branch, p.position, p.store_position,
                                          p.store_slot)]
        if count == 1:
            return self.op((carry, slots), [a[start] for a in table])
        rows = [lax.dynamic_slice_in_dim(a, start, count) for a in table]

        def body(st: tuple[Any, ...], row: list[jax.Array]) -> tuple[tuple[Any, ...], None]:
            return self.op(st, row), None

        return lax.scan(body, (carry, slots), rows)[0]

    def op(self, state: tuple[Any, ...], row: list[jax.Array]) -> tuple[Any, ...]:
        """One op: advance ``lengths[branch]`` steps, keeping the carries to store, and
        store them (unused entries have slot ``s``: out of bounds, dropped)."""
        carry, slots = state
        branch, position, store_position, store_slot = row
        # From the carry (not jnp.zeros(shape)): inside shard_map it has its manual axes.
        kept = [jnp.broadcast_to(jnp.zeros_like(c), (store_position.shape[0], *jnp.shape(c)))
                for c in carry]
        branches = [functools.partial(self.advance, n) for n in self.program.lengths]
        carry, kept = lax.switch(branch, branches, (carry, position, kept, store_position))
        slots = [buf.at[store_slot].set(v, mode="drop") for buf, v in zip(slots, kept, strict=True)]
        return carry, slots

    def run_loops(self, cts: tuple[PyTree, PyTree]) -> tuple[Any, Any, Any]:
        """``run`` with the re-advances as ``lax.fori_loop``s over the tables' pairs
        (dynamic trip counts): the same steps, no padding ops or switches."""
        ct_c, ct_y_leaves = self.incoming(cts)
        t = self.loop.tables
        pair_start, restore_position = jnp.asarray(t.pair_start), jnp.asarray(t.restore_position)
        pair_adv = jnp.asarray(np.append(t.pair_advance, 0))  # padded: never empty
        pair_slot = jnp.asarray(np.append(t.pair_slot, -1))

        def readvance(j: jax.Array, state: tuple[Any, ...]) -> tuple[Any, ...]:
            carry, position, slots = state

            def step(_: Any, st: tuple[Any, jax.Array]) -> tuple[Any, jax.Array]:
                c, p = st
                new, _ = self.loop.call(jax.tree_util.tree_unflatten(self.carry_tree, c),
                                        self.loop.x_at(self.xs, self.loop.index(p)), self.consts)
                return jax.tree_util.tree_leaves(new), p + 1

            carry, position = lax.fori_loop(0, pair_adv[j], step, (carry, position))
            target = pair_slot[j]
            take, k = target >= 0, jnp.maximum(target, 0)
            slots = [lax.dynamic_update_index_in_dim(
                         buf, jnp.where(take, c, lax.dynamic_index_in_dim(buf, k, 0, False)), k, 0)
                     for buf, c in zip(slots, carry, strict=True)]
            return carry, position, slots

        def body(state: tuple[Any, ...], index: jax.Array) -> tuple[tuple[Any, ...], Any]:
            slots, ct_c, acc = state
            k = self.loop.steps - 1 - self.loop.index(index)  # reversal number
            carry = self.restore(slots, jnp.asarray(t.restore_slot)[k])
            carry, _, slots = lax.fori_loop(pair_start[k], pair_start[k + 1], readvance,
                                            (carry, restore_position[k], slots))
            x = self.loop.x_at(self.xs, index)
            ct_y = [t if zero(t) else lax.dynamic_index_in_dim(t, index, 0, False)
                    for t in ct_y_leaves]
            ct_c, dx, dk = self.vjp_step(carry, x, ct_c, [t for t in ct_y if _keep_y(t)])
            return (slots, ct_c, [a + g for a, g in zip(acc, dk, strict=True)]), dx

        acc = [jnp.zeros_like(k) for k, d in zip(self.consts, self.k_diff, strict=True) if d]
        (_, ct_c, acc), dxs = lax.scan(
            body, (self.slots, ct_c, acc), jnp.arange(self.loop.steps, dtype=jnp.int32),
            reverse=not self.loop.reverse)
        return self.cotangents(ct_c, dxs, acc)

    def restore(self, slots: list[jax.Array], slot: jax.Array) -> list[jax.Array]:
        """The carry leaves in ``slot``: a snapshot, or ``init`` (slot ``s``)."""
        use_init = slot == self.initial
        safe = jnp.minimum(slot, self.initial - 1)
        return [jnp.where(use_init, c0, lax.dynamic_index_in_dim(buf, safe, 0, False))
                for c0, buf in zip(self.carry_leaves, slots, strict=True)]

    def advance(self, count: int, state: tuple[Any, ...]) -> tuple[Any, ...]:
        """``count`` (static) steps from the carry before ``position``; the carry before
        step ``store_position[i]`` goes to ``kept[i]``."""
        carry, position, kept, store_position = state
        if count == 0:
            return carry, kept

        def body(st: tuple[Any, ...], _: None) -> tuple[tuple[Any, ...], None]:
            c, p, kept = st
            hit = store_position == p
            kept = [jnp.where(hit.reshape((-1,) + (1,) * v.ndim), v[None], k)
                    for k, v in zip(kept, c, strict=True)]
            new, _ = self.loop.call(jax.tree_util.tree_unflatten(self.carry_tree, c),
                                    self.loop.x_at(self.xs, self.loop.index(p)), self.consts)
            return (jax.tree_util.tree_leaves(new), p + 1, kept), None

        carry, _, kept = lax.scan(body, (carry, position, kept), None, length=count)[0]
        return carry, kept

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
        ct_y_full = [jnp.zeros_like(v) if zero(t) else t.astype(v.dtype)
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
