"""Before the search stops, its leader runs in turn with its closest challengers
(``autoremat._search.retime``): single timings that put the plain scan ahead by noise do
not end the search. The step times here are made up (a fake timer, no wall clock)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import autoremat
import autoremat._search.retime as retime_module
from autoremat._measure.measure import Compiled
from autoremat._measure.measurement import OK, Measurement
from autoremat._schedules.base import Schedule
from autoremat._search.retime import (
    BAND,
    CHALLENGERS,
    PLAIN_BAND,
    ROUNDS,
    contenders,
    in_doubt,
    paired,
    to_reserve,
)
from autoremat._search.short_runs import ShortRuns
from autoremat._search.study import MeasuredTrial, load_study, measured_trials
from autoremat._search.tune import tune
from tests.tiny_problem import tiny

T = 16
PLAIN = autoremat.plain(T).key()


def trial(number: int, schedule: Schedule, seconds: float | None,
          total: int = 1000) -> MeasuredTrial:
    return MeasuredTrial(number, schedule, Measurement(schedule.key(), OK, "", total_bytes=total,
                                                       step_seconds=seconds))


def test_the_leader_is_re_timed_with_its_closest_challengers_within_the_band() -> None:
    plain = autoremat.plain(T)
    nested = [autoremat.nested([T // n, n], ["nothing_saveable", "everything_saveable"])
              for n in (2, 4, 8, 16)]
    trials = [trial(0, plain, 1.00), trial(1, nested[0], 1.01), trial(2, nested[1], 1.02),
              trial(3, nested[2], 1.03), trial(4, nested[3], 1.0 + 2 * BAND),  # out of band
              trial(5, autoremat.binomial(4), None),  # not timed (cut): no contender
              trial(6, autoremat.nested([T], "nothing_saveable"), 0.5, total=10**6)]  # over
    group = contenders(trials, 10**4, PLAIN)
    assert [t.number for t in group] == [0, 1, 2][:CHALLENGERS + 1]  # the leader first
    done = [frozenset(t.schedule.key() for t in group)]
    assert contenders(trials, 10**4, PLAIN, done) == []  # once per group
    assert contenders(trials[:1], 10**4, PLAIN) == []  # no challenger
    # the plain scan, the baseline the answer is reported against, is re-timed beside the
    # leader and its closest challengers, within the band or not (its one timing, the
    # process's first, read slow): the answer's vs plain is a ratio in turn
    for seconds in (1.03, 1.4, 1.0 + PLAIN_BAND, 5.0):
        behind = [trial(0, nested[0], 1.00), trial(1, nested[1], 1.01),
                  trial(2, nested[2], 1.02), trial(3, plain.with_fuse(True), seconds)]
        joins = seconds <= 1.0 + PLAIN_BAND  # a leader at a fifth of plain's: clearly ahead
        assert [t.number for t in contenders(behind, 10**4, PLAIN)] == [0, 1, 2, 3][:3 + joins]
    # not on its own: with no challenger in doubt, nothing is re-timed
    settled = [trial(0, nested[0], 1.00), trial(3, plain, 1.4)]
    assert contenders([replace(t, measurement=replace(
        t.measurement, timing=replace(t.measurement.timing, step_samples=(s, s * 1.001))))
        for t, s in zip(settled, (1.00, 1.4), strict=True)], 10**4, PLAIN) == []


def test_runs_in_turn_rank_a_challenger_by_its_ratio_to_the_leader_round_by_round() -> None:
    """A load that comes in one round falls on the leader's and the challenger's runs of
    that round alike: the ratio holds (0.95), where the challenger's own median would be
    its loaded run."""
    assert paired([[1.0, 1.3, 1.3], [0.95, 1.235, 1.235]]) == pytest.approx([1.3, 1.235])
    assert paired([[1.0, 1.0, 1.3], [1.3, 0.95, 0.95]])[1] < 1.0  # one loaded run: outvoted


def test_a_plain_scan_ahead_by_noise_is_re_timed_and_the_search_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake timer gives every schedule one timing in which the plain scan leads by 1%;
    run in turn (a fake too), the nested ones take 0.95 of plain's time. The search does
    not stop on the single timings: it re-times the plain scan beside its challengers, a
    nested schedule leads, the search goes on from it, and the answer is the leader of
    the runs in turn, with their figure."""
    monkeypatch.chdir(tmp_path)
    timings: list[str] = []
    turns: list[list[str]] = []
    timed_before: list[int] = []  # timings before each re-timing

    def single(schedule: Schedule) -> float:
        evaluations = schedule.cost(T).evaluations
        return 1e-3 if schedule.key() == PLAIN else 1.01e-3 + 1e-7 * evaluations

    def in_turn(key: str) -> float:
        schedule = next(s for s in known if s.key() == key)
        return 1e-3 if key == PLAIN else 0.95e-3 + 1e-7 * schedule.cost(T).evaluations

    known: list[Schedule] = []

    def fake_time(runs: ShortRuns, schedule: Schedule, sized: Compiled, *,
                  budget_bytes: int | None, time_budget: float, best: float | None
                  ) -> Measurement:
        if sized.executable is None:
            return sized.measurement
        known.append(schedule)
        timings.append(schedule.key())
        seconds = single(schedule)
        return replace(sized.measurement, timed_seq_len=T, step_seconds=seconds,
                       step_samples=(seconds,))

    def fake_interleaved(runs: Sequence[Compiled], rounds: int) -> list[list[float]]:
        keys = [c.measurement.schedule_key for c in runs]
        assert all(c.executable is not None for c in runs)  # compiled to be run
        turns.append(keys)
        timed_before.append(len(timings))
        return [[in_turn(k)] * rounds for k in keys]

    monkeypatch.setattr(ShortRuns, "time", fake_time)
    monkeypatch.setattr(retime_module, "interleaved", fake_interleaved)
    result = tune(tiny(T), 10**9, time_budget=0.02, study_name="noise", time_limit=None)
    assert turns and turns[0][0] == PLAIN  # it was about to stop with the plain scan ahead
    assert len(turns[0]) == 1 + CHALLENGERS
    study = load_study("noise")
    trials = {t.schedule.key(): t for t in measured_trials(study)}
    assert len(timings) > timed_before[0]  # the search went on after the re-timing
    assert result.best_trial is not None and result.best_trial.schedule.key() != PLAIN
    best = result.best_trial
    assert best.measurement.step_seconds == pytest.approx(in_turn(best.schedule.key()))
    assert trials[PLAIN].measurement.step_seconds == pytest.approx(1e-3)
    # a re-timed trial's runs: those in turn, then its own before (the tie rule's noise)
    retimed = trials[turns[0][1]]
    assert retimed.measurement.step_samples == pytest.approx((in_turn(turns[0][1]),) * ROUNDS)
    assert retimed.all_runs == pytest.approx((in_turn(turns[0][1]),) * ROUNDS
                                             + (single(retimed.schedule),))
    assert f"retimed:{trials[PLAIN].number}" in study.user_attrs
    single_trials = [t for t in measured_trials(study)
                     if f"retimed:{t.number}" not in study.user_attrs]
    assert all(t.measurement.step_seconds == pytest.approx(single(t.schedule))
               for t in single_trials if t.measurement.step_seconds is not None)
    summary = {k: t.measurement.step_seconds for k, t in trials.items()}
    assert min(v for v in summary.values() if v is not None) == best.measurement.step_seconds


