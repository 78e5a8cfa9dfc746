"""``remat_scans`` beyond the rewrite: NNX state, ``describe``, ``Problem.from_loss``,
``autoremat.linen.problem`` and ``autoremat tune`` on the report's unmodified model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import yaml
from flax import nnx
from helpers import REWRITE_T as T
from helpers import REWRITE_W as W
from helpers import REWRITE_X as X
from helpers import assert_close, scan_loss

import autoremat
import autoremat.linen
import autoremat.nnx

ROOT = Path(__file__).resolve().parents[1]
NESTED = autoremat.nested([10, 20])
RTOL = 1e-5


# -- NNX ------------------------------------------------------------------------------------

class Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.rnn = nnx.RNN(nnx.OptimizedLSTMCell(3, 8, rngs=rngs))
        self.norm = nnx.BatchNorm(8, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)
        self.calls = nnx.Variable(jnp.zeros((), jnp.int32))

    def __call__(self, x: jax.Array) -> jax.Array:
        self.calls[...] += 1
        return self.drop(self.norm(self.rnn(x)))


def nnx_loss(model: Model, x: jax.Array) -> jax.Array:
    return jnp.mean(model(x) ** 2)


def test_nnx_state_survives_and_gradients_match() -> None:
    ref, model = Model(nnx.Rngs(0)), Model(nnx.Rngs(0))
    wrapped = autoremat.nnx.remat_scans(nnx_loss, NESTED)
    before = jax.tree.map(jnp.copy, nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.RngKey))))
    for _ in range(2):  # the second call sees the first call's rng count and statistics
        l_ref, g_ref = nnx.value_and_grad(nnx_loss)(ref, X)
        l_got, g_got = nnx.value_and_grad(wrapped)(model, X)
        np.testing.assert_allclose(l_got, l_ref, rtol=RTOL)
        assert_close(nnx.to_pure_dict(g_got), nnx.to_pure_dict(g_ref))
    got = nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.RngKey)))
    want = nnx.to_pure_dict(nnx.state(ref, nnx.Not(nnx.RngKey)))
    assert_close(got, want)
    assert int(model.calls[...]) == 2
    assert int(model.drop.rngs.count[...]) == int(before["drop"]["rngs"]["count"]) + 2
    assert not np.allclose(model.norm.mean[...], before["norm"]["mean"])  # statistics moved


def test_nnx_scan_memory_and_describe() -> None:
    cell = nnx.GRUCell(3, 8, rngs=nnx.Rngs(0))

    def loss(cell: nnx.GRUCell, x: jax.Array) -> jax.Array:
        @nnx.scan(in_axes=(nnx.Carry, None, 1), out_axes=(nnx.Carry, 1))
        def run(h: jax.Array, cell: nnx.GRUCell, xt: jax.Array) -> Any:
            return cell(h, xt)

        _, ys = run(jnp.zeros((2, 8)), cell, x)
        return jnp.mean(ys ** 2)

    wrapped = autoremat.nnx.remat_scans(loss, NESTED)
    assert [s.length for s in wrapped.describe(cell, X).rewritten] == [T]
    graphdef, params = nnx.split(cell)

    def temp(f: Any) -> int:
        step = jax.jit(jax.grad(lambda p, x: f(nnx.merge(graphdef, p), x)))
        return int(step.lower(params, X).compile().memory_analysis().temp_size_in_bytes)

    assert temp(wrapped) < 0.7 * temp(loss)
    g_ref = nnx.grad(loss)(cell, X)
    g_got = nnx.grad(wrapped)(cell, X)
    assert_close(nnx.to_pure_dict(g_got), nnx.to_pure_dict(g_ref))


# -- describe -------------------------------------------------------------------------------

def test_describe_names_length_carry_and_the_users_line() -> None:
    def loss(p: Any, x: jax.Array) -> jax.Array:
        short = lax_scan_short(x)
        return scan_loss(p, x) + short

    def lax_scan_short(x: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda c, xt: (c + xt.sum(), None), 0.0, x[:, :10].T)[0]

    report = autoremat.remat_scans(loss, NESTED).describe(
        W, jax.ShapeDtypeStruct(X.shape, X.dtype))
    long, short = sorted(report.scans, key=lambda s: -s.length)
    assert (long.length, long.carry_bytes, long.action) == (T, 2 * 8 * 4, "rewritten")
    assert long.where.startswith("tests/helpers.py:") and "scan_loss" in long.where
    assert (short.length, short.action) == (3, "too short")
    assert "test_remat_scans.py" in short.where
    text = str(report)
    assert "1 of 2 scan(s) rewritten" in text and "rewritten  length      200" in text


# -- tuning unmodified code -----------------------------------------------------------------

def test_problem_from_loss_builds_the_train_step() -> None:
    def loss(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return scan_loss(params, x) + jnp.mean(y)

    y = jnp.ones((2,))
    problem = autoremat.Problem.from_loss("rnn", loss, W, (X, y), optax.sgd(0.1))
    assert (problem.seq_len, problem.arg_names) == (T, ("params", "opt_state", "x", "y"))
    step, args = problem.build(NESTED)
    params, _, value = jax.jit(step)(*args)
    np.testing.assert_allclose(value, loss(W, X, y), rtol=RTOL)
    grads = jax.grad(loss)(W, X, y)
    assert_close(params, jax.tree.map(lambda w, g: w - 0.1 * g, W, grads))
    plain = autoremat.measure(problem, autoremat.plain(T), run=False)
    nested = autoremat.measure(problem, NESTED, run=False)
    assert nested.temp_bytes < plain.temp_bytes


def test_problem_from_loss_errors() -> None:
    with pytest.raises(autoremat.ProblemError, match="no scan of length >= min_length=500"):
        autoremat.Problem.from_loss("rnn", scan_loss, W, (X,), optax.sgd(0.1), min_length=500)
    with pytest.raises(autoremat.ProblemError, match="batch: expected a tuple of arrays"):
        autoremat.Problem.from_loss("rnn", scan_loss, W, X, optax.sgd(0.1))  # type: ignore[arg-type]
    with pytest.raises(autoremat.AutorematError, match="already differentiates"):
        autoremat.Problem.from_loss("rnn", jax.grad(scan_loss), W, (X,), optax.sgd(0.1))


def test_tune_the_unmodified_seed_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The command line's tune of the script as written, in this process (the command
    in a process of its own: ``tests/test_cli.py``)."""
    from autoremat.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEED_SEQ_LEN", "120")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the script sets it
    assert main(["tune", "--problem", f"{ROOT / 'examples' / 'seed_unmodified.py'}:problem",
                 "--budget", "1GB", "--trials", "3", "--time-budget", "0.05", "--no-progress",
                 "--storage", f"sqlite:///{tmp_path / 'runs.db'}", "--out", "best.yaml"]) == 0
    assert "seed_unmodified(T=120)" in capsys.readouterr().out
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["meta"]["total_bytes"] > 0


def test_linen_problem_matches_the_seed_step() -> None:
    import flax.linen as nn

    model = nn.RNN(nn.LSTMCell(8))
    params = model.init(jax.random.PRNGKey(0), X)["params"]
    y = jnp.ones((2, T, 8))
    problem = autoremat.linen.problem("rnn", model, params, (X, y), optax.adam(1e-3))
    assert problem.arg_names == ("params", "opt_state", "x", "y")
    step, args = problem.build(NESTED)
    _, _, value = jax.jit(step)(*args)
    np.testing.assert_allclose(value, optax.l2_loss(model.apply({"params": params}, X), y).mean(),
                               rtol=RTOL)
    # short timing runs: x and y cut to their first steps (time is axis 1 of both)
    assert problem.at_length is not None
    short = problem.at_length(100)
    assert short.seq_len == 100
    _, _, value = jax.jit(short.build(autoremat.nested([10, 10]))[0])(*short.build(NESTED)[1])
    np.testing.assert_allclose(value, optax.l2_loss(
        model.apply({"params": params}, X[:, :100]), y[:, :100]).mean(), rtol=RTOL)

