"""autoremat.nnx against flax.nnx (float32, rtol 1e-5): scan, RNN, Bidirectional, problem.

Every case runs the same model through ``nnx.scan`` / ``nnx.RNN`` and through
``autoremat.nnx`` under each schedule kind, and compares outputs, gradients
w.r.t. the ``nnx.Param`` state (``nnx.value_and_grad``) and the final state of
the modules (counters, rng counts, scanned state).
"""

from __future__ import annotations

import doctest
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx

import autoremat
import autoremat.nnx
from autoremat import Schedule
from tests.helpers import assert_close, load_example

B, T, FEAT, HID, OUT = 2, 23, 3, 8, 2
ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = {
    "nested-remainder": autoremat.nested([4, 5]),   # 23 = 4*5 + 3
    "3-level": autoremat.nested([2, 3, 2]),
    "binomial": autoremat.binomial(3),
}
KINDS = pytest.mark.parametrize("schedule", list(SCHEDULES.values()), ids=list(SCHEDULES))
TWO_KINDS = pytest.mark.parametrize(
    "schedule", [SCHEDULES["nested-remainder"], SCHEDULES["binomial"]], ids=["nested", "binomial"])
Scan = Callable[..., Any]


def ours(schedule: Schedule) -> Scan:
    return functools.partial(autoremat.nnx.scan, schedule=schedule)




_REFERENCES: dict[str, Any] = {}


def reference(key: str, compute: Callable[[], Any]) -> Any:
    """The original's result, computed once per configuration (it does not depend on
    the schedule)."""
    if key not in _REFERENCES:
        _REFERENCES[key] = compute()
    return _REFERENCES[key]


def run(loss: Callable[..., Any], model: nnx.Module, *args: Any) -> tuple[Any, Any, Any]:
    """(loss and aux, Param gradients, final model state) of ``loss(model, *args)``."""
    out, grads = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model, *args)
    return out, grads, nnx.state(model)


def data(steps: int = T, time_major: bool = False) -> jax.Array:
    shape = (steps, B, FEAT) if time_major else (B, steps, FEAT)
    return jax.random.normal(jax.random.key(1), shape, jnp.float32)


def weighted(y: jax.Array) -> jax.Array:
    return jnp.sum(y * jnp.cos(jnp.arange(y.size, dtype=y.dtype)).reshape(y.shape))


