"""``autoremat.remat_scans``: unmodified code's long scans run under a schedule.

Every front end that lowers to ``lax.scan`` gives the unmodified function's
loss and gradients (rtol 1e-5) and a smaller compiled temp; the edge cases of
issue 20 and each misuse's message are checked here. NNX state, ``describe``
and ``Problem.from_loss`` are in ``tests/test_remat_scans.py``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import REWRITE_T as T
from helpers import REWRITE_W as W
from helpers import REWRITE_X as X
from helpers import assert_close, rnn_step, scan_loss
from jax import lax

import autoremat
from autoremat import RematScansWarning, Schedule

NESTED = autoremat.nested([10, 20])


def assert_same_grads(fn: Callable[..., Any], *args: Any, schedule: Schedule = NESTED,
                      smaller: bool = False, **kw: Any) -> Any:
    """value_and_grad of the wrapped fn equals the unmodified one's (rtol 1e-5); with
    ``smaller`` its compiled temp memory is also below 0.7x the unmodified one's."""
    wrapped = autoremat.remat_scans(fn, schedule, **kw)
    ref_step = jax.jit(jax.value_and_grad(fn)).lower(*args).compile()
    got_step = jax.jit(jax.value_and_grad(wrapped)).lower(*args).compile()
    assert_close(got_step(*args), ref_step(*args))
    if smaller:
        assert temp_bytes(got_step) < 0.7 * temp_bytes(ref_step)
    return wrapped


def temp_bytes(compiled: Any) -> int:
    return int(compiled.memory_analysis().temp_size_in_bytes)


def grad_temp(fn: Callable[..., Any], *args: Any) -> int:
    return temp_bytes(jax.jit(jax.grad(fn)).lower(*args).compile())


# -- front ends ------------------------------------------------------------------------------

def test_lax_scan() -> None:
    assert_same_grads(scan_loss, W, X, smaller=True)


def test_fori_loop_with_static_bounds() -> None:
    def loss(p: Any, x: jax.Array) -> jax.Array:
        def body(t: jax.Array, h: jax.Array) -> jax.Array:
            return rnn_step(p, h, lax.dynamic_index_in_dim(x, t, 1, keepdims=False))

        return jnp.mean(lax.fori_loop(0, T, body, jnp.zeros((2, 8))) ** 2)

    wrapped = assert_same_grads(loss, W, X)
    assert wrapped.describe(W, X).rewritten[0].length == T


class SeedLSTM(nn.Module):
    """The report's model (``nn.scan``, ``@nn.remat`` on ``__call__``), small."""

    @functools.partial(nn.scan, variable_broadcast="params", in_axes=1, out_axes=1,
                       split_rngs={"params": False})
    def forward(self, carry: Any, x: jax.Array) -> Any:
        return nn.OptimizedLSTMCell(16, name="cell")(carry, x)

    @nn.remat
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        carry = nn.OptimizedLSTMCell(16, parent=None).initialize_carry(
            jax.random.PRNGKey(0), x[:, 0].shape)
        _, ys = self.forward(carry, x)
        return nn.Dense(2)(ys)


def linen_loss(model: nn.Module, x: jax.Array = X) -> tuple[Callable[..., Any], Any]:
    params = model.init(jax.random.PRNGKey(0), x)["params"]

    def loss(p: Any, x: jax.Array) -> jax.Array:
        return jnp.mean(model.apply({"params": p}, x) ** 2)

    return loss, params


@pytest.mark.parametrize("make", [
    SeedLSTM,
    lambda: nn.RNN(nn.LSTMCell(16)),
    pytest.param(lambda: nn.Bidirectional(nn.RNN(nn.GRUCell(8)), nn.RNN(nn.GRUCell(8))),
                 marks=pytest.mark.slow),  # two nn.RNNs: the nn.RNN case, twice
], ids=["nn.scan", "nn.RNN", "nn.Bidirectional"])
def test_linen_front_ends(make: Callable[[], nn.Module]) -> None:
    loss, params = linen_loss(make())
    assert_same_grads(loss, params, X, smaller=True)


def test_batch_major_input_is_not_copied_time_major() -> None:
    # nn.scan(in_axes=1) hands lax.scan a transposed x; the rewrite scans x in place:
    # the wrapped step has the explicit API's memory. Wide inputs make the copy count.
    x = jnp.ones((2, T, 256))
    loss, params = linen_loss(SeedLSTM(), x)

    class Explicit(SeedLSTM):
        @functools.partial(autoremat.linen.scan, variable_broadcast="params", in_axes=1,
                           out_axes=1, split_rngs={"params": False}, schedule=NESTED)
        def forward(self, carry: Any, x: jax.Array) -> Any:
            return nn.OptimizedLSTMCell(16, name="cell")(carry, x)

    explicit = linen_loss(Explicit(), x)[0]
    wrapped = autoremat.remat_scans(loss, NESTED)
    copy = x.size * 4
    assert grad_temp(wrapped, params, x) <= grad_temp(explicit, params, x) + copy // 10


