"""Step times within the measured noise of each other are a tie, and the tie goes to the
smaller schedule, the plain scan last (``autoremat._search.trials.tie_break``); the spread
of a trial's own runs decides (``autoremat._measure.timing.spread``). Made-up figures:
no step runs, but for the proof of fit of a search timed by a fake timer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import autoremat
from autoremat._cli.printing import tie_lines
from autoremat._measure.measure import Compiled
from autoremat._measure.measurement import OK, Measurement
from autoremat._measure.timing import spread
from autoremat._schedules.base import Schedule
from autoremat._search import proof
from autoremat._search.reports import ProofOfFit, ProofOutcome
from autoremat._search.short_runs import ShortRuns
from autoremat._search.study import MeasuredTrial, TuneResult
from autoremat._search.trials import MAX_TIE, tie_break
from autoremat._search.tune import tune
from tests.tiny_problem import tiny

T = 100
BUDGET = 10**9
PLAIN = autoremat.plain(T)
NESTED = autoremat.nested([10, 10], ["nothing_saveable", "everything_saveable"])
OTHER = autoremat.nested([4, 25], ["nothing_saveable", "everything_saveable"])


def trial(number: int, schedule: Schedule, samples: tuple[float, ...],
          total: int) -> MeasuredTrial:
    seconds = sorted(samples)[len(samples) // 2]
    return MeasuredTrial(number, schedule, Measurement(
        schedule.key(), OK, "", total_bytes=total, step_seconds=seconds, step_samples=samples,
        timed_seq_len=T))


def test_the_spread_of_a_steps_runs_is_their_range_over_the_median_one_outlier_aside() -> None:
    assert spread(()) == spread((1.0,)) == 0.0  # no spread known
    assert spread((1.0, 1.02, 1.01)) == pytest.approx(0.02 / 1.01)
    assert spread((1.0, 1.0, 1.01, 2.0)) == pytest.approx(0.01)  # the slowest of four left out


def test_a_smaller_schedule_within_the_noise_of_the_plain_scan_is_picked() -> None:
    """The quick start on a busy CPU: plain 2.154 s, a nested schedule 0.1% slower at
    1/28 of its memory, both timed with runs 2% apart: the nested one is the pick, and the
    result says what it tied with."""
    fastest = trial(0, PLAIN, (2.140, 2.154, 2.184), 697_000_000)
    small = trial(1, NESTED, (2.150, 2.156, 2.190), 24_700_000)
    pick = tie_break([fastest, small], BUDGET, T)
    assert pick is not None and pick.pick is small and pick.fastest is fastest
    assert pick.tied and pick.fastest_is_plain
    assert pick.memory_ratio == pytest.approx(697 / 24.7)
    assert pick.noise == pytest.approx(max(spread(t.measurement.step_samples)
                                           for t in (fastest, small)))
    result = TuneResult("s", "sqlite://", BUDGET, small.schedule, small, fastest, small, 2, 2,
                        tie=pick)
    line = " ".join(tie_lines(result))
    assert "within noise of the plain scan (trial 0" in line and "28.2x less memory" in line


def test_a_plain_scan_ahead_after_the_runs_in_turn_by_less_than_its_own_noise_ties() -> None:
    """A fresh quick start on a 2-core CPU: the plain scan, timed first in the process at
    1.38-1.52 s, ran 1.30-1.32 s in turn with the leader, 2% ahead of a nested schedule
    whose runs in turn agreed within 1%. A re-timed trial's runs are those in turn and its
    own before (``MeasuredTrial.runs``): their spread is this machine's noise, so it is a tie,
    and the smaller schedule is the pick."""
    def retimed(number: int, schedule: Schedule, in_turn: tuple[float, ...],
                before: tuple[float, ...], total: int) -> MeasuredTrial:
        t = trial(number, schedule, in_turn, total)  # as ``MeasuredTrial.of`` reads it
        return replace(t, runs=(*in_turn, *before))

    plain = retimed(0, PLAIN, (1.31, 1.30, 1.32), (1.52, 1.45, 1.38), 697_000_000)
    nested = retimed(1, NESTED, (1.34, 1.335, 1.345), (1.36, 1.35, 1.37), 24_700_000)
    pick = tie_break([plain, nested], BUDGET, T)
    assert pick is not None and pick.pick is nested and pick.fastest is plain
    in_turn_only = [replace(t, runs=()) for t in (plain, nested)]
    alone = tie_break(in_turn_only, BUDGET, T)  # three runs each: the plain scan won by them
    assert alone is not None and alone.pick.schedule == PLAIN


def test_outside_the_noise_the_fastest_wins_and_among_ties_the_plain_scan_comes_last() -> None:
    steady = (1.000, 1.001, 1.002)  # a TPU's runs: 0.2% apart
    fastest = trial(0, NESTED, steady, 100)
    slower = trial(1, OTHER, (1.010, 1.011, 1.012), 10)  # 1% slower: past the noise
    pick = tie_break([fastest, slower], BUDGET, T)
    assert pick is not None and pick.pick is fastest and not pick.tied
    # one run each: no spread known, no tie
    lone = [trial(0, NESTED, (1.0,), 100), trial(1, OTHER, (1.0001,), 10)]
    assert tie_break(lone, BUDGET, T).pick.number == 0  # type: ignore[union-attr]
    # a wide spread ties no more than MAX_TIE
    wide = (1.0, 1.3, 1.5)
    far = [trial(0, NESTED, wide, 100), trial(1, OTHER, (1.3 * (1 + MAX_TIE) * 1.01,) * 3, 10)]
    assert tie_break(far, BUDGET, T).pick.number == 0  # type: ignore[union-attr]
    # tied with the plain scan, plain loses even where it is not the largest
    noisy = (1.0, 1.02, 1.04)
    tied = [trial(0, NESTED, noisy, 200), trial(1, PLAIN.with_fuse(True), noisy, 100)]
    assert tie_break(tied, BUDGET, T).pick.number == 0  # type: ignore[union-attr]
    # over the budget: no part in the tie
    over = [trial(0, NESTED, noisy, 200), trial(1, OTHER, noisy, BUDGET + 1)]
    assert tie_break(over, BUDGET, T).pick.number == 0  # type: ignore[union-attr]
    assert tie_break([], BUDGET, T) is None


def test_a_pick_won_on_memory_is_proved_with_the_executable_the_search_timed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake timer makes every schedule a tie, the larger ones slightly faster (runs 4%
    apart, steps under 2% apart): the pick is the smallest, not the fastest. The search
    keeps the pick's executable, so the proof of fit (on a stand-in device) runs it and
    compiles nothing."""
    monkeypatch.chdir(tmp_path)
    t = 16

    def fake_time(runs: ShortRuns, schedule: Schedule, sized: Compiled, *,
                  budget_bytes: int | None, time_budget: float, best: float | None
                  ) -> Measurement:
        total = sized.measurement.total_bytes
        if sized.executable is None or total is None:
            return sized.measurement
        seconds = 1e-3 * (1.0 + 20.0 / total)  # more memory, a little faster
        return replace(sized.measurement, timed_seq_len=t, step_seconds=seconds,
                       step_samples=(0.98 * seconds, seconds, 1.02 * seconds))

    compiled_for_proof: list[str] = []
    ran: list[int] = []
    compile_again = proof.compile_schedule

    def compile_schedule(problem: Any, schedule: Schedule) -> Compiled:
        compiled_for_proof.append(schedule.key())
        return compile_again(problem, schedule)

    def runs_within(once: Callable[[], None], free_bytes: int) -> tuple[bool, str]:
        once()
        ran.append(free_bytes)
        return True, ""

    monkeypatch.setattr(ShortRuns, "time", fake_time)
    monkeypatch.setattr(proof, "device_memory", SimpleNamespace(meters=lambda: [object()]))
    monkeypatch.setattr(proof, "within", SimpleNamespace(runs_within=runs_within,
                                                         free_outputs=lambda out: None))
    monkeypatch.setattr(proof, "compile_schedule", compile_schedule)
    result = tune(tiny(t), 10**9, n_trials=4, time_budget=0.02, study_name="ties",
                  explore_front=True)
    assert result.tie is not None and result.tie.tied  # won on memory, not the fastest
    assert result.best_trial is not None and result.best_trial.number == result.tie.pick.number
    assert result.proof == ProofOfFit(ProofOutcome.PASSED, result.tie.pick.number, 10**9)
    assert len(ran) == 1 and compiled_for_proof == []  # the search's executable ran
