"""tune(): the study, its budget constraint, choosing, storage and resumption."""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
import pytest

from autoremat._check import StaleScheduleWarning, load_schedule, schedule_mismatches
from autoremat._measure import measure
from autoremat._schedule import Schedule
from autoremat._tune import (
    LAST_STUDY_FILE,
    TuneError,
    choose,
    load_study,
    measured_trials,
    nothing_fits_message,
    redact,
    tune,
    within_budget,
)
from tests.tiny_problem import tiny

BUDGET = 2400  # the tiny plain scan needs ~2.6 KB, nested schedules ~1.9 KB

TRIAL_ATTRS = (
    "schedule", "schedule_key", "total_bytes", "temp_bytes", "argument_bytes", "output_bytes",
    "alias_bytes", "step_seconds", "compile_seconds", "feasible", "reason", "device_kind",
    "peak_bytes",
)


@pytest.fixture()
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_tune_writes_a_schedule_that_fits_when_remeasured(in_tmp: Path) -> None:
    problem = tiny()
    result = tune(problem, BUDGET, n_trials=6, time_budget=0.02, out="s.yaml")
    assert result.best is not None and result.measured == 6
    assert (in_tmp / "runs" / "autoremat.db").is_file() and LAST_STUDY_FILE.is_file()
    loaded = load_schedule("s.yaml", problem=problem)
    assert loaded.key() == result.best.key()
    again = measure(problem, loaded, budget_bytes=BUDGET, time_budget=0.02)
    assert again.feasible and again.total_bytes <= BUDGET
    assert again.total_bytes == loaded.meta["total_bytes"]  # compile-time figure is stable
    for key in ("problem", "fingerprint", "device_kind", "jax_version", "flax_version",
                "budget_bytes", "total_bytes", "step_seconds", "study_name", "storage", "date"):
        assert loaded.meta[key] is not None, key
    assert loaded.meta["budget_bytes"] == BUDGET and loaded.meta["problem"] == problem.name

    study = load_study()
    assert study.study_name == result.study_name
    assert {"budget_bytes", "problem", "fingerprint"} <= study.user_attrs.keys()
    trials = measured_trials(study)
    for t in trials:
        assert set(TRIAL_ATTRS) <= t.user_attrs.keys()
        assert "schedule" in t.user_attrs and "meta" not in t.user_attrs["schedule"]
    # The plain scan (enqueued first) is over budget: sized, constrained, never timed.
    plain = next(t for t in trials if t.number == 0)
    assert plain.user_attrs["schedule_key"] == Schedule.plain(32).key()
    assert plain.user_attrs["step_seconds"] is None and not plain.user_attrs["feasible"]
    assert plain.system_attrs["constraints:memory"] > 0
    # The chosen trial is the fastest of those that fit.
    fits = [t for t in trials if within_budget(t, BUDGET)]
    fastest = min(t.user_attrs["step_seconds"] for t in fits)
    assert result.best_attrs["step_seconds"] == fastest == choose(study).user_attrs["step_seconds"]


def test_resume_adds_trials_and_never_measures_a_schedule_twice(in_tmp: Path) -> None:
    first = tune(tiny(), BUDGET, n_trials=4, time_budget=0.02, study_name="s")
    second = tune(tiny(), BUDGET, n_trials=3, time_budget=0.02, study_name="s", seed=0)
    assert second.study_name == first.study_name
    assert second.n_trials >= first.n_trials + 3
    study = load_study(study_name="s")
    keys = [t.user_attrs["schedule_key"] for t in measured_trials(study)]
    assert len(keys) == 7 and len(set(keys)) == len(keys)
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    for t in pruned:
        assert t.user_attrs["schedule_key"] in keys and "duplicate_of" in t.user_attrs


def test_resuming_with_another_budget_or_problem_is_refused(in_tmp: Path) -> None:
    tune(tiny(), BUDGET, n_trials=1, time_budget=0.02, study_name="s")
    with pytest.raises(TuneError, match=r"study 's' was run with budget_bytes=2400.*another"):
        tune(tiny(), BUDGET + 1, n_trials=1, study_name="s")
    with pytest.raises(TuneError, match=r"was run with problem="):
        tune(tiny(seq_len=16), BUDGET, n_trials=1, study_name="s")
    with pytest.raises(TuneError, match=r"no study 'nope'.*studies there: 's'"):
        load_study(study_name="nope")


def test_nothing_fits(in_tmp: Path) -> None:
    result = tune(tiny(), 10, n_trials=3, time_budget=0.02, out="s.yaml")
    assert result.best is None and not (in_tmp / "s.yaml").exists()
    s = result.smallest_attrs
    assert s is not None and s["total_bytes"] > 10
    message = nothing_fits_message(result)
    assert message.startswith("nothing fits in 10 B")
    assert "smallest total measured is" in message and s["describe"] in message


def test_failed_schedules_are_recorded_and_the_search_goes_on(in_tmp: Path) -> None:
    result = tune(tiny(nan_for_plain=True), 10**6, n_trials=3, time_budget=0.02)
    study = load_study()
    first = study.trials[0]
    assert first.state == optuna.trial.TrialState.FAIL
    assert "non-finite output" in first.user_attrs["reason"]
    assert result.best is not None and result.measured == 3


def test_stale_schedule_warnings(in_tmp: Path) -> None:
    problem = tiny()
    tune(problem, BUDGET, n_trials=3, time_budget=0.02, out="s.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_schedule("s.yaml", problem=problem)  # same problem: no warning
    with pytest.warns(StaleScheduleWarning, match=r"other argument shapes.*seq_len 32"):
        load_schedule("s.yaml", problem=tiny(seq_len=16))
    schedule = load_schedule("s.yaml")
    assert schedule_mismatches(schedule, device_kind="TPU v9") == [
        f"tuned on device {schedule.meta['device_kind']!r}, running on 'TPU v9'"]
    assert schedule_mismatches(schedule.with_meta(), problem) == []
    assert schedule_mismatches(Schedule.plain(8), tiny(seq_len=16)) == []  # no meta


def test_redact_hides_passwords() -> None:
    assert redact("postgresql://me:secret@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert redact("sqlite:///runs/autoremat.db") == "sqlite:///runs/autoremat.db"
