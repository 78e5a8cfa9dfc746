"""The binomial (Revolve) kind against a plain lax.scan, and its step count.

Gradients must equal a plain scan's (float32, rtol 1e-5) on every kind's matrix
of cells, pytrees, T and options (``test_scan``, ``helpers.kind_matrix``), and
for every ``s`` from 1 to T; the
number of step evaluations counted at run time must equal the optimum of an
independent dynamic program.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import autoremat
from autoremat import Schedule
from autoremat._models.seed_lstm import seed_lstm
from tests.helpers import _temp_bytes, assert_close, brute_advances

SLOW = pytest.mark.slow


def _tanh_loss(w: jax.Array, c0: jax.Array, xs: jax.Array, schedule: Schedule | None,
               reverse: bool = False) -> jax.Array:
    def f(c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        c = jnp.tanh(c @ w + x)
        return c, c * x

    if schedule is None:
        c, ys = lax.scan(f, c0, xs, reverse=reverse)
    else:
        c, ys = autoremat.scan(f, c0, xs, schedule=schedule, reverse=reverse)
    return c.sum() + jnp.sum(ys**2 * jnp.arange(1.0, xs.shape[0] + 1)[:, None])


def test_every_snapshot_count_from_1_to_T() -> None:
    steps = 13
    w = jnp.array([[0.5, -0.4, 0.1], [0.2, 0.6, -0.3], [-0.1, 0.3, 0.7]])
    xs = jnp.cos(jnp.arange(steps * 3, dtype=jnp.float32)).reshape(steps, 3)
    c0 = jnp.array([1.0, -0.5, 0.25])
    grad = jax.jit(jax.value_and_grad(_tanh_loss, argnums=(0, 1, 2)), static_argnums=(3, 4))
    for reverse, snapshots in ((False, [*range(1, steps + 1), 40]), (True, [1, 4, steps])):
        want = grad(w, c0, xs, None, reverse)
        for s in snapshots:
            assert_close(grad(w, c0, xs, autoremat.binomial(s), reverse), want)


def test_xs_none_and_integer_carry() -> None:
    """No inputs (``length=``), and a carry with an int32 counter next to the state."""
    w = jnp.array([[0.9, -0.2], [0.3, 0.8]])

    def loss(w: jax.Array, schedule: Schedule | None) -> tuple[jax.Array, jax.Array]:
        def f(c: Any, _: None) -> tuple[Any, jax.Array]:
            h, n = c
            h = jnp.tanh(h @ w + 0.1 * n.astype(jnp.float32))
            return (h, n + 1), h[0]

        init = (jnp.ones(2), jnp.int32(0))
        if schedule is None:
            (h, n), ys = lax.scan(f, init, None, length=23)
        else:
            (h, n), ys = autoremat.scan(f, init, None, length=23, schedule=schedule)
        return h.sum() + jnp.sum(ys * jnp.arange(23.0)), n

    want = jax.value_and_grad(loss, has_aux=True)(w, None)
    for s in (1, 3, 23):
        got = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(
            w, autoremat.binomial(s))
        assert_close(got, want)
        assert int(got[0][1]) == 23


def test_only_what_is_differentiated_gets_a_cotangent() -> None:
    """Gradient w.r.t. the params alone equals the reference (xs, carry untouched)."""
    w = jnp.eye(3) * 0.7
    xs = jnp.sin(jnp.arange(60.0)).reshape(20, 3)
    c0 = jnp.ones(3)
    want = jax.grad(_tanh_loss)(w, c0, xs, None)
    got = jax.jit(jax.grad(_tanh_loss), static_argnums=3)(w, c0, xs, autoremat.binomial(4))
    assert_close(got, want)


# --- step evaluations counted at run time vs an independent dynamic program ----


def _dp_evaluations(steps: int, snapshots: int) -> int:
    """Step runs of forward + backward by the brute-force DP (``helpers``): its
    advances include the T - 1 of the first sweep; + 1 for the last step's
    forward, + T for the reversals (VJPs)."""
    return brute_advances(steps, min(snapshots, steps)) + 1 + steps


def _counted_evaluations(steps: int, snapshots: int, backward: str = "loops") -> int:
    count = [0]

    def tick(_: Any) -> None:
        count[0] += 1

    def loss(w: jax.Array) -> jax.Array:
        def f(c: jax.Array, _: None) -> tuple[jax.Array, None]:
            jax.debug.callback(tick, c)
            return jnp.tanh(c * w + 0.1), None

        c, _ = autoremat.scan(f, jnp.float32(0.3), None, length=steps,
                              schedule=autoremat.binomial(snapshots, backward=backward))
        return c

    grad = jax.jit(jax.grad(loss))
    grad.lower(0.5).compile()  # no run at compile time: only the call below counts
    jax.block_until_ready(grad(0.5))
    jax.effects_barrier()
    return count[0]


# CI runs a spread of (T, s); `-m slow` runs every T <= 120, s <= 8.
QUICK = [(1, 1), (2, 1), (5, 2), (10, 3), (17, 4), (31, 8), (64, 5), (97, 6), (120, 8), (50, 1)]


@pytest.mark.parametrize(("steps", "snapshots"), QUICK)
def test_counted_evaluations_equal_the_optimum(steps: int, snapshots: int) -> None:
    assert _counted_evaluations(steps, snapshots) == _dp_evaluations(steps, snapshots)
    if steps in (10, 97):  # the static backward runs the same steps (padding ops run none)
        assert _counted_evaluations(steps, snapshots, "static") == _dp_evaluations(
            steps, snapshots)
    assert autoremat.bounds.min_evaluations(steps, min(snapshots, steps)) == _dp_evaluations(
        steps, snapshots)


@pytest.mark.slow
def test_counted_evaluations_equal_the_optimum_for_all_small_T() -> None:
    for steps in range(1, 121):
        for snapshots in range(1, 9):
            counted = _counted_evaluations(steps, snapshots)
            assert counted == _dp_evaluations(steps, snapshots), (steps, snapshots, counted)


# --- memory -----------------------------------------------------------------------


@pytest.mark.slow
def test_memory_at_1e5_is_under_5_mb_and_inputs_get_no_cotangent() -> None:
    """The seed's train step (seq2seq=False) at T=10^5 with s=32: temp <= 5 MB.

    The 128 MB input is not differentiated: no T-long cotangent buffer exists.
    """
    problem = seed_lstm(seq_len=100_000, seq2seq=False)
    temp = _temp_bytes(problem, autoremat.binomial(32))
    assert temp <= 5e6, temp
    assert temp < 0.05 * (10 * 100_000 * 32 * 4)


# --- the backward is differentiable: grad of grad, hessian-vector products ---------


_W = jnp.array([[0.5, -0.4, 0.1], [0.2, 0.6, -0.3], [-0.1, 0.3, 0.7]])
_XS = jnp.cos(jnp.arange(17 * 3, dtype=jnp.float32)).reshape(17, 3)
_C0 = jnp.array([1.0, -0.5, 0.25])


def _hvp(schedule: Schedule | None, reverse: bool) -> Any:
    """Reverse-over-reverse hessian-vector products w.r.t. (w, c0, xs): the grad
    of ``<grad f, v>``, so the backward pass itself is differentiated in reverse."""
    args = (_W, _C0, _XS)
    v = jax.tree_util.tree_map(lambda a: jnp.sin(jnp.arange(a.size, dtype=a.dtype)).reshape(
        a.shape), args)

    def inner(w: jax.Array, c0: jax.Array, xs: jax.Array) -> jax.Array:
        g = jax.grad(_tanh_loss, argnums=(0, 1, 2))(w, c0, xs, schedule, reverse)
        return sum(jnp.vdot(a, b) for a, b in zip(g, v, strict=True))

    return jax.grad(inner, argnums=(0, 1, 2))(*args)


@pytest.mark.parametrize(("snapshots", "reverse"), [(1, False), pytest.param(3, False, marks=SLOW),
                                                   (4, True), pytest.param(17, False, marks=SLOW)])
def test_grad_of_grad_equals_lax_scan(snapshots: int, reverse: bool) -> None:
    assert_close(_hvp(autoremat.binomial(snapshots), reverse), _hvp(None, reverse))


def test_grad_of_grad_inside_jit_and_of_traced_scans() -> None:
    """The scan traced before the second grad reaches it (jit, checkpoint) differentiates
    too: no loop of dynamic length is left in the backward."""
    schedule = autoremat.binomial(3)

    def f(w: jax.Array, s: Schedule | None) -> jax.Array:
        return _tanh_loss(w, _C0, _XS, s)

    def total_grad(g: Any) -> Any:
        return lambda w: jnp.sum(g(w) ** 2)

    want = jax.grad(total_grad(jax.grad(lambda w: f(w, None))))(_W)
    cases = {
        "jit(grad(grad))": jax.jit(jax.grad(total_grad(jax.grad(lambda w: f(w, schedule))))),
        "grad(grad(jit))": jax.grad(total_grad(jax.grad(jax.jit(lambda w: f(w, schedule))))),
        "grad(jit(grad))": jax.grad(total_grad(jax.jit(jax.grad(lambda w: f(w, schedule))))),
        "grad(grad(checkpoint))": jax.grad(total_grad(jax.grad(
            jax.checkpoint(lambda w: f(w, schedule))))),
    }
    for name, g in cases.items():
        got = g(_W)
        assert jnp.all(jnp.isfinite(got)), name
        assert_close(got, want)


@SLOW  # reverse over reverse, as grad of grad above (9 s)
def test_jacrev_of_grad_equals_lax_scan() -> None:
    def f(w: jax.Array, s: Schedule | None) -> jax.Array:
        return _tanh_loss(w, _C0, _XS, s)

    want = jax.hessian(lambda w: f(w, None))(_W)
    got = jax.jit(jax.jacrev(jax.grad(lambda w: f(w, autoremat.binomial(2)))))(_W)
    assert_close(got, want)


def test_the_differentiated_backward_has_no_while_loop() -> None:
    """Grad of grad runs the backward whose loops are all ``scan``s (static trip
    counts), none a ``while``; the first-order gradient keeps its ``fori_loop``s,
    unless the schedule asks for the static backward."""
    def f(w: jax.Array, backward: str = "loops") -> jax.Array:
        return _tanh_loss(w, _C0, _XS, autoremat.binomial(3, backward=backward))

    first = str(jax.make_jaxpr(jax.grad(f))(_W))
    second = str(jax.make_jaxpr(jax.grad(lambda w: jnp.sum(jax.grad(f)(w) ** 2)))(_W))
    static = str(jax.make_jaxpr(jax.grad(lambda w: f(w, "static")))(_W))
    assert "while[" in first
    assert "scan[" in second and "while[" not in second
    assert "scan[" in static and "while[" not in static and "custom_jvp_call" not in static


@pytest.mark.parametrize("snapshots", [pytest.param(1, marks=SLOW), 4, 17])
def test_the_static_backward_equals_lax_scan_to_second_order(snapshots: int) -> None:
    """``backward: static``: the gradient (no loop of dynamic length), and its own
    derivative, equal ``lax.scan``'s."""
    schedule = autoremat.binomial(snapshots, backward="static")
    grad = jax.jit(jax.grad(_tanh_loss, argnums=(0, 1, 2)), static_argnums=(3, 4))
    for reverse in (False, True):
        assert_close(grad(_W, _C0, _XS, schedule, reverse), grad(_W, _C0, _XS, None, reverse))
    assert_close(_hvp(schedule, False), _hvp(None, False))