def test_equinox() -> None:
    eqx = pytest.importorskip("equinox")
    cell = eqx.nn.GRUCell(3, 8, key=jax.random.PRNGKey(0))

    def loss(cell: Any, x: jax.Array) -> jax.Array:
        _, hs = lax.scan(lambda h, xt: (cell(xt, h),) * 2, jnp.zeros(8), x[0])
        return jnp.mean(hs ** 2)

    params, static = eqx.partition(cell, eqx.is_array)
    assert_same_grads(lambda p, x: loss(eqx.combine(p, static), x), params, X)


# -- where the scan sits ---------------------------------------------------------------------

def test_inside_jit_checkpoint_cond_and_switch() -> None:
    def loss(p: Any, x: jax.Array, flag: jax.Array) -> jax.Array:
        inner = jax.jit(jax.checkpoint(scan_loss))
        a = lax.cond(flag > 0, inner, lambda p, x: jnp.sum(x) * 0.0, p, x)
        b = lax.switch(1, [lambda: 0.0, lambda: scan_loss(p, x * 2.0)])
        return a + b

    wrapped = assert_same_grads(loss, W, X, jnp.int32(1))
    assert len(wrapped.describe(W, X, jnp.int32(1)).rewritten) == 2


def test_short_outer_scan_over_layers_holding_a_long_scan() -> None:
    layers = {"w": jnp.stack([W["w"]] * 3), "u": jnp.stack([W["u"]] * 3)}

    def loss(ps: Any, x: jax.Array) -> jax.Array:
        def layer(total: jax.Array, p: Any) -> tuple[jax.Array, None]:
            return total + scan_loss(p, x), None

        return lax.scan(layer, 0.0, ps)[0]

    wrapped = assert_same_grads(loss, layers, X, smaller=True)
    report = wrapped.describe(layers, X)
    assert [s.action for s in report.scans] == ["too short", "rewritten"]


def test_two_long_scans_and_a_binomial_schedule() -> None:
    def loss(p: Any, x: jax.Array) -> jax.Array:
        return scan_loss(p, x) + scan_loss(p, x[:, : T // 2] * 0.5)

    wrapped = assert_same_grads(loss, W, X, schedule=autoremat.binomial(4))
    assert [s.length for s in wrapped.describe(W, X).rewritten] == [T, T // 2]


# -- edge cases ------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{"reverse": True}, {"unroll": 3}], ids=["reverse", "unroll"])
def test_reverse_and_unroll_and_a_remainder(kw: dict[str, Any]) -> None:
    x = X[:, :T - 13]  # 187 steps: nested 10x20 leaves a remainder

    def loss(p: Any, x: jax.Array) -> jax.Array:
        def step(h: jax.Array, xt: jax.Array) -> tuple[jax.Array, jax.Array]:
            h = rnn_step(p, h, xt)
            return h, h.sum()

        h, s = lax.scan(step, jnp.zeros((2, 8)), jnp.moveaxis(x, 1, 0), **kw)
        return jnp.mean(h ** 2) + jnp.mean(s * jnp.arange(s.shape[0]))

    assert_same_grads(loss, W, x)


def test_typed_prng_keys_in_the_carry() -> None:
    def loss(p: Any, x: jax.Array) -> jax.Array:
        def step(carry: Any, xt: jax.Array) -> Any:
            h, key = carry
            key, sub = jax.random.split(key)
            keep = jax.random.bernoulli(sub, 0.8, h.shape)
            h = jnp.where(keep, rnn_step(p, h, xt), 0.0)
            return (h, key), None

        (h, _), _ = lax.scan(step, (jnp.zeros((2, 8)), jax.random.key(0)),
                             jnp.moveaxis(x, 1, 0))
        return jnp.mean(h ** 2)

    assert_same_grads(loss, W, X)


def test_dropout_in_nn_scan() -> None:
    class Drop(nn.Module):
        @functools.partial(nn.scan, variable_broadcast="params", in_axes=1, out_axes=1,
                           split_rngs={"params": False, "dropout": True})
        @nn.compact
        def __call__(self, carry: Any, x: jax.Array) -> Any:
            carry, h = nn.OptimizedLSTMCell(8)(carry, x)
            return carry, nn.Dropout(0.3, deterministic=False)(h)

    model = Drop()
    carry = nn.OptimizedLSTMCell(8, parent=None).initialize_carry(jax.random.PRNGKey(0),
                                                                 X[:, 0].shape)
    params = model.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)},
                        carry, X)["params"]

    def loss(p: Any, x: jax.Array) -> jax.Array:
        _, ys = model.apply({"params": p}, carry, x, rngs={"dropout": jax.random.PRNGKey(5)})
        return jnp.mean(ys ** 2)

    assert_same_grads(loss, params, X)


