"""Short-run timing (short_runs) and the full-length confirmation of the pick (confirm)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest

import autoremat
import autoremat._search.short_runs as short_runs
from autoremat._cli.front_text import front_table
from autoremat._cli.plot import plot_study
from autoremat._cli.printing import event_line, result_table
from autoremat._cli.show_text import describe_schedule
from autoremat._measure.measure import compile_schedule
from autoremat._models.seed_lstm import seed_lstm
from autoremat._schedules import read_schedule
from autoremat._search.pareto import pareto_front
from autoremat._search.reports import TuneEvent
from autoremat._search.study import StudyInfo, load_study, measured_trials
from autoremat._search.tune import tune

T = 400
SHORT = 100
BUDGET = 50_000_000


@pytest.fixture()
def short(monkeypatch: pytest.MonkeyPatch) -> int:
    """Short runs of about ``SHORT`` steps for problems of ``2 * SHORT`` or more."""
    monkeypatch.setattr(short_runs, "SHORT_SEQ_LEN", SHORT)
    monkeypatch.setattr(short_runs, "MIN_SEQ_LEN", 2 * SHORT)
    return SHORT


def small(seq_len: int = T):
    return seed_lstm(seq_len=seq_len, batch=2, hidden=8, input_dim=4, seq2seq=False)


def test_each_kind_keeps_its_structure_in_the_short_run() -> None:
    nested = autoremat.nested([40, 10])
    assert nested.timing_length(T, SHORT) == 100  # whole chunks of 10
    assert autoremat.nested([4, 100]).timing_length(T, SHORT) == 200  # at least two chunks
    assert autoremat.nested([2, 7]).timing_length(T, SHORT) == 105  # whole chunks, >= short
    assert autoremat.plain(T).timing_length(T, SHORT) == SHORT
    assert autoremat.binomial(4).timing_length(T, SHORT) == SHORT
    assert autoremat.binomial(30).timing_length(T, SHORT) == 240  # 8 steps per snapshot
    assert autoremat.binomial(80).timing_length(T, SHORT) == T  # never past T
    # nested work is linear in whole chunks; binomial's re-runs grow faster than T
    assert short_runs.scale(nested, T, 100) == pytest.approx(4.0)
    b = autoremat.binomial(4)
    assert short_runs.scale(b, T, 100) == short_runs.work(b, T) / short_runs.work(b, 100) > 4.0
    assert short_runs.work(b, T) == b.cost(T).evaluations + short_runs.BACKWARD_EXTRA * T


def test_short_runs_only_when_the_problem_can_and_is_long_enough(short: int) -> None:
    problem = small()
    assert short_runs.timed_length(problem, autoremat.nested([40, 10])) == 100
    assert short_runs.timed_length(problem, autoremat.nested([2, 200])) == T  # > half of T
    assert short_runs.timed_length(small(150), autoremat.nested([15, 10])) == 150  # T < 2 short
    assert short_runs.timed_length(replace(problem, at_length=None),
                                 autoremat.nested([40, 10])) == T


def test_a_short_run_keeps_the_full_length_bytes_and_scales_its_time(short: int) -> None:
    problem, schedule = small(), autoremat.nested([40, 10])
    sized = compile_schedule(problem, schedule, budget_bytes=BUDGET)
    full_total = sized.measurement.total_bytes
    short_total = compile_schedule(problem.at_length(100), schedule).measurement.total_bytes
    assert full_total is not None and short_total is not None and short_total < full_total
    m = short_runs.ShortRuns(problem).time(schedule, sized, budget_bytes=BUDGET,
                                         time_budget=0.05, best=None)
    assert m.status == "ok" and m.total_bytes == full_total
    assert (m.timed_seq_len, m.short_seq_len) == (100, 100)
    assert m.short_seconds is not None and m.step_seconds is not None
    assert m.step_seconds == pytest.approx(4.0 * m.short_seconds)
    assert m.predicted(T) and not m.predicted(100)


def test_full_length_problems_record_their_length(short: int) -> None:
    problem = small(150)
    sized = compile_schedule(problem, autoremat.nested([15, 10]), budget_bytes=BUDGET)
    m = short_runs.ShortRuns(problem).time(autoremat.nested([15, 10]), sized,
                                         budget_bytes=BUDGET, time_budget=0.05, best=None)
    assert m.timed_seq_len == 150 and m.short_seq_len is None and m.short_seconds is None


def test_tune_times_short_then_confirms_the_pick_at_full_length(
        short: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    lines: list[TuneEvent] = []
    result = tune(small(), BUDGET, n_trials=3, time_budget=0.05, out="s.yaml",
                  on_confirm=lines.append)  # the seeds: all timed on short runs
    study = load_study(result.study_name)
    raw = [t.user_attrs for t in study.trials if t.user_attrs.get("measured")
           and t.user_attrs.get("step_seconds") is not None]
    assert raw and all(a["timed_seq_len"] < T for a in raw)  # every trial timed short
    best = result.best_trial
    assert best is not None and result.best is not None
    m = best.measurement
    assert m.timed_seq_len == T and not m.predicted(T)  # the answer is measured at T
    assert m.extrapolated_seconds is not None and m.short_seq_len is not None
    assert best in result.confirmed and lines and "predicted" in event_line(lines[0])
    # the trial's own attrs keep the prediction; the study attr holds the confirmation
    own = study.trials[best.number].user_attrs
    assert own["step_seconds"] == m.extrapolated_seconds != m.step_seconds
    assert study.user_attrs[f"confirmed:{best.number}"]["step_seconds"] == m.step_seconds
    assert read_schedule("s.yaml").meta["timed_seq_len"] == T
    assert "short runs had predicted" in describe_schedule(read_schedule("s.yaml"))
    table = result_table(result)
    assert "confirmed at full length" in table and f"T'={m.short_seq_len}" in table
    # Optuna's own tools read the study: named objectives, fidelity per trial
    assert optuna.load_study(study_name=result.study_name,
                             storage=result.storage).metric_names == ["total_bytes",
                                                                      "step_seconds"]


def test_a_pick_too_slow_for_the_limit_is_written_as_predicted(
        short: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import autoremat._search.confirm as confirm_module
    import autoremat._search.tune as tune_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tune_module, "confirm", lambda *a, **k: "")  # the search alone
    result = tune(small(), BUDGET, n_trials=3, time_budget=0.05, out="s.yaml")
    assert result.best is not None and result.best.meta["timed_seq_len"] < T
    assert "predicted from a run of T'=" in describe_schedule(result.best)
    study = load_study(result.study_name)
    assert plot_study(study, tmp_path / "front.png").stat().st_size > 0  # hollow: predicted
    assert "predicted T'=" in front_table(pareto_front(study), BUDGET, seq_len=T)
    monkeypatch.setattr(confirm_module, "ALWAYS_SECONDS", 0.0)
    note = confirm_module.confirm(study, small(), StudyInfo.of(study), time_limit=1e-9,
                                  time_budget=0.05)
    assert f"trial {result.best_trial.number}" in note and "time limit" in note
    assert "would time it" in note
    assert not any(t.measurement.extrapolated_seconds for t in measured_trials(study))


def test_the_answer_is_timed_at_full_length_when_any_was() -> None:
    from autoremat._measure.measurement import Measurement
    from autoremat._search.study import MeasuredTrial
    from autoremat._search.trials import fastest_fitting

    def trial(number: int, seconds: float, timed: int) -> MeasuredTrial:
        return MeasuredTrial(number, autoremat.nested([40, 10]), Measurement(
            "k", "ok", total_bytes=10, step_seconds=seconds, timed_seq_len=timed))

    predicted, confirmed = trial(0, 1.0, 100), trial(1, 2.0, T)
    assert fastest_fitting([predicted, confirmed], BUDGET, T) is confirmed  # not the faster guess
    assert fastest_fitting([predicted], BUDGET, T) is predicted  # nothing timed at T yet
    assert fastest_fitting([predicted, confirmed], BUDGET, 100) is predicted  # all full length


def test_a_loss_problem_is_timed_on_the_first_steps_of_its_batch(short: int) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from helpers import REWRITE_W as W
    from helpers import scan_loss

    from autoremat import Problem, ProblemError

    x = jax.random.normal(jax.random.PRNGKey(0), (2, T, 3))  # batch-major: time is axis 1
    y = jnp.ones((2,))

    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return scan_loss(p, x) + jnp.mean(y)

    problem = Problem.from_loss("rnn", loss, W, (x, y), optax.sgd(0.1))
    assert problem.at_length is not None
    cut = problem.at_length(100)
    assert (cut.seq_len, cut.arg_names) == (100, problem.arg_names)
    step, args = cut.build(autoremat.nested([10, 10]))
    np.testing.assert_allclose(jax.jit(step)(*args)[2], loss(W, x[:, :100], y), rtol=1e-5)
    assert short_runs.ShortRuns(problem).length(autoremat.nested([20, 10])) == 100

    # B == T: which axis is time is not known, so no short runs
    square = jax.random.normal(jax.random.PRNGKey(0), (T, T, 3))
    assert Problem.from_loss("rnn", scan_loss, W, (square,), optax.sgd(0.1)).at_length is None

    # a scan whose length does not follow the batch: refused, timed at full length
    def fixed(p: Any, x: jax.Array) -> jax.Array:
        return scan_loss(p, jnp.zeros((2, T, 3)) + x[:, :1])

    stuck = Problem.from_loss("rnn", fixed, W, (x,), optax.sgd(0.1))
    with pytest.raises(ProblemError, match=r"at_length: .* longest scan has 400 steps, not 100"):
        stuck.at_length(100)  # type: ignore[misc]
    schedule = autoremat.nested([20, 10])
    runs = short_runs.ShortRuns(stuck)
    with pytest.warns(RuntimeWarning, match="timed at full length"):
        m = runs.time(schedule, compile_schedule(stuck, schedule), budget_bytes=BUDGET,
                      time_budget=0.05, best=None)
    assert m.status == "ok" and m.timed_seq_len == T and runs.scale(schedule) == 1.0