def test_the_backward_ops_run_exactly_the_tables_advances() -> None:
    """``_revolve.program``: static-length ops that re-advance exactly the tables' steps
    (padding ops run none), take every snapshot, and bring each reversal from the
    carry it restores to the step it reverses."""
    import numpy as np

    from autoremat._schedules.revolve import program, tables

    for steps, snapshots in [(1, 1), (2, 1), (13, 1), (13, 4), (64, 5), (97, 6), (300, 8),
                             (1000, 7)]:
        p, t = program(steps, snapshots), tables(steps, snapshots)
        lengths = np.asarray(p.lengths)[p.branch]
        assert int(lengths.sum()) == t.advances
        assert int((p.store_slot < t.snapshots).sum()) == int((t.pair_slot >= 0).sum())
        assert list(p.restore_slot) == list(t.restore_slot)
        for k in range(steps):
            rows = range(int(p.start[k]), int(p.start[k]) + p.sizes[int(p.bucket[k])])
            position = int(t.restore_position[k])
            for i in rows:
                assert lengths[i] == 0 or int(p.position[i]) == position, (steps, k, i)
                position += int(lengths[i])
            assert position == steps - 1 - k, (steps, snapshots, k)


def test_grad_of_grad_with_an_integer_carry_under_vmap_and_jit() -> None:
    """An int32 counter in the carry (its tangent is float0) and xs, vmapped and jitted."""
    def loss(w: jax.Array, schedule: Schedule | None) -> jax.Array:
        def f(c: Any, x: jax.Array) -> tuple[Any, jax.Array]:
            h, n = c
            h = jnp.tanh(h @ w + 0.1 * n.astype(jnp.float32) + x)
            return (h, n + 1), h[0]

        init = (jnp.ones(2), jnp.int32(0))
        xs = jnp.sin(jnp.arange(46.0)).reshape(23, 2)
        if schedule is None:
            (h, _), ys = lax.scan(f, init, xs)
        else:
            (h, _), ys = autoremat.scan(f, init, xs, schedule=schedule)
        return h.sum() + jnp.sum(ys * jnp.arange(23.0))

    def gg(schedule: Schedule | None) -> Any:
        return jax.vmap(jax.grad(lambda w: jnp.sum(jax.grad(loss)(w, schedule) ** 2)))

    ws = jnp.stack([jnp.array([[0.9, -0.2], [0.3, 0.8]]), jnp.array([[0.4, 0.1], [-0.2, 0.5]])])
    assert_close(jax.jit(gg(autoremat.binomial(3)))(ws), gg(None)(ws))
