"""tune(): the study, its budget constraint, choosing, storage and resumption."""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
import pytest

import autoremat
from autoremat._cli.breakdown_text import nothing_fits_message
from autoremat._errors import TuneError
from autoremat._measure.measure import measure
from autoremat._measure.measurement import Measurement
from autoremat._measure.stale import StaleScheduleWarning, load_schedule, schedule_mismatches
from autoremat._search.storage import redact
from autoremat._search.study import (
    MeasuredTrial,
    choose,
    load_study,
    measured_trials,
)
from autoremat._search.tune import tune
from tests.tiny_problem import tiny

BUDGET = 2400  # the tiny plain scan needs ~2.6 KB, nested schedules ~1.9 KB
#: under the tiny plain scan on every JAX line (2.1 KB on jax 0.12, 2.6 KB on 0.10)
UNDER_PLAIN = 2000

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
    result = tune(problem, UNDER_PLAIN, n_trials=6, time_budget=0.02, out="s.yaml")
    assert result.best is not None and result.measured == 6
    assert (in_tmp / "runs" / "autoremat.db").is_file()
    assert not (in_tmp / "runs" / "last_study.json").exists()  # the CLI's business
    loaded = load_schedule("s.yaml", problem=problem)
    assert loaded.key() == result.best.key()
    again = measure(problem, loaded, budget_bytes=UNDER_PLAIN, time_budget=0.02)
    assert again.feasible and again.total_bytes <= UNDER_PLAIN
    assert again.total_bytes == loaded.meta["total_bytes"]  # compile-time figure is stable
    for key in ("problem", "fingerprint", "device_kind", "jax_version", "flax_version",
                "budget_bytes", "total_bytes", "step_seconds", "study_name", "storage", "date"):
        assert loaded.meta[key] is not None, key
    assert loaded.meta["budget_bytes"] == UNDER_PLAIN and loaded.meta["problem"] == problem.name

    study = load_study(result.study_name)
    assert study.study_name == result.study_name
    assert {"budget_bytes", "problem", "fingerprint"} <= study.user_attrs.keys()
    for t in study.trials:
        if t.user_attrs.get("measured"):
            assert set(TRIAL_ATTRS) <= t.user_attrs.keys()
            assert "schedule" in t.user_attrs and "meta" not in t.user_attrs["schedule"]
            # the typed measurement round-trips through the trial's user attrs
            assert Measurement.from_attrs(t.user_attrs).to_attrs().items() <= t.user_attrs.items()
    trials = measured_trials(study)
    assert len(trials) == 6
    # The plain scan (enqueued first) is over budget: sized, constrained, never timed.
    plain = next(t for t in trials if t.number == 0)
    assert plain.schedule.key() == plain.measurement.schedule_key == autoremat.plain(32).key()
    assert plain.measurement.step_seconds is None and not plain.measurement.feasible
    assert not plain.measurement.fits(UNDER_PLAIN) and result.plain_trial == plain
    assert study.trials[0].system_attrs["constraints:memory"] > 0
    # The chosen trial is the fastest of those that fit.
    fits = [t for t in trials if t.measurement.fits(UNDER_PLAIN)]
    fastest = min(t.measurement.step_seconds for t in fits)
    assert result.best_trial is not None and result.best_trial == choose(study)
    assert result.best_trial.measurement.step_seconds == fastest
    assert result.best.meta["trial"] == result.best_trial.number


def test_resume_adds_trials_and_never_measures_a_schedule_twice(in_tmp: Path) -> None:
    first = tune(tiny(), BUDGET, n_trials=4, time_budget=0.02, study_name="s")
    second = tune(tiny(), BUDGET, n_trials=3, time_budget=0.02, study_name="s", seed=0)
    assert second.study_name == first.study_name
    # the first call left one enqueued seed waiting; the second ran it, then two more
    assert second.measured == 3 and second.n_trials >= first.n_trials + 2
    study = load_study("s")
    keys = [t.measurement.schedule_key for t in measured_trials(study)]
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
        load_study("nope")


def test_nothing_fits(in_tmp: Path) -> None:
    result = tune(tiny(), 600, n_trials=3, time_budget=0.02, out="s.yaml")  # args: 576 B
    assert result.best is None and not (in_tmp / "s.yaml").exists()
    s = result.smallest_trial
    assert s is not None and s.measurement.total_bytes > 600
    assert result.best_trial is None
    message = nothing_fits_message(result)
    assert message.startswith("nothing fits in 600 B")
    assert "smallest total measured is" in message and s.schedule.describe() in message
    assert f"({s.measurement.total_bytes} bytes), trial {s.number}:" in message


def test_failed_schedules_are_recorded_and_the_search_goes_on(in_tmp: Path) -> None:
    result = tune(tiny(nan_for_plain=True), 10**6, n_trials=3, time_budget=0.02)
    study = load_study(result.study_name)
    first = study.trials[0]
    assert first.state == optuna.trial.TrialState.FAIL
    assert "non-finite output" in first.user_attrs["reason"]
    failed = MeasuredTrial.of(first)
    assert failed is not None and failed.measurement.status == "error"
    assert "non-finite output" in failed.measurement.reason
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
    assert schedule_mismatches(autoremat.plain(8), tiny(seq_len=16)) == []  # no meta


def test_measurement_from_attrs_round_trips_and_refuses_what_is_not_one() -> None:
    m = Measurement("k", "ok", total_bytes=100, step_seconds=0.5, step_samples=(0.4, 0.5, 0.6),
                    device_kind="cpu")
    assert Measurement.from_attrs(m.to_attrs()) == m
    assert Measurement.from_attrs({**m.to_attrs(), "describe": "x", "measured": True}) == m
    assert m.fits(100) and not m.fits(99)
    assert not Measurement("k", "over_budget", total_bytes=10).fits(100)  # not timed
    with pytest.raises(TuneError, match=r"trial attrs: no 'status'"):
        Measurement.from_attrs({"schedule_key": "k"})


def test_tune_leaves_optunas_log_level_as_it_found_it(in_tmp: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.DEBUG)
    try:
        tune(tiny(), BUDGET, n_trials=1, time_budget=0.02, study_name="s")
        assert optuna.logging.get_verbosity() == optuna.logging.DEBUG
        with pytest.raises(TuneError):
            tune(tiny(), BUDGET, n_trials=1, storage="zzz")
        assert optuna.logging.get_verbosity() == optuna.logging.DEBUG
    finally:
        optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_the_library_names_its_arguments_not_flags(in_tmp: Path) -> None:
    with pytest.raises(TuneError, match=r"^storage: cannot open zzz"):
        tune(tiny(), BUDGET, n_trials=1, storage="zzz")
    with pytest.raises(TuneError, match=r"^heartbeat: expected whole seconds"):
        tune(tiny(), BUDGET, n_trials=1, heartbeat=0)
    with pytest.raises(TuneError, match=r"^study_name: no study 'nope'"):
        load_study("nope")


def test_redact_hides_passwords() -> None:
    assert redact("postgresql://me:secret@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert redact("sqlite:///runs/autoremat.db") == "sqlite:///runs/autoremat.db"
