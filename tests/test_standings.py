"""The planner's standings, alone: the best that fits, the patience, the most a size
overstated a run."""

from __future__ import annotations

from autoremat._measure.measurement import OK, OVER_BUDGET, Measurement
from autoremat._search.planning.standings import IMPROVES, PATIENCE, Standings


def timed(key: str, total: int, seconds: float, peak: int | None = None) -> Measurement:
    return Measurement(key, OK, "", total_bytes=total, runtime_peak_bytes=peak,
                       step_seconds=seconds)


def test_the_best_is_the_fastest_timed_schedule_that_fits() -> None:
    s = Standings(budget_bytes=100)
    assert s.best is None
    s.record("fast but over", timed("fast but over", 150, 0.1))
    s.record("cut", Measurement("cut", OK, "", total_bytes=50, cut_seconds=0.05))
    assert s.best is None  # over the budget, or cut after one run: not the best
    s.record("slow", timed("slow", 90, 0.3))
    s.record("fits", timed("fits", 80, 0.2))
    assert s.best == ("fits", 80, 0.2)
    assert s.measured().keys() == {"fast but over", "cut", "slow", "fits"}
    assert s.cut == {"cut": (50, 0.05)} and "cut" not in s.timed


def test_a_new_best_is_told_once_and_only_a_real_improvement_restores_the_patience() -> None:
    s = Standings(budget_bytes=100)
    s.record("a", timed("a", 50, 1.0))
    assert s.new_best() == "a" and s.new_best() is None
    for _ in range(PATIENCE):
        s.compiled_within(True)
    s.compiled_within(False)  # over the budget: not counted
    assert s.patience_left() == 0
    s.record("b", timed("b", 50, 1.0 - IMPROVES / 2))  # faster, within the noise
    assert s.new_best() == "b" and s.patience_left() == 0
    s.record("c", timed("c", 50, 0.9))
    assert s.new_best() == "c" and s.patience_left() == PATIENCE


def test_a_retimed_leader_within_the_noise_of_the_last_is_no_improvement() -> None:
    """A re-timing revises figures: a challenger that now leads, by less than ``IMPROVES``
    over the last best as re-timed, restores no patience (on a TPU a noisy first timing of
    the last best made one look 2% better, and the search went on for two trials more)."""
    s = Standings(budget_bytes=100)
    s.record("a", timed("a", 50, 1.02))  # a noisy timing
    assert s.new_best() == "a"
    for _ in range(PATIENCE):
        s.compiled_within(True)
    s.record("a", timed("a", 50, 1.0))  # re-timed in turn with "b"
    s.record("b", timed("b", 50, 0.995))
    assert s.new_best() == "b" and s.patience_left() == 0
    s.record("b", timed("b", 50, 0.98))  # the leader's own figure revised: no improvement
    assert s.new_best() is None and s.patience_left() == 0
    s.record("c", timed("c", 50, 0.9))
    assert s.new_best() == "c" and s.patience_left() == PATIENCE


def test_overstated_is_the_most_a_size_exceeded_its_runs_peak() -> None:
    s = Standings(budget_bytes=10)
    assert s.reach("tpu").overstated is None  # no run's peak yet
    s.record("a", timed("a", 12, 1.0, peak=9))
    s.record("b", Measurement("b", OVER_BUDGET, "", total_bytes=20, runtime_peak_bytes=15))
    s.record("c", timed("c", 8, 1.0, peak=7))
    reach = s.reach("tpu")
    assert reach.overstated == 5 and reach.budget_bytes == 10 and reach.platform == "tpu"
    assert reach.timed == ((9, 1.0), (7, 1.0))  # the fit: the runtime peak
