"""``remat_scans`` moves per-step readouts and losses into the scan (issue 31).

Every front gives the unmodified function's loss and gradients (rtol 1e-5),
including the gradients of the moved head's parameters and of the targets.
The separable ones are fused: the compiled temp of the fused step is below
the per-step outputs the unfused scan stacks (the floor no schedule removes).
The cases that mix time steps are left as written, are right, and
``describe()`` names the equation that blocked them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax import lax

import autoremat
import autoremat.linen
import autoremat.nnx
from autoremat import Schedule
from autoremat._measure.from_loss import linen_loss
from autoremat._scan.records import record_scans
from tests.helpers import assert_close

T, B, XD, H, Y = 256, 2, 3, 8, 3
SCHEDULE = autoremat.nested([16, 16])
ROOT = Path(__file__).resolve().parents[1]
KEYS = jax.random.split(jax.random.PRNGKey(0), 8)
X_TM = jax.random.normal(KEYS[0], (T, B, XD))  # time-major
X_BM = jnp.swapaxes(X_TM, 0, 1)  # batch-major
Y_TM = jax.random.normal(KEYS[1], (T, B, Y))
Y_BM = jnp.swapaxes(Y_TM, 0, 1)
P = {"w": jax.random.normal(KEYS[2], (H, H)) * 0.3, "u": jax.random.normal(KEYS[3], (XD, H)),
     "o": jax.random.normal(KEYS[4], (H, Y)), "b": jax.random.normal(KEYS[5], (Y,))}


def temp_bytes(compiled: Any) -> int:
    return int(compiled.memory_analysis().temp_size_in_bytes)


def check(fn: Callable[..., Any], *args: Any, argnums: tuple[int, ...] = (0,),
          fused: bool, has_aux: bool = False, schedule: Schedule = SCHEDULE,
          floor: bool = True) -> str:
    """Loss and grads of ``remat_scans(fn)`` equal ``fn``'s; when ``fused``, its compiled temp
    is below what the unfused rewrite stacks (``floor``) or half the unfused rewrite's temp.
    Returns ``describe()`` as text."""
    wrapped = autoremat.remat_scans(fn, schedule)
    grad = lambda f: jax.jit(jax.value_and_grad(f, argnums, has_aux=has_aux))  # noqa: E731
    got_step = grad(wrapped).lower(*args).compile()
    assert_close(got_step(*args), grad(fn)(*args))
    report = str(wrapped.describe(*args))
    assert ("fused into the step" in report) == fused, report
    if fused:
        with record_scans() as records:
            unfused = grad(autoremat.remat_scans(fn, schedule, fuse=False)).lower(*args)
        bound = (sum(r.stacked_bytes for r in records) if floor
                 else temp_bytes(unfused.compile()) // 2)
        assert temp_bytes(got_step) < bound, (temp_bytes(got_step), bound)
    return report


def rnn(p: Any, xs: jax.Array) -> jax.Array:
    """A tanh RNN over time-major ``xs``: the stacked ``(T, B, H)`` hidden states."""
    def step(h: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = jnp.tanh(h @ p["w"] + x @ p["u"])
        return h, h

    return lax.scan(step, jnp.zeros((xs.shape[1], H)), xs)[1]


# -- fronts that fuse -------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", [SCHEDULE, autoremat.binomial(8)], ids=["nested", "binomial"])
def test_lax_scan_time_major_mean_squared_error(schedule: Schedule) -> None:
    def loss(p: Any, xs: jax.Array, ys: jax.Array) -> jax.Array:
        return jnp.mean((rnn(p, xs) @ p["o"] - ys) ** 2)

    report = check(loss, P, X_TM, Y_TM, argnums=(0, 2), fused=True, schedule=schedule)
    assert "dot_general -> sub -> integer_pow -> reduce_sum over time; nothing stacked" in report


def test_lax_scan_batch_major_with_bias() -> None:
    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        hs = jnp.moveaxis(rnn(p, jnp.moveaxis(x, 1, 0)), 0, 1)  # (B, T, H)
        return jnp.mean((hs @ p["o"] + p["b"] - y) ** 2)

    report = check(loss, P, X_BM, Y_BM, argnums=(0, 2), fused=True)
    assert "transpose -> dot_general -> add -> sub" in report


def load_seed() -> Any:
    """``examples/seed_unmodified.py``, by ``studies/bench_remat_scans.py``'s loader."""
    if str(ROOT / "studies") not in sys.path:
        sys.path.insert(0, str(ROOT / "studies"))
    return importlib.import_module("bench_remat_scans").load_seed()


