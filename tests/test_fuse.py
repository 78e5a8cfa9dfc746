"""The readout inside the step (``fuse_head``, ``fuse_loss``, ``seed_lstm(fused_readout=True)``,
the linen example's ``--fused-readout``): the unfused model's loss and gradients
(rtol 1e-5) under both schedule kinds, far less memory, and the CLI's output floor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import autoremat
from autoremat import Schedule
from autoremat._errors import ProblemError
from autoremat._measure.measure import measure
from autoremat._models.seed_lstm import seed_lstm, seed_model
from autoremat._scan.records import record_scans
from autoremat._schedules import read_schedule
from autoremat.cli import main
from tests.helpers import assert_close, load_example, one_per_kind

T, B, D, H, Y = 37, 3, 5, 6, 2


def _data() -> tuple[Any, jax.Array, jax.Array, jax.Array]:
    k = jax.random.split(jax.random.PRNGKey(0), 5)
    params = {"w": jax.random.normal(k[0], (H, H)) * 0.3, "u": jax.random.normal(k[1], (D, H)),
              "r": jax.random.normal(k[2], (H, Y))}
    return params, jax.random.normal(k[3], (T, B, D)), jax.random.normal(k[4], (T, B, Y)), \
        jnp.zeros((B, H))


def _cell(p: Any) -> Any:
    return lambda h, x: (jnp.tanh(h @ p["w"] + x @ p["u"]),) * 2


def _unfused(p: Any, xs: jax.Array, ys: jax.Array, h0: jax.Array) -> jax.Array:
    """The reference: plain ``lax.scan`` stacking ``(T, B, H)``, the readout after it."""
    _, hs = lax.scan(_cell(p), h0, xs)
    return jnp.mean((hs @ p["r"] - ys) ** 2)


@pytest.mark.parametrize("schedule", one_per_kind(), ids=lambda s: s.kind)
def test_fuse_head_and_fuse_loss_equal_the_unfused_loss_and_gradients(schedule: Schedule) -> None:
    params, xs, ys, h0 = _data()

    def head(p: Any, xs: jax.Array, ys: jax.Array, h0: jax.Array) -> jax.Array:
        step = autoremat.fuse_head(_cell(p), lambda h: h @ p["r"])
        _, preds = autoremat.scan(step, h0, xs, schedule=schedule)
        assert preds.shape == (T, B, Y)  # only the predictions are stacked
        return jnp.mean((preds - ys) ** 2)

    def loss(p: Any, xs: jax.Array, ys: jax.Array, h0: jax.Array) -> jax.Array:
        step = autoremat.fuse_loss(_cell(p), lambda h, y: jnp.sum((h @ p["r"] - y) ** 2))
        (_, total), nothing = autoremat.scan(step, (h0, 0.0), (xs, ys), schedule=schedule)
        assert nothing is None
        return total / ys.size

    want = jax.jit(jax.value_and_grad(_unfused, argnums=(0, 3)))(params, xs, ys, h0)
    for fn in (head, loss):
        got = jax.jit(jax.value_and_grad(fn, argnums=(0, 3)))(params, xs, ys, h0)
        assert_close(got, want)


def test_fuse_helpers_reject_non_callables() -> None:
    with pytest.raises(TypeError, match="fuse_head"):
        autoremat.fuse_head(_cell({}), None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fuse_loss"):
        autoremat.fuse_loss(None, lambda y, t: y)  # type: ignore[arg-type]


@pytest.mark.parametrize("schedule", one_per_kind(), ids=lambda s: s.kind)
def test_seed_fused_readout_is_the_unfused_train_step(schedule: Schedule) -> None:
    """Same loss, updated params and Adam state as the unfused (plain ``lax.scan``) step."""
    ref = seed_model(seq_len=40, batch=2, hidden=8, input_dim=3, output_dim=2)

    def run_scan(params: Any, x: Any) -> Any:
        return lax.scan(ref.cell_step(params), ref.carry0, jnp.moveaxis(x, 1, 0))

    want = jax.jit(ref.train_step(run_scan))(*ref.args)
    fused = seed_model(seq_len=40, batch=2, hidden=8, input_dim=3, output_dim=2,
                       fused_readout=True).problem()
    assert fused.name.endswith(",seq2seq,fused)") and fused.arg_names == ref.ARG_NAMES
    step, args = fused.build(schedule)
    assert_close(jax.jit(step)(*args), want)


def test_fused_readout_needs_seq2seq() -> None:
    with pytest.raises(ProblemError, match=r"fused_readout: .* seq2seq=True"):
        seed_lstm(seq_len=8, seq2seq=False, fused_readout=True)


def test_fused_readout_removes_the_stacked_outputs_from_the_breakdown() -> None:
    t, schedule = 200, autoremat.root(200, 2, "nothing_saveable")
    unfused = measure(seed_lstm(seq_len=t, batch=2, hidden=8), schedule, run=False)
    fused = measure(seed_lstm(seq_len=t, batch=2, hidden=8, fused_readout=True), schedule,
                    run=False)
    assert unfused.stacked_bytes == t * 2 * 8 * 4  # the (T, B, H) float32 hidden states
    assert fused.stacked_bytes == 0
    assert fused.carry_bytes == unfused.carry_bytes + 4  # + the float32 loss sum
    assert dict(fused.argument_parts) == dict(unfused.argument_parts)
    assert list(dict(fused.argument_parts)) == ["params", "opt_state", "x", "y"]
    assert fused.temp_bytes is not None and unfused.temp_bytes is not None
    assert fused.temp_bytes < unfused.temp_bytes - unfused.stacked_bytes


def test_record_scans_records_each_outermost_scan_once() -> None:
    sched = autoremat.nested([4, 5])

    def inner(c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        c2, ys = autoremat.scan(lambda a, b: (a + b, a * b), c, x, schedule=autoremat.plain(3))
        return c2, ys

    with record_scans() as records:
        jax.make_jaxpr(lambda xs: autoremat.scan(inner, jnp.zeros(2), xs, schedule=sched))(
            jnp.ones((20, 3, 2)))
    assert [(r.stacked_bytes, r.carry_bytes) for r in records] == [(20 * 3 * 2 * 4, 2 * 4)]


@pytest.mark.parametrize("schedule", one_per_kind(), ids=lambda s: s.kind)
def test_linen_example_fused_readout_has_the_unfused_loss_and_gradients(schedule: Schedule) -> None:
    """``examples/seed_lstm.py``: the Dense and the L2 loss called in the scanned method (its
    params broadcast, the loss summed in the carry) give the unfused model's mean loss and
    gradients, with the same parameter tree."""
    import flax.linen as nn
    import optax

    example = load_example("seed_lstm")
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 30, 4))
    y = jax.random.normal(jax.random.PRNGKey(2), (2, 30, 3))
    unfused_model, fused_model = (example.make_model(schedule, 8, 3, True, fused)
                                  for fused in (False, True))
    params = unfused_model.init(jax.random.PRNGKey(3), x)["params"]
    assert jax.tree_util.tree_structure(fused_model.init(jax.random.PRNGKey(3), x, y)["params"]) \
        == jax.tree_util.tree_structure(params)

    def unfused_loss(p: Any) -> jax.Array:
        return optax.l2_loss(unfused_model.apply({"params": p}, x), y).mean()

    def fused_loss(p: Any) -> jax.Array:
        return fused_model.apply({"params": p}, x, y)

    assert isinstance(fused_model, nn.Module)
    assert_close(jax.jit(jax.value_and_grad(fused_loss))(params),
                 jax.jit(jax.value_and_grad(unfused_loss))(params))
    with pytest.raises(ValueError, match="fused_readout"):
        example.make_model(schedule, 8, 3, False, True)


def test_tune_under_the_output_floor_exits_3_and_fused_readout_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The done-when of issue 13 at T=1000 (the 60MB budget at T=10^4, scaled by T/10):
    unfused nothing fits; by default (issue 47: the search tries both readouts) the pick
    is fused."""
    monkeypatch.chdir(tmp_path)  # tune remembers its study in ./runs
    common = ["tune", "--seq-len", "1000", "--budget", "6MB", "--time-budget", "0.05", "--no-progress"]
    assert main([*common, "--trials", "2", "--unfused-readout", "--storage",
                 f"sqlite:///{tmp_path}/a.db", "--out", str(tmp_path / "a.yaml")]) == 3
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert "nothing fits in 6 MB" in err and "that no schedule can remove" in err
    assert "per-step outputs stacked by the scan 5.12 MB" in err  # T x B x H float32
    for fix in ("--fused-readout", "autoremat.fuse_loss", "--seq-len", "--batch"):
        assert fix in err, fix
    assert "floor no schedule removes" in captured.out  # the summary's breakdown
    assert main([*common, "--trials", "4", "--storage", f"sqlite:///{tmp_path}/b.db",
                 "--out", str(tmp_path / "b.yaml")]) == 0
    out = capsys.readouterr().out
    assert "fuse chosen" in out
    # its plain scan is the fused one: the table says what "vs plain" compares with
    assert "vs plain: against the plain scan with the readout and loss moved into its step" in out
    assert read_schedule(str(tmp_path / "b.yaml")).fuse is True
    assert main(["show", str(tmp_path / "b.yaml")]) == 0
    shown = capsys.readouterr().out
    assert "arguments: params" in shown and "opt_state" in shown
    assert "per-step outputs stacked by the scan 0 B" in shown


def test_fused_readout_with_last_only_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--last-only", "--fused-readout", "--seq-len", "10"]) == 2
    assert "--fused-readout: the loss on the last state" in capsys.readouterr().err
    assert main(["tune", "--fused-readout", "--unfused-readout", "--seq-len", "10"]) == 2
    assert "give one, or neither" in capsys.readouterr().err
    assert main(["tune", "--problem", "layer_stack", "--unfused-readout"]) == 2
    assert "--unfused-readout: sizes the built-in seed_lstm only" in capsys.readouterr().err



def test_fused_readout_is_a_study_file_key(tmp_path: Path) -> None:
    from autoremat._cli.settings import UsageError, check_settings, read_study_file

    path = tmp_path / "study.yaml"
    path.write_text("fused-readout: true\nseq_len: 100\n")
    assert read_study_file(str(path)) == {"fused_readout": True, "seq_len": 100}
    with pytest.raises(UsageError, match="--fused-readout: expected true or false, got 'yes'"):
        check_settings({"fused_readout": "yes"})
