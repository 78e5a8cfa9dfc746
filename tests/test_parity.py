"""What a user deploys is what was measured: the README's two adoption paths -- the
``autoremat.linen.scan`` example and ``remat_scans`` around a loss as written -- compile to
within 2% of the total the tuner measured for the schedule (the built-in problem's step
under it), fused and unfused picks both; ``autoremat show --problem`` compiles the step and
prints the two figures."""

from __future__ import annotations

import contextlib
import functools
import io
import re
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from jax import lax

import autoremat
from autoremat._measure.measure import measure
from autoremat._measure.parity import Parity, check_parity
from autoremat.cli import main
from tests.helpers import assert_close, load_example

T, B, H, D, Y = 64, 2, 16, 32, 4  # the seed's input and output sizes, small T, B and H


@functools.cache
def tuned(fuse: bool) -> autoremat.Schedule:
    """The schedule with the figures the tuner records (``meta``), measured on the built-in
    problem with the readout in the step (``fuse``) or after the scan."""
    problem = autoremat.seed_lstm(seq_len=T, batch=B, hidden=H, fused_readout=fuse)
    schedule = autoremat.nested([8, 8]).with_fuse(fuse)
    m = measure(problem, schedule, run=False)
    assert m.total_bytes is not None and m.stacked_bytes is not None
    return schedule.with_meta(total_bytes=m.total_bytes, stacked_bytes=m.stacked_bytes,
                              seq_len=T, devices=1, budget_bytes=2 * m.total_bytes)


@pytest.fixture(scope="module", params=[True, False], ids=["fused", "unfused"])
def schedule(request: pytest.FixtureRequest) -> autoremat.Schedule:
    return tuned(request.param)


def total(compiled: Any) -> int:
    mem = compiled.memory_analysis()
    return int(mem.argument_size_in_bytes + mem.output_size_in_bytes
               + mem.temp_size_in_bytes - mem.alias_size_in_bytes)


def test_the_linen_example_compiles_to_the_tuned_total(schedule: autoremat.Schedule,
                                                       tmp_path: Path) -> None:
    """``python examples/seed_lstm.py --schedule schedule.yaml``: it follows the schedule's
    ``fuse`` and prints its compiled total as a multiple of the tuned one."""
    example = load_example("seed_lstm")
    path = tmp_path / "schedule.yaml"
    autoremat.save_schedule(schedule, path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert example.main(["--schedule", str(path), "--steps", "1", "--seq-len", str(T),
                             "--batch", str(B), "--hidden", str(H)]) == 0
    printed = out.getvalue()
    assert f"fused_readout={schedule.fuse}" in printed
    ratio = float(re.search(r"\(([\d.]+)x the tuned", printed).group(1))  # type: ignore[union-attr]
    assert ratio == pytest.approx(1, abs=0.02), printed
    assert re.search(r"step 0: loss \d", printed), printed


def test_remat_scans_around_the_loss_as_written_compiles_to_the_tuned_total(
        schedule: autoremat.Schedule) -> None:
    """The README's "any model, unmodified": ``lax.scan`` with the readout after it, wrapped
    in ``remat_scans``, which applies the schedule's ``fuse``; loss and gradients are the
    unwrapped loss's."""
    cell, readout, tx = nn.OptimizedLSTMCell(H), nn.Dense(Y), optax.adam(1e-3)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    x = jax.random.normal(keys[0], (B, T, D))
    y = jax.random.normal(keys[1], (B, T, Y))
    carry0 = cell.initialize_carry(keys[2], (B, D))
    params = {"cell": cell.init(keys[2], carry0, x[:, 0])["params"],
              "readout": readout.init(keys[3], carry0[1])["params"]}

    def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        def step(c: Any, xt: jax.Array) -> Any:
            return cell.apply({"params": params["cell"]}, c, xt)

        _, hs = lax.scan(step, carry0, jnp.moveaxis(x, 1, 0))
        preds = jnp.moveaxis(readout.apply({"params": params["readout"]}, hs), 0, 1)
        return optax.l2_loss(preds, y).mean()

    scheduled = autoremat.remat_scans(loss_fn, schedule)

    def train_step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
        loss, grads = jax.value_and_grad(scheduled)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    args = (params, tx.init(params), x, y)
    compiled = jax.jit(train_step).lower(*args).compile()
    assert total(compiled) / schedule.meta["total_bytes"] == pytest.approx(1, abs=0.02)
    assert_close(jax.jit(jax.value_and_grad(scheduled))(params, x, y),
                 jax.value_and_grad(loss_fn)(params, x, y))


def test_show_with_a_problem_compiles_it_beside_the_tuned_total(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fused = tuned(True)
    path = tmp_path / "fused.yaml"
    autoremat.save_schedule(fused, path)
    sizes = ["--seq-len", str(T), "--batch", str(B), "--hidden", str(H)]
    assert main(["show", str(path), "--problem", "seed_lstm", "--fused-readout", *sizes]) == 0
    assert re.search(r"compiled here: total .*, tuned .* \(1\.0\d\dx: the same program\)",
                     capsys.readouterr().out)
    # The step with the readout after the scan is another program: warned at its trace
    # (within the budget), then compiled beside the tuned total
    with pytest.warns(autoremat.ScheduleMismatchWarning, match="this scan stacks"):
        assert main(["show", str(path), "--problem", "seed_lstm", "--unfused-readout",
                     *sizes]) == 1
    assert re.search(r"\(1\.\d+x: differs\)", capsys.readouterr().out)
    # Over the budget it is refused at its trace: nothing compiles
    autoremat.save_schedule(fused.with_meta(budget_bytes=fused.meta["total_bytes"]), path)
    assert main(["show", str(path), "--problem", "seed_lstm", "--unfused-readout", *sizes]) == 1
    out = capsys.readouterr().out
    assert "compiled here: failed" in out and "ScheduleMismatchError" in out, out


def test_parity_compares_within_two_percent() -> None:
    assert Parity(1000, 1019).same and not Parity(1000, 1021).same
    assert Parity(None, 5).same and Parity(None, 5).ratio is None  # nothing to compare with
    assert not Parity(1000, None, "compile failed: ...").same
    unfused = autoremat.seed_lstm(seq_len=T, batch=B, hidden=H, fused_readout=False)
    schedule = tuned(False)
    parity = check_parity(schedule, unfused)
    assert parity.same and parity.compiled_bytes == schedule.meta["total_bytes"]