def test_the_reports_simple_lstm_unmodified() -> None:
    # nn.scan(in_axes=1, out_axes=1) + @nn.remat + nn.Dense outside + optax.l2_loss(...).mean()
    model = load_seed().SimpleLSTM(hidden_size=H, output_dim=Y, seq2seq=True)
    params = model.init(jax.random.PRNGKey(2), X_BM)["params"]
    report = check(linen_loss(model, None), params, X_BM, Y_BM, argnums=(0, 2), fused=True)
    assert "reduce_sum over time; nothing stacked" in report
    assert "jax.checkpoint (nn.remat)" in report  # inlined, and said so


class Tagger(nn.Module):
    """``nn.RNN(nn.LSTMCell)`` + ``nn.Dense``: per-step logits."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(5)(nn.RNN(nn.LSTMCell(H))(x))


def test_nn_rnn_cross_entropy_with_a_padding_mask() -> None:
    model = Tagger()
    params = model.init(jax.random.PRNGKey(0), X_BM)
    labels = jax.random.randint(KEYS[6], (B, T), 0, 5)
    mask = (jnp.arange(T)[None, :] < jnp.array([[T], [T // 2]])).astype(jnp.float32)

    def loss(params: Any, x: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
        logits = model.apply(params, x)
        per_step = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        return jnp.sum(per_step * mask) / jnp.sum(mask)  # mean over the valid steps

    report = check(loss, params, X_BM, labels, mask, argnums=(0, 3), fused=True)
    assert "nothing stacked" in report


def test_nnx_rnn_linear_l2() -> None:
    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.rnn = nnx.RNN(nnx.OptimizedLSTMCell(XD, H, rngs=rngs))
            self.head = nnx.Linear(H, Y, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.head(self.rnn(x))

    def loss(model: Model, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean(optax.l2_loss(model(x), y))

    ref, model = Model(nnx.Rngs(0)), Model(nnx.Rngs(0))
    wrapped = autoremat.nnx.remat_scans(loss, SCHEDULE)
    l_ref, g_ref = nnx.value_and_grad(loss)(ref, X_BM, Y_BM)
    l_got, g_got = nnx.jit(nnx.value_and_grad(wrapped))(model, X_BM, Y_BM)
    assert_close((l_got, nnx.to_pure_dict(g_got)), (l_ref, nnx.to_pure_dict(g_ref)))
    report = str(wrapped.describe(model, X_BM, Y_BM))
    assert "reduce_sum over time; nothing stacked" in report, report

    graphdef, state, rest = nnx.split(model, nnx.Param, ...)

    def pure(state: Any, rest: Any, x: jax.Array, y: jax.Array, fuse: bool) -> Any:
        def f(state: Any, rest: Any) -> jax.Array:
            return loss(nnx.merge(graphdef, state, rest), x, y)
        return jax.grad(autoremat.remat_scans(f, SCHEDULE, fuse=fuse))(state, rest)

    fused = jax.jit(pure, static_argnums=4).lower(state, rest, X_BM, Y_BM, True).compile()
    with record_scans() as records:
        jax.jit(pure, static_argnums=4).lower(state, rest, X_BM, Y_BM, False)
    assert temp_bytes(fused) < sum(r.stacked_bytes for r in records)


def test_nnx_problem_measures_the_fused_step() -> None:
    """``autoremat.nnx.problem`` (a model built for a schedule, ``autoremat.nnx.RNN``): with
    ``fuse`` (the default) one training step gives the unfused step's loss and updated
    state, and its compiled temp is under the unfused step's stacked outputs."""

    class Model(nnx.Module):
        def __init__(self, schedule: Schedule, rngs: nnx.Rngs) -> None:
            self.rnn = autoremat.nnx.RNN(nnx.OptimizedLSTMCell(XD, H, rngs=rngs),
                                         schedule=schedule)
            self.head = nnx.Linear(H, Y, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.head(self.rnn(x))

    def make(fuse: bool) -> autoremat.Problem:
        return autoremat.nnx.problem(
            "nnx", lambda s: Model(s, nnx.Rngs(0)),
            loss_fn=lambda m, x, y: jnp.mean(optax.l2_loss(m(x), y)),
            optimizer_fn=lambda m: nnx.Optimizer(m, optax.sgd(0.1), wrt=nnx.Param),
            batch=(X_BM, Y_BM), seq_len=T, fuse=fuse)

    (step, args), (ref_step, ref_args) = make(True).build(SCHEDULE), make(False).build(SCHEDULE)
    (state, loss), (ref_state, ref_loss) = jax.jit(step)(*args), jax.jit(ref_step)(*ref_args)
    assert_close((loss, nnx.to_pure_dict(state)), (ref_loss, nnx.to_pure_dict(ref_state)))
    fused = jax.jit(step).lower(*args).compile()
    with record_scans() as records:  # a fresh trace, so the scans report what they stack
        jax.jit(lambda *a: ref_step(*a)).lower(*ref_args)
    assert 0 < temp_bytes(fused) < sum(r.stacked_bytes for r in records)


def test_custom_jvp_head_and_binary_cross_entropy() -> None:
    # jax.nn.relu and jnp.logaddexp (in log_sigmoid) are custom_jvp functions: they move in
    # with their own derivative rules; log_sigmoid is a jitted helper
    def loss(p: Any, xs: jax.Array, labels: jax.Array) -> jax.Array:
        logits = jax.nn.relu(rnn(p, xs)) @ p["o"] + p["b"]
        return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels))

    # -labels and 1 - labels are made per step from the labels' slices, not whole
    labels = (Y_TM > 0).astype(jnp.float32)
    report = check(loss, P, X_TM, labels, argnums=(0, 2), fused=True)
    assert "custom_jvp_call -> dot_general" in report and "nothing stacked" in report


