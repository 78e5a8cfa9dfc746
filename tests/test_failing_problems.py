"""A step that raises, fails to build or compile, or returns NaN: a FAIL trial with
the reason, and the study goes on (``tests/faulty_problem.py:faulty``)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autoremat._schedules import read_schedule
from autoremat._search.space import seeds
from autoremat.cli import main
from tests.faulty_problem import FAIL_BUILD, FAIL_COMPILE, FAIL_NAN, FAIL_RUN

ROOT = Path(__file__).resolve().parents[1]
FAULTY = f"{ROOT / 'tests' / 'faulty_problem.py'}:faulty"

REASONS = {
    FAIL_RUN: "run failed: JaxRuntimeError: INTERNAL: CpuCallback error calling callback: "
              "RuntimeError: step exploded at run time",
    FAIL_BUILD: "build failed: RuntimeError: build exploded",
    FAIL_COMPILE: "compile failed: TypeError: add got incompatible shapes for broadcasting",
    FAIL_NAN: "non-finite output:",
}


def test_failing_schedules_are_failed_trials_and_the_study_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The command line's tune, in this process (its exit code and output are the
    command's; the command in a process of its own: ``tests/test_cli.py``)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOREMAT_STORAGE", raising=False)
    code = main(["tune", "--problem", FAULTY, "--budget", "1MB", "--trials", "6",
                 "--time-budget", "0.02", "--study-name", "faulty", "--no-progress"])
    r = capsys.readouterr()
    assert code == 0, r.out + r.err
    assert "wrote schedule.yaml" in r.out and "(10 trials" not in r.out

    study = optuna.load_study(study_name="faulty",
                              storage=f"sqlite:///{tmp_path / 'runs' / 'autoremat.db'}")
    trials = study.get_trials()
    keys = [s.key() for s, _ in seeds(32)]
    for i, reason in REASONS.items():
        t = trials[i]
        assert t.user_attrs["schedule_key"] == keys[i]
        assert t.state == TrialState.FAIL and t.user_attrs["measured"]
        assert t.user_attrs["status"] == "error" and not t.user_attrs["feasible"]
        assert t.user_attrs["reason"].startswith(reason), t.user_attrs["reason"]
        assert "Traceback" not in t.user_attrs["reason"] and "\n" not in t.user_attrs["reason"]
        # one line per failure on stderr, and the search went on
        assert f"autoremat: trial {i} failed (" in r.err and reason in r.err
    # a schedule that failed to build or compile measured nothing: it is not one of the
    # 6 trials asked for, so 4 more were timed (2 seeds and 2 planned)
    assert [i for i, t in enumerate(trials) if t.user_attrs.get("compile_failed")] == [
        FAIL_BUILD, FAIL_COMPILE]
    ok = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(ok) == 4 and all(t.user_attrs["feasible"] for t in ok)
    best = read_schedule(tmp_path / "schedule.yaml")
    assert best.meta["trial"] in {t.number for t in ok}
    assert "6 measured now" in r.out
