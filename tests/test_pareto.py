"""The front, its table/JSON, the plot, export and show."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

import autoremat
from autoremat._cli.front_text import front_json, front_table
from autoremat._cli.plot import plot_study
from autoremat._cli.show_text import describe_schedule
from autoremat._errors import TuneError
from autoremat._measure.stale import load_schedule
from autoremat._schedules import save_schedule
from autoremat._search.pareto import dominates, export_trial, pareto_front
from autoremat._search.study import choose, load_study
from autoremat._search.tune import tune
from tests.helpers import add_measured_trial
from tests.tiny_problem import tiny

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _synthetic(n: int, budget: int, seed: int) -> Any:
    """A study of fake measurements (random figures) to check the front's logic."""
    rng = random.Random(seed)
    study = optuna.create_study(directions=["minimize", "minimize"])
    study.set_user_attr("budget_bytes", budget)
    study.set_user_attr("seq_len", 64)
    for i in range(n):
        total = rng.randint(100, 2000)
        status = rng.choice(["ok", "ok", "ok", "over_budget"]) if total <= budget else "over_budget"
        step = rng.choice([1.0, 2.0, 3.0, rng.uniform(0.5, 5)]) if status == "ok" else None
        schedule = autoremat.nested([64 // 2 ** (i % 3 + 1), 2 ** (i % 3 + 1)], unroll=i % 4 + 1)
        add_measured_trial(study, schedule, total, step, status)
    return study


@pytest.mark.parametrize("seed", range(8))
def test_front_is_exactly_the_non_dominated_feasible_trials(seed: int) -> None:
    budget = 1500
    study = _synthetic(40, budget, seed)
    front = pareto_front(study)
    listed = {p.number for p in front}
    feasible = [t for t in study.trials if t.user_attrs["feasible"]
                and t.user_attrs["total_bytes"] <= budget]
    point = {t.number: (t.user_attrs["total_bytes"], t.user_attrs["step_seconds"])
             for t in feasible}
    assert listed <= set(point)
    for a in listed:
        assert not any(dominates(point[b], point[a]) for b in point)
    for t in feasible:
        if t.number not in listed:
            assert any(dominates(point[p], point[t.number]) for p in listed)
    assert [p.total_bytes for p in front] == sorted(p.total_bytes for p in front)
    chosen = [p for p in front if p.chosen]
    assert len(chosen) == 1 and chosen[0].number == choose(study).number
    assert min(p.ratio_to_fastest for p in front) == 1.0
    table = front_table(front, budget)
    assert table.count("\n") == len(front) + 2  # title, header, rows, legend
    assert f"* {chosen[0].number:>5}" in table
    data = json.loads(front_json(front, budget))
    assert data["budget_bytes"] == budget and len(data["front"]) == len(front)


def test_empty_front() -> None:
    study = _synthetic(5, 50, 0)  # budget below every total
    assert pareto_front(study) == []
    assert "0 points" in front_table([], 50)


@pytest.fixture(scope="module")
def real_study(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    folder = tmp_path_factory.mktemp("study")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        tune(tiny(), 2400, n_trials=5, time_budget=0.02, study_name="p")
        yield load_study("p"), folder


def test_plot_is_a_valid_png_and_svg(real_study: tuple[Any, Path]) -> None:
    study, folder = real_study
    png = plot_study(study, folder / "front.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    svg = plot_study(study, folder / "front.svg")
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text and "chosen: trial" in text


def test_export_then_load_gives_the_trials_schedule(real_study: tuple[Any, Path]) -> None:
    study, folder = real_study
    for point in pareto_front(study):
        schedule = export_trial(study, point.number)
        path = save_schedule(schedule, folder / f"t{point.number}.yaml")
        loaded = load_schedule(path, problem=tiny())
        trial = study.trials[point.number]
        assert loaded.key() == trial.user_attrs["schedule_key"]
        assert loaded.meta["trial"] == point.number
        assert loaded.meta["total_bytes"] == point.total_bytes
        assert loaded.meta["step_seconds"] == point.step_seconds
        summary = describe_schedule(loaded)
        assert point.schedule in summary and "measured: total" in summary
    with pytest.raises(TuneError, match=r"^trial: no trial 999 in study 'p'"):
        export_trial(study, 999)


def test_export_refuses_trials_without_a_measurement() -> None:
    study = _synthetic(2, 1500, 0)
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.PRUNED, user_attrs={"duplicate_of": 0}))
    with pytest.raises(TuneError, match=r"^trial: trial 2 has no measured schedule "
                                        r"\(duplicate of trial 0\)"):
        export_trial(study, 2)


def test_describe_schedule_without_meta() -> None:
    text = describe_schedule(autoremat.nested([10, 10], ["nothing_saveable", "dots_saveable"]))
    assert text.splitlines()[0] == "schedule: 10x10 nothing/dots unroll=1"
    assert "meta: none" in text


def test_front_points_carry_recompute_and_distance_to_the_optimum() -> None:
    study = optuna.create_study(directions=["minimize", "minimize"])
    study.set_user_attr("budget_bytes", 10_000)
    study.set_user_attr("seq_len", 64)
    for total, step, schedule in [(900, 1.0, autoremat.nested([64], "none")),
                                  (300, 2.0, autoremat.nested([8, 8], "nothing_saveable")),
                                  (100, 3.0, autoremat.binomial(4))]:
        attrs = {"measured": True, "status": "ok", "feasible": True, "total_bytes": total,
                 "step_seconds": step, "schedule": schedule.to_data(),
                 "schedule_key": schedule.key(), "reason": ""}
        study.add_trial(optuna.trial.create_trial(values=[float(total), step], user_attrs=attrs))
    front = {p.schedule: p for p in pareto_front(study)}
    assert front["64 no-remat unroll=1"].recompute == 1.0
    assert front["8x8 nothing/nothing unroll=1"].recompute == 3.0
    assert front["8x8 nothing/nothing unroll=1"].vs_optimum > 1.0
    assert front["binomial s=4 unroll=1"].vs_optimum == 1.0
    table = front_table(list(front.values()), 10_000)
    assert "recompute" in table and "binomial s=4" in table


def test_describe_a_binomial_schedule() -> None:
    text = describe_schedule(autoremat.binomial(8).with_meta(seq_len=100))
    assert "binomial (Revolve) checkpointing: 8 carries" in text
    assert "at T = 100:" in text and "step evaluations" in text


def test_the_plot_draws_a_cut_trial_as_cut_not_over_budget(tmp_path: Path) -> None:
    """Issue 30: a cut trial (ok, timed once and stopped as slower: ``cut_seconds``,
    no ``step_seconds``) far under the budget was drawn as "over budget, not timed"."""
    from autoremat._search.pareto import plot_groups

    study = optuna.create_study(directions=["minimize", "minimize"])
    study.set_user_attr("budget_bytes", 4000)
    study.set_user_attr("seq_len", 64)
    rows = [("ok", 1000, 1.0, None), ("ok", 500, None, 3.5), ("over_budget", 5000, None, None),
            ("error", 800, None, None), ("ok", 2000, 0.5, None)]
    for i, (status, total, step, cut) in enumerate(rows):
        schedule = autoremat.nested([64 // 2 ** (i % 3 + 1), 2 ** (i % 3 + 1)], unroll=i + 1)
        attrs = {"measured": True, "status": status, "feasible": status == "ok",
                 "total_bytes": total, "step_seconds": step, "cut_seconds": cut,
                 "schedule": schedule.to_data(), "schedule_key": schedule.key(), "reason": ""}
        study.add_trial(optuna.trial.create_trial(
            values=[float(total), step or cut or float("inf")], user_attrs=attrs))
    groups, failed = plot_groups(study)
    by_kind = {g.kind: g for g in groups}
    assert set(by_kind) == {"timed", "cut", "over"} and failed == 1
    assert by_kind["cut"].trials == (1,) and by_kind["cut"].points == ((500.0, 3.5),)
    assert by_kind["cut"].label.startswith("cut: timed once") and "(1)" in by_kind["cut"].label
    assert by_kind["over"].trials == (2,)  # only the one over budget
    assert by_kind["over"].label == "over budget, not timed (1)"
    assert by_kind["timed"].trials == (0, 4) and by_kind["timed"].label == "within budget (2)"
    assert plot_study(study, tmp_path / "p.svg").read_text().count("cut: timed once") == 1
    header = front_table(pareto_front(study), 4000).splitlines()[1]  # a CPU study: as before
    assert header == (f"  {'trial':>5}  {'total':>10}  {'step':>10}  {'vs fastest':>10}  "
                      f"{'recompute':>9}  {'vs opt':>6}  {'timed':>16}  schedule")