def _reverse(p: Any, xs: jax.Array, ys: jax.Array) -> jax.Array:
    def step(h: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = jnp.tanh(h @ p["w"] + x @ p["u"])
        return h, h

    _, hs = lax.scan(step, jnp.zeros((B, H)), xs, reverse=True)
    return jnp.sum(((hs @ p["o"] - ys) ** 2).mean(axis=(1, 2)) * jnp.linspace(0, 1, T))


def _final_carry_too(p: Any, xs: jax.Array, ys: jax.Array) -> jax.Array:
    def step(h: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = jnp.tanh(h @ p["w"] + x @ p["u"])
        return h, h

    h, hs = lax.scan(step, jnp.zeros((B, H)), xs)
    return jnp.mean((hs @ p["o"] - ys) ** 2) + jnp.sum(h ** 2)


def _encoder_decoder(p: Any, xs: jax.Array, ys: jax.Array) -> jax.Array:
    enc = rnn(p, xs)  # the decoder reads the encoder's states one step at a time
    return jnp.mean((rnn(p, enc @ p["u"].T * 0.1) @ p["o"] + jnp.tanh(enc) @ p["o"] - ys) ** 2)


def _layers(p: Any, xs: jax.Array, ys: jax.Array) -> jax.Array:
    def layer(total: jax.Array, scale: jax.Array) -> tuple[jax.Array, None]:
        return total + jnp.mean((rnn(p, xs * scale) @ p["o"] - ys) ** 2), None

    return lax.scan(layer, 0.0, jnp.array([1.0, 0.5]))[0]  # a short scan over layers


@pytest.mark.parametrize("loss", [_reverse, _final_carry_too, _encoder_decoder, _layers],
                         ids=["reverse", "final carry", "encoder-decoder", "layers"])
def test_more_shapes_of_losses_stay_right(loss: Callable[..., Any]) -> None:
    # two scans, or one in a loop over layers: what else they keep is above the floor
    report = check(loss, P, X_TM, Y_TM, argnums=(0, 2), fused=True,
                   floor=loss not in (_encoder_decoder, _layers))
    assert "reduce_sum over time" in report


def test_fuse_false_leaves_it_as_written() -> None:
    def loss(p: Any, xs: jax.Array, ys: jax.Array) -> jax.Array:
        return jnp.mean((rnn(p, xs) @ p["o"] - ys) ** 2)

    wrapped = autoremat.remat_scans(loss, SCHEDULE, fuse=False)
    assert "fused" not in str(wrapped.describe(P, X_TM, Y_TM))
    assert_close(jax.grad(wrapped)(P, X_TM, Y_TM), jax.grad(loss)(P, X_TM, Y_TM))
    with pytest.raises(autoremat.AutorematError, match="fuse: expected True, False or None"):
        autoremat.remat_scans(loss, SCHEDULE, fuse="yes")  # type: ignore[arg-type]


# -- cases that must not fuse: right, and describe() names the blocker ------------------------

def test_cumsum_over_time_keeps_the_head_only() -> None:
    def loss(p: Any, xs: jax.Array) -> jax.Array:
        preds = rnn(p, xs) @ p["o"]
        return jnp.mean(jnp.cumsum(preds, axis=0) ** 2)

    report = check(loss, P, X_TM, fused=True)  # only the head: (T, B, Y) instead of (T, B, H)
    assert f"stacks f32[{T},{B},{Y}]" in report and "cumsum" in report
    assert "test_fuse_readout.py" in report and "over time" not in report


def test_loss_on_the_last_state_only() -> None:
    def loss(p: Any, xs: jax.Array) -> jax.Array:
        return jnp.sum((rnn(p, xs)[-1] @ p["o"]) ** 2)

    report = check(loss, P, X_TM, fused=False)
    assert "not fused" in report and "test_fuse_readout.py" in report


def test_attention_over_the_stacked_outputs() -> None:
    def loss(p: Any, xs: jax.Array) -> jax.Array:
        hs = rnn(p, xs)
        scores = jax.nn.softmax(jnp.einsum("tbh,sbh->bts", hs, hs), axis=-1)
        return jnp.mean(jnp.einsum("bts,sbh->tbh", scores, hs) ** 2)

    report = check(loss, P, X_TM, fused=False)
    assert "mixes time steps" in report


def test_stacked_outputs_returned_in_the_aux() -> None:
    def loss(p: Any, xs: jax.Array, ys: jax.Array) -> tuple[jax.Array, jax.Array]:
        hs = rnn(p, xs)
        return jnp.mean((hs @ p["o"] - ys) ** 2), hs

    report = check(loss, P, X_TM, Y_TM, fused=False, has_aux=True)
    assert "returned by fn (output 1)" in report


def test_bidirectional_is_left_as_written() -> None:
    # the backward RNN's outputs are reversed (rev over time); the forward RNN's are
    # concatenated with them, which the backward scan computes after the forward one
    class Bi(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            rnns = (nn.RNN(nn.GRUCell(H)), nn.RNN(nn.GRUCell(H)))
            return nn.Dense(Y)(nn.Bidirectional(*rnns)(x))

    model = Bi()
    params = model.init(jax.random.PRNGKey(0), X_BM)

    def loss(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((model.apply(params, x) - y) ** 2)

    report = check(loss, params, X_BM, Y_BM, argnums=(0, 2), fused=False)
    assert "rev at" in report and "computed by scan at" in report


# -- tuning sees it ---------------------------------------------------------------------------

def test_problem_from_loss_measures_the_fused_step() -> None:
    # linen.problem (Problem.from_loss) goes through remat_scans: the step the tuner
    # measures stacks nothing, so the breakdown's floor is the arguments and outputs.
    model = load_seed().SimpleLSTM(hidden_size=H, output_dim=Y, seq2seq=True)
    params = model.init(jax.random.PRNGKey(2), X_BM)["params"]
    stacked = {}
    for fuse in (True, False):
        problem = autoremat.linen.problem("seed", model, params, (X_BM, Y_BM), optax.adam(1e-3),
                                          fuse=fuse)
        step, args = problem.build(SCHEDULE)
        with record_scans() as records:
            jax.jit(step).lower(*args)
        stacked[fuse] = sum(r.stacked_bytes for r in records)
    assert stacked == {True: 0, False: T * B * H * 4}
