"""From the user's own code into the tool: a problem file importing the module beside it,
read-only commands that make no study folder, the Python API's text budgets."""

from __future__ import annotations

import sys
from pathlib import Path

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
