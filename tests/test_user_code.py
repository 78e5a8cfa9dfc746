"""From the user's own code into the tool: a problem file importing the module beside it,
read-only commands that make no study folder, the Python API's text budgets."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from autoremat.cli import main

MODEL = '''\
import jax
import jax.numpy as jnp

import autoremat


def make_problem(seq_len=16, hidden=4):
    w = jnp.ones((hidden, hidden)) * 0.1
    x = jnp.ones((seq_len, hidden))

    def build(schedule):
        def loss_fn(w, x):
            def f(h, xt):
                return jnp.tanh(h @ w + xt), None

            h, _ = autoremat.scan(f, jnp.zeros(hidden), x, schedule=schedule)
            return jnp.sum(h ** 2)

        def step(w, x):
            loss, g = jax.value_and_grad(loss_fn)(w, x)
            return w - 0.1 * g, loss

        return step, (w, x)

    return autoremat.Problem(name="neighbour_rnn", seq_len=seq_len, build=build)
'''
PROBLEM = '''\
from neighbour_rnn_model import make_problem


def problem():
    return make_problem()
'''


@pytest.mark.parametrize("where", [".", "userdir"])
def test_a_problem_file_imports_the_module_beside_it(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    user = tmp_path / "userdir"
    user.mkdir()
    (user / "neighbour_rnn_model.py").write_text(MODEL)
    (user / "problem.py").write_text(PROBLEM)
    monkeypatch.chdir(user if where == "." else tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the folder added is taken back after
    monkeypatch.delitem(sys.modules, "neighbour_rnn_model", raising=False)
    monkeypatch.delenv("AUTOREMAT_STORAGE", raising=False)
    ref = "problem.py:problem" if where == "." else "userdir/problem.py:problem"
    # imported and built: the budget is then refused under the step's arguments (exit 3)
    assert main(["tune", "--problem", ref, "--budget", "16B", "--no-progress"]) == 3
    out, err = capsys.readouterr()
    assert "problem: neighbour_rnn" in out, out
    assert err.strip().splitlines()[-1].startswith(
        "autoremat: --budget: nothing fits in 16 B (16 bytes): the step's arguments alone "
        "take"), err
    assert not (tmp_path / "runs").exists() and not (user / "runs").exists()


@pytest.mark.parametrize("command", [["pareto", "--study-name", "foo"],
                                     ["export", "--format", "maxtext", "--study-name", "foo"],
                                     ["pareto", "--storage", "sqlite:///elsewhere/s.db",
                                      "--study-name", "foo"]])
def test_reading_a_study_in_an_empty_folder_makes_no_storage(
        command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOREMAT_STORAGE", raising=False)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "autoremat: error: --study-name: no study 'foo' in sqlite:///"), err
    assert err.endswith(": the file does not exist (no tune saved a study there); give the "
                        "storage that holds 'foo', or tune first\n"), err
    assert list(tmp_path.iterdir()) == []  # no runs/, no database, no lock


def test_the_suite_checks_that_no_test_writes_the_users_runs_folder(tmp_path: Path) -> None:
    from tests.conftest import USER_RUNS, runs_snapshot

    assert USER_RUNS.name == "runs"
    assert runs_snapshot(tmp_path / "runs") is None
    (tmp_path / "runs").mkdir()
    before = runs_snapshot(tmp_path / "runs")
    (tmp_path / "runs" / "autoremat.db").write_bytes(b"x")
    assert before == {} and runs_snapshot(tmp_path / "runs") != before


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, list[str]]:
    """A small tune from Python, as in a notebook: progress bar on, INFO logs kept."""
    import logging

    import autoremat
    from tests.tiny_problem import tiny

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("autoremat")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    storage = f"sqlite:///{tmp_path_factory.mktemp('study') / 's.db'}"
    try:
        result = autoremat.tune(tiny(), "1MB", n_trials=4, time_budget=0.02, storage=storage,
                                study_name="notebook", progress=True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return result, autoremat.load_study("notebook", storage), records


def test_tune_logs_each_trial_and_its_answer(tuned: tuple[Any, Any, list[str]],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    result, _, records = tuned
    assert records[0] == "tuning tiny(T=32,H=4) under 1 MB per device"
    trials = [r for r in records if r.startswith("trial ")]
    assert len(trials) >= 4 and "total " in trials[0] and "step " in trials[0]
    assert records[-1].startswith(f"study 'notebook': the pick is trial "
                                  f"{result.best_trial.number}, ")


def test_each_trial_records_its_schedule_as_params_optunas_tools_read(
        tuned: tuple[Any, Any, list[str]]) -> None:
    import optuna
    from optuna.trial import TrialState

    _, study, _ = tuned
    assert study.user_attrs["layer_stack"] is False  # a recurrence: exports say so
    done = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(done) >= 4
    for trial in done:
        assert trial.params and set(trial.params) == set(trial.distributions)
        assert trial.params["kind"] == trial.user_attrs["schedule"]["kind"]
        assert trial.params["unroll"] == trial.user_attrs["schedule"]["unroll"]
        assert trial.params["recompute"] >= 1.0 and trial.params["stored_carries"] >= 0
    # every trial's distributions agree, so Optuna's importance reads them
    with warnings.catch_warnings():  # few trials: Optuna warns its figures are rough
        warnings.simplefilter("ignore")
        importance = optuna.importance.get_param_importances(
            study, target=lambda t: t.values[1])
    assert {"kind", "unroll", "recompute", "stored_carries"} <= set(importance)


def test_the_api_reads_text_budgets_and_a_plain_scan_by_default(
        tuned: tuple[Any, Any, list[str]]) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import autoremat

    _, study, _ = tuned
    assert autoremat.pareto_front(study, "1MB") == autoremat.pareto_front(study, 10**6) \
        == autoremat.pareto_front(study)
    with pytest.raises(autoremat.BudgetError, match=r"^budget_bytes: cannot read '1 parsec'"):
        autoremat.pareto_front(study, "1 parsec")

    def loss(w: jax.Array, scan: Any) -> jax.Array:
        def f(h: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            h = jnp.tanh(h * w + x)
            return h, h ** 2

        h, ys = scan(f, jnp.zeros(3), jnp.linspace(0.0, 1.0, 24).reshape(8, 3))
        return jnp.sum(h) + jnp.sum(ys)

    w = jnp.float32(0.7)
    ours = jax.value_and_grad(loss)(w, lambda *a: autoremat.scan(*a, schedule=None))
    again = jax.value_and_grad(loss)(w, autoremat.scan)  # no schedule given: the same
    ref = jax.value_and_grad(loss)(w, jax.lax.scan)
    for got in (ours, again):
        np.testing.assert_allclose(np.array(got), np.array(ref), rtol=1e-5)
    program = str(jax.make_jaxpr(jax.grad(lambda w: loss(w, autoremat.scan)))(w))
    assert "checkpoint" not in program and "remat" not in program  # nothing recomputed


def test_public_docstrings_point_at_public_names_only() -> None:
    import inspect
    import re

    import autoremat

    found = []
    for name in autoremat.__all__:
        obj = getattr(autoremat, name)
        members = [obj, *(v for k, v in vars(obj).items() if not k.startswith("_"))] \
            if inspect.isclass(obj) else [obj]
        for member in members:
            doc = inspect.getdoc(getattr(member, "__func__", getattr(member, "fget", member)))
            found += [f"{name}: {m}" for m in re.findall(r"autoremat\._[\w.]+", doc or "")]
    assert found == []