# The seed's SimpleLSTM in NNX: broadcast self, carry, batch-major x.
def seed_model(scan_fn: Scan, seq2seq: bool = True) -> nnx.Module:
    class SimpleLSTM(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.cell = nnx.OptimizedLSTMCell(FEAT, HID, rngs=rngs)
            self.linear = nnx.Linear(HID, OUT, rngs=rngs)

        @functools.partial(scan_fn, in_axes=(None, nnx.Carry, 1), out_axes=(nnx.Carry, 1))
        def forward(self, carry: Any, x: jax.Array) -> Any:
            return self.cell(carry, x)

        def __call__(self, x: jax.Array) -> jax.Array:
            carry = self.cell.initialize_carry(x[:, 0].shape, nnx.Rngs(0))
            _, hs = self.forward(carry, x)
            return self.linear(hs) if seq2seq else self.linear(hs[:, -1])

    return SimpleLSTM(nnx.Rngs(0))


def seed_loss(model: nnx.Module, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    y = model(x)
    return weighted(y), y


@KINDS
def test_seed_lstm_matches_nnx_scan(schedule: Schedule) -> None:
    x = data()
    assert_close(run(seed_loss, seed_model(ours(schedule)), x),
                 reference("seed", lambda: run(seed_loss, seed_model(nnx.scan), x)))


def test_seed_lstm_t97_levels_10_10_loss_on_last_state() -> None:
    x = data(97)
    assert_close(run(seed_loss, seed_model(ours(autoremat.nested([10, 10])), False), x),
                 run(seed_loss, seed_model(nnx.scan, False), x))


class GRU(nnx.Module):
    """A GRU whose parameters are broadcast and whose counter is carried."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.cell = nnx.GRUCell(FEAT, HID, rngs=rngs)
        self.count = nnx.BatchStat(jnp.zeros((), jnp.int32))
        self.mean = nnx.BatchStat(jnp.zeros(HID))

    def __call__(self, h: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h, y = self.cell(h, x)
        self.count[...] += 1
        self.mean[...] = 0.9 * self.mean[...] + 0.1 * y.mean(0)
        return h, y


def gru_loss(scan_fn: Scan, reverse: bool) -> Callable[..., Any]:
    axes = nnx.StateAxes({nnx.Param: None, nnx.BatchStat: nnx.Carry})

    @functools.partial(scan_fn, in_axes=(axes, nnx.Carry, 0), out_axes=(nnx.Carry, 0),
                       reverse=reverse)
    def step(model: GRU, h: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return model(h, x)

    def loss(model: GRU, x: jax.Array) -> tuple[jax.Array, Any]:
        h, ys = step(model, jnp.zeros((B, HID)), x)
        return weighted(ys) + jnp.sum(h**2), ys

    return loss


@pytest.mark.parametrize(("schedule", "reverse"), [
    (SCHEDULES["nested-remainder"], True), (SCHEDULES["3-level"], False),
    (SCHEDULES["binomial"], True)], ids=["nested-reverse", "3-level", "binomial-reverse"])
def test_gru_with_state_axes_counter_and_running_mean(schedule: Schedule, reverse: bool) -> None:
    x = data(time_major=True)
    a = run(gru_loss(ours(schedule), reverse), GRU(nnx.Rngs(0)), x)
    b = reference(f"gru-{reverse}", lambda: run(gru_loss(nnx.scan, reverse), GRU(nnx.Rngs(0)), x))
    assert_close(a, b)
    assert int(a[2]["count"][...]) == T


@TWO_KINDS
def test_module_inside_the_carry_and_a_carry_free_scan(schedule: Schedule) -> None:
    def loss(scan_fn: Scan) -> Callable[..., Any]:
        step = scan_fn(lambda c, x: ((c[0], c[0](c[1], x)[0]), c[1]), in_axes=(nnx.Carry, 0),
                       out_axes=(nnx.Carry, 0))
        readout = scan_fn(lambda m, h: m.cell.dense_h(h), in_axes=(None, 0), out_axes=0)

        def f(model: GRU, x: jax.Array) -> tuple[jax.Array, Any]:
            (_, h), hs = step((model, jnp.zeros((B, HID))), x)
            return weighted(readout(model, hs)) + jnp.sum(h), hs

        return f

    x = data(time_major=True)
    a = run(loss(ours(schedule)), GRU(nnx.Rngs(0)), x)
    assert_close(a, reference("carry-tuple", lambda: run(loss(nnx.scan), GRU(nnx.Rngs(0)), x)))
    assert int(a[2]["count"][...]) == T


class Noisy(nnx.Module):
    """Dense + dropout with its own rng stream (its count advances every call)."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear = nnx.Linear(HID + FEAT, HID, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, h: jax.Array, x: jax.Array) -> jax.Array:
        return self.dropout(jnp.tanh(self.linear(jnp.concatenate([h, x], -1))))


def dropout_loss(scan_fn: Scan, mode: str) -> Callable[..., Any]:
    """The dropout module carried (a new mask each step), broadcast, or with split rngs."""
    model_axis = nnx.StateAxes({...: nnx.Carry}) if mode == "carry" else None

    @functools.partial(scan_fn, in_axes=(model_axis, nnx.Carry, 0, 0 if mode == "split" else None),
                       out_axes=(nnx.Carry, 0))
    def step(model: Noisy, h: jax.Array, x: jax.Array, rngs: nnx.Rngs) -> Any:
        h = model(h, x)
        if mode == "split":
            h = h * jax.random.uniform(rngs.noise(), h.shape)
        return h, h

    def loss(model: Noisy, x: jax.Array, rngs: nnx.Rngs) -> tuple[jax.Array, Any]:
        scanned = nnx.split_rngs(splits=T, only="noise")(step) if mode == "split" else step
        h, ys = scanned(model, jnp.zeros((B, HID)), x, rngs)
        return weighted(ys) + jnp.sum(h), ys

    return loss


@pytest.mark.parametrize(("schedule", "mode"), [
    (SCHEDULES["nested-remainder"], "carry"), (SCHEDULES["binomial"], "carry"),
    (SCHEDULES["3-level"], "broadcast"), (SCHEDULES["binomial"], "split")],
    ids=["nested-carry", "binomial-carry", "3-level-broadcast", "binomial-split"])
def test_dropout_rngs_advance_as_in_nnx_scan(schedule: Schedule, mode: str) -> None:
    x = data(time_major=True)

    def go(scan_fn: Scan) -> Any:
        rngs = nnx.Rngs(noise=3)
        out = run(dropout_loss(scan_fn, mode), Noisy(nnx.Rngs(0, dropout=7)), x, rngs)
        return out, nnx.state(rngs)

    a, b = go(ours(schedule)), reference(f"dropout-{mode}", lambda: go(nnx.scan))
    assert_close(a, b)
    dropped = np.asarray(a[0][0][1]) == 0  # per step
    assert (dropped[0] != dropped[1]).any() == (mode == "carry")


class Stacked(nnx.Module):
    """A per-step Variable scanned along axis 0 (read and written every step)."""

    def __init__(self) -> None:
        self.w = nnx.Param(jnp.linspace(0.5, 1.5, HID))
        self.trace = nnx.Variable(jnp.ones((T, HID)))

    def __call__(self, h: jax.Array) -> jax.Array:
        h = jnp.tanh(h * self.w[...] + self.trace[...])
        self.trace[...] = self.trace[...] * 2.0 + h.mean(0)
        return h


@TWO_KINDS
def test_scanned_module_state_is_stacked_back(schedule: Schedule) -> None:
    def loss(scan_fn: Scan) -> Callable[..., Any]:
        axes = nnx.StateAxes({nnx.Param: None, nnx.Variable: 0})
        step = scan_fn(lambda m, h: (m(h), h), in_axes=(axes, nnx.Carry),
                       out_axes=(nnx.Carry, 0))
        return lambda m: (weighted(step(m, jnp.ones((B, HID)))[1]), None)

    assert_close(run(loss(ours(schedule)), Stacked()), run(loss(nnx.scan), Stacked()))


def rnn_loss(out: Any) -> tuple[jax.Array, Any]:
    """Every output and carry leaf enters the loss (and is compared)."""
    return sum(weighted(leaf) for leaf in jax.tree_util.tree_leaves(out)), out


@pytest.mark.parametrize(("schedule", "options"), [
    (SCHEDULES["nested-remainder"], {"reverse": True, "keep_order": True}),
    (SCHEDULES["binomial"], {"reverse": True, "keep_order": True}),
    (SCHEDULES["nested-remainder"], {"seq_lengths": True, "return_carry": True}),
    (SCHEDULES["binomial"], {"seq_lengths": True, "reverse": True, "keep_order": True,
                             "return_carry": True}),
    (SCHEDULES["3-level"], {"time_major": True, "return_carry": True}),
], ids=["nested-reverse-keep-order", "binomial-reverse-keep-order", "nested-seq-lengths",
        "binomial-padded-reverse", "3-level-time-major"])
def test_rnn_matches_nnx_rnn(schedule: Schedule, options: dict[str, Any]) -> None:
    options = dict(options)
    call = {"seq_lengths": jnp.array([T, 9])} if options.pop("seq_lengths", False) else {}
    x = data(time_major=options.get("time_major", False))

    def go(make: Callable[[nnx.Module], nnx.Module]) -> Any:
        rnn = make(nnx.OptimizedLSTMCell(FEAT, HID, rngs=nnx.Rngs(0)))
        return run(lambda m, x: rnn_loss(m(x, **call)), rnn, x)

    assert_close(go(lambda c: autoremat.nnx.RNN(c, schedule=schedule, **options)),
                 reference(f"rnn-{sorted(options)}-{call}",
                           lambda: go(lambda c: nnx.RNN(c, **options))))


@TWO_KINDS
def test_bidirectional_on_autoremat_rnns(schedule: Schedule) -> None:
    x, lengths = data(), jnp.array([T, 11])

    def go(rnn: Callable[..., nnx.Module]) -> Any:
        bi = nnx.Bidirectional(rnn(nnx.GRUCell(FEAT, HID, rngs=nnx.Rngs(0))),
                               rnn(nnx.GRUCell(FEAT, HID, rngs=nnx.Rngs(1))), return_carry=True)
        return run(lambda m, x: rnn_loss(m(x, seq_lengths=lengths)), bi, x)

    assert_close(go(functools.partial(autoremat.nnx.RNN, schedule=schedule)),
                 reference("bidirectional", lambda: go(nnx.RNN)))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"unroll": True}, "unroll: .*unroll=True"),
    ({"_split_transpose": True}, "_split_transpose: not supported"),
])
def test_unsupported_arguments_say_so(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        autoremat.nnx.scan(lambda c, x: (c, x), schedule=SCHEDULES["binomial"], **kwargs)
    with pytest.raises(autoremat.ScheduleError, match="schedule: expected"):
        autoremat.nnx.scan(lambda c, x: (c, x), schedule=3)  # type: ignore[arg-type]


def test_module_docstring_examples_run() -> None:
    result = doctest.testmod(autoremat.nnx, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 4 and result.failed == 0


def test_problem_tunes_end_to_end_with_the_cli(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from autoremat.cli import main

    env = {"SEED_LSTM_NNX_SEQ_LEN": "24", "SEED_LSTM_NNX_HIDDEN": "8"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOREMAT_STORAGE", raising=False)
    assert main(["tune", "--problem", f"{ROOT / 'examples' / 'seed_lstm_nnx.py'}:problem",
                 "--budget", "1GB", "--trials", "2", "--time-budget", "0.02", "--no-progress",
                 "--out", "best.yaml"]) == 0
    assert "2 measured now" in capsys.readouterr().out
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["meta"]["problem"].startswith("seed_lstm_nnx(T=24")
    assert 0 < best["meta"]["total_bytes"] <= 10**9

    # the example script's own loop (its main(), in this process) with the tuned schedule
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the script sets it
    example = load_example("seed_lstm_nnx")
    assert example.main(["--schedule", "best.yaml", "--steps", "2", "--seq-len", "24",
                         "--hidden", "8"]) == 0
    assert "step 1: loss" in capsys.readouterr().out