def test_runs_that_agree_or_do_not_overlap_settle_the_order_without_re_timing() -> None:
    """Where the noise asks for it: a TPU's runs (within ``STEADY``) or runs that do not
    overlap the leader's rank the two already; one run each, or noisy runs that overlap,
    do not."""
    plain, nested = autoremat.plain(T), autoremat.nested([4, 4], "nothing_saveable")

    def timed(number: int, schedule: Schedule, samples: tuple[float, ...]) -> MeasuredTrial:
        return MeasuredTrial(number, schedule, Measurement(
            schedule.key(), OK, "", total_bytes=1000, step_seconds=sorted(samples)[1],
            step_samples=samples))

    steady = [timed(0, plain, (0.991, 1.000, 1.009)), timed(1, nested, (0.995, 1.003, 1.01))]
    assert not in_doubt(*steady) and contenders(steady, 10**4, PLAIN) == []  # each +-1%
    noisy = [timed(0, plain, (1.00, 1.03, 1.06)), timed(1, nested, (1.01, 1.04, 1.07))]
    assert in_doubt(*noisy) and [t.number for t in contenders(noisy, 10**4, PLAIN)] == [0, 1]
    apart = [timed(0, plain, (1.00, 1.02, 1.04)), timed(1, nested, (1.05, 1.06, 1.08))]
    assert not in_doubt(*apart)  # noisy, but every run of one is slower than the other's
    assert in_doubt(trial(0, plain, 1.0), trial(1, nested, 1.01))  # no spread known


def test_the_planners_clock_keeps_the_re_timing_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The time the planner may spend is the time left less what re-timing will take."""
    import autoremat._search.planning.clock as clock_module
    from autoremat._search.planning.clock import Clock

    monkeypatch.setattr(clock_module, "time", SimpleNamespace(monotonic=lambda: 1000.0))
    clock = Clock(deadline=1100.0)
    assert clock.time_left() == 100.0
    clock.reserve = 30.0
    assert clock.time_left() == 70.0


def test_time_is_kept_back_for_a_noisy_leader_before_a_challenger_comes_close() -> None:
    """``to_reserve``: the group in doubt where there is one; else a noisy leader and one
    challenger like it; nothing for a leader whose runs agree, or one timed by one run."""
    plain, nested = autoremat.plain(T), autoremat.nested([4, 4], "nothing_saveable")

    def timed(number: int, schedule: Schedule, samples: tuple[float, ...]) -> MeasuredTrial:
        return MeasuredTrial(number, schedule, Measurement(
            schedule.key(), OK, "", total_bytes=1000, step_seconds=sorted(samples)[1],
            step_samples=samples))

    noisy = timed(0, plain, (1.00, 1.05, 1.10))
    far = timed(1, nested, (1.5, 1.55, 1.6))  # out of the band: no challenger
    assert to_reserve([noisy, far], 10**4, PLAIN) == [noisy, noisy]
    assert to_reserve([noisy, far], 10**4, PLAIN, [frozenset({PLAIN})]) == []  # re-timed
    assert to_reserve([noisy], 10**4, PLAIN) == []  # no other timed: no field yet
    close = timed(1, nested, (1.02, 1.06, 1.09))
    assert to_reserve([noisy, close], 10**4, PLAIN) == [noisy, close]
    assert to_reserve([timed(0, plain, (0.995, 1.0, 1.004)), far], 10**4, PLAIN) == []
    assert to_reserve([trial(0, plain, 1.0), far], 10**4, PLAIN) == []  # one run: a long step
