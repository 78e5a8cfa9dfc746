"""On the accelerator itself (issue 35): the measured need against the bisected truth, the
proof of fit, the breakdown in device bytes, and values at ``highest`` precision.

Marked ``device``: skipped without an accelerator (CI, and the default suite, whose
xdist workers run on the CPU: ``tests/conftest.py``). Run them in one process that
holds the device: ``python -m pytest -m device -n 0``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat
from autoremat import Schedule, scan, seed_lstm
from autoremat._cli.printing import proof_line
from autoremat._measure import device_memory, within
from autoremat._measure.measure import compile_schedule, measure
from autoremat._search.reports import ProofOfFit, ProofOutcome
from autoremat._search.tune import tune

pytestmark = pytest.mark.device

T = 10_000
MB = 10**6
SCHEDULES = {
    "plain": autoremat.plain(T),
    "remat of each step": autoremat.nested([T], "nothing_saveable"),
    "sqrt(T) x sqrt(T)": autoremat.root(T, 2, "nothing_saveable"),
}


@pytest.fixture(scope="module")
def platform() -> str:
    found = jax.devices()[0].platform
    if found == "cpu":
        pytest.skip("no accelerator in this process (the default suite's workers run on the "
                    "CPU): run `python -m pytest -m device -n 0` on a TPU or GPU machine")
    return str(found)



def _true_need(schedule: Schedule) -> tuple[int | None, int | None, Any]:
    """The method's need (a first run), the bisected need of the freshly loaded program,
    and a work that loads and runs it afresh."""
    problem = seed_lstm(seq_len=T)
    step, args = problem.build(schedule)
    compiled = compile_schedule(problem, schedule, built=(step, args))
    executable = compiled.executable
    assert executable is not None, compiled.measurement.reason
    estimate = (compiled.measurement.total_bytes or 0) - (compiled.measurement.argument_bytes or 0)
    _, need = device_memory.need(lambda: within.free_outputs(executable(*args)),
                                 device_memory.meters())
    compiled.release()
    executable = None  # unloaded: the bisection loads the program afresh each try
    fresh = within.fresh_run(step, args)
    true = within.bisect_need(fresh, 2 * estimate + 256 * MB)
    return need, true, fresh


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_measured_need_is_within_5_percent_of_the_bisected_need(platform: str,
                                                                    name: str) -> None:
    need, true, _ = _true_need(SCHEDULES[name])
    assert need is not None and true is not None
    assert abs(need - true) <= 0.05 * true, (need, true)
    if platform in device_memory.VALIDATED:  # what the tuner records, the arguments aside
        m = measure(seed_lstm(seq_len=T), SCHEDULES[name], min_repeats=1, max_repeats=1)
        assert m.runtime_peak_bytes is not None and m.argument_bytes is not None
        assert abs(m.runtime_peak_bytes - m.argument_bytes - true) <= 0.05 * true


def test_the_step_runs_within_its_need_and_not_within_half(platform: str) -> None:
    _, true, once = _true_need(SCHEDULES["sqrt(T) x sqrt(T)"])
    assert true is not None
    assert within.runs_within(once, true + 4 * MB) == (True, "")
    ok, why = within.runs_within(once, true // 2)
    assert ok is False and "RESOURCE_EXHAUSTED" in why


def test_tune_writes_a_pick_that_passed_its_proof(platform: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    budget = 100 * MB
    result = tune(seed_lstm(seq_len=T), budget, n_trials=4, time_budget=0.2, out="s.yaml")
    assert result.best is not None and result.best_trial is not None
    assert result.best.meta["fit_proof_bytes"] == budget
    assert result.proof == ProofOfFit(ProofOutcome.PASSED, result.best_trial.number, budget)
    assert proof_line(result.proof).startswith(
        f"proof of fit: trial {result.best_trial.number} ran once")
    assert f"fit_proof_bytes: {budget}" in (tmp_path / "s.yaml").read_text()


def test_the_breakdown_adds_up_in_device_bytes(platform: str) -> None:
    m = measure(seed_lstm(seq_len=T), SCHEDULES["sqrt(T) x sqrt(T)"], run=False)
    assert m.argument_bytes is not None and m.stacked_bytes is not None
    assert sum(size for _, size in m.argument_parts) == m.argument_bytes
    assert m.stacked_bytes >= T * 10 * 128 * 4  # the shape's bytes, or more where padded


def test_gradients_equal_lax_scans_at_highest_precision(platform: str) -> None:
    """On the device, at ``highest`` matmul precision (its default agrees to ~3 digits)."""
    key = jax.random.PRNGKey(0)
    w = jax.random.normal(key, (16, 16)) / 4
    xs = jax.random.normal(jax.random.fold_in(key, 1), (300, 8, 16))

    def loss(w_: jax.Array, run: Any) -> jax.Array:
        _, hs = run(lambda h, x: (jnp.tanh(h @ w_ + x),) * 2, jnp.zeros((8, 16)), xs)
        return jnp.sum(hs**2)

    with jax.default_matmul_precision("highest"):
        want = jax.grad(loss)(w, jax.lax.scan)
        for schedule in (autoremat.root(300, 2, ["nothing_saveable", "everything_saveable"]),
                         autoremat.binomial(5)):
            got = jax.grad(loss)(w, lambda f, c, x, s=schedule: scan(f, c, x, schedule=s))
            scale = float(np.abs(np.asarray(want)).max())
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5,
                                       atol=1e-6 * scale, err_msg=schedule.describe())


def test_the_seed_problem_is_made_on_the_host_and_lives_on_the_device(platform: str) -> None:
    """Issue 47: its arguments are drawn by NumPy (no QR compiled for the accelerator,
    nothing waits for the device to start), then placed on the default device, where its
    step runs."""
    problem = seed_lstm(seq_len=100)
    step, args = problem.build(autoremat.plain(100))
    assert {d.platform for leaf in jax.tree.leaves(args) for d in leaf.devices()} == {platform}
    assert np.isfinite(float(jax.tree.leaves(jax.jit(step)(*args))[-1].sum()))