def test_sharding_constraint_and_users_checkpoint_policy() -> None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("b",))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("b"))

    def loss(p: Any, x: jax.Array) -> jax.Array:
        def step(h: jax.Array, xt: jax.Array) -> tuple[jax.Array, None]:
            return jax.lax.with_sharding_constraint(rnn_step(p, h, xt), spec), None

        run = jax.checkpoint(lambda x: lax.scan(step, jnp.zeros((2, 8)), x)[0],
                             policy=jax.checkpoint_policies.dots_saveable)
        return jnp.mean(run(jnp.moveaxis(x, 1, 0)) ** 2)

    assert_same_grads(loss, W, X)


def test_vmap_of_grad_and_jvp() -> None:
    wrapped = autoremat.remat_scans(scan_loss, NESTED)
    xs = jnp.stack([X, 2 * X])
    got = jax.vmap(jax.grad(wrapped), (None, 0))(W, xs)
    ref = jax.vmap(jax.grad(scan_loss), (None, 0))(W, xs)
    assert_close(got, ref)
    t = jax.tree.map(jnp.ones_like, W)
    np.testing.assert_allclose(jax.jvp(lambda p: wrapped(p, X), (W,), (t,))[1],
                               jax.jvp(lambda p: scan_loss(p, X), (W,), (t,))[1], rtol=1e-5)


# -- misuse: one clear message each ---------------------------------------------------------

def test_wrapping_a_gradient_is_refused_naming_the_fix() -> None:
    for derivative in (jax.grad, jax.value_and_grad, lambda f: jax.jit(jax.grad(f))):
        with pytest.raises(autoremat.AutorematError,
                           match=r"already differentiates.*wrap the loss, then differentiate"):
            autoremat.remat_scans(derivative(scan_loss), NESTED)


def test_a_gradient_inside_fn_is_flagged() -> None:
    def fn(p: Any, x: jax.Array) -> jax.Array:  # differentiates inside: residuals stacked
        return jax.grad(scan_loss)(p, x)["w"].sum()

    with pytest.warns(RematScansWarning, match=r"runs backward over another scan's stacked "
                      r"outputs.*wrap the loss, then differentiate"):
        autoremat.remat_scans(fn, NESTED)(W, X)


def test_a_scan_inside_a_custom_vjp_is_reported() -> None:
    @jax.custom_vjp
    def custom(p: Any, x: jax.Array) -> jax.Array:
        return scan_loss(p, x)

    custom.defvjp(lambda p, x: (scan_loss(p, x), (p, x)),
                  lambda res, g: jax.tree.map(lambda v: v * g, jax.grad(scan_loss, (0, 1))(*res)))
    wrapped = autoremat.remat_scans(lambda p, x: custom(p, x) + scan_loss(p, x), NESTED)
    with pytest.warns(RematScansWarning, match=rf"length {T} at .*custom_vjp rule.*left as written"):
        jax.grad(wrapped)(W, X)
    assert len(wrapped.describe(W, X).left) == 1


def test_non_array_arguments_need_static_argnums() -> None:
    def loss(p: Any, model: str, x: jax.Array) -> jax.Array:
        assert model == "rnn"
        return scan_loss(p, x)

    with pytest.raises(autoremat.AutorematError, match=r"argument 1 holds a str.*static_argnums"):
        autoremat.remat_scans(loss, NESTED)(W, "rnn", X)
    wrapped = autoremat.remat_scans(loss, NESTED, static_argnums=1)
    np.testing.assert_allclose(wrapped(W, "rnn", X), scan_loss(W, X), rtol=1e-5)


def test_no_long_scan_warns() -> None:
    wrapped = autoremat.remat_scans(scan_loss, NESTED, min_length=T + 1)
    with pytest.warns(RematScansWarning, match=r"no scan of length >= min_length=201.*\[200\]"):
        wrapped(W, X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        autoremat.remat_scans(scan_loss, NESTED)(W, X)


def test_bad_arguments() -> None:
    with pytest.raises(autoremat.AutorematError, match="min_length: expected a positive int"):
        autoremat.remat_scans(scan_loss, NESTED, min_length=0)
    with pytest.raises(autoremat.ScheduleError, match="schedule"):
        autoremat.remat_scans(scan_loss, 3)  # type: ignore[arg-type]
    with pytest.raises(autoremat.AutorematError, match="fn: expected a callable"):
        autoremat.remat_scans(None, NESTED)  # type: ignore[arg-type]
