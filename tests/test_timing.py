"""Timing a compiled step (``autoremat._measure.timing``): runs until their median is
known. The runs here are played by a stand-in of ``_Timing.once`` (seconds given, no
clock), so nothing depends on this machine's speed."""

from __future__ import annotations

import numpy as np
import pytest

from autoremat._measure import timing
from autoremat._measure.measure import compile_step


@pytest.mark.parametrize(("warmup", "times", "runs"), [
    (0.13, [0.100, 0.1004, 0.0998, 0.1001], 3),  # steady (a TPU's runs): three say it
    (0.13, [0.100, 0.150, 0.1004, 0.100, 0.100], 4),  # one outlier among four
    (0.13, [0.100, 0.150, 0.120] + [0.100] * 20, 6),  # two, then settled: the last three
    (0.13, [0.100, 0.150, 0.120, 0.100, 0.130] + [0.100, 0.140] * 20, 20),  # never settles
    (0.13, [0.1, 0.2] * 20, 20),  # never steady: max_repeats
    (0.1002, [0.100, 0.1004, 0.0998], 2),  # the warm-up as steady: it is the third
])
def test_timing_stops_once_the_runs_are_steady(warmup: float, times: list[float], runs: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """After the fewest runs, timing stops as soon as three runs, and all but at most one,
    lie within ``STEADY`` of their median, or (from the fifth) the last three do; runs
    that disagree go on to ``time_budget``'s worth (``max_repeats``). A warm-up within 1%
    of the first two runs is one of three."""
    compiled = compile_step(lambda x: x * 2.0, (np.ones(3, np.float32),))
    runs_left = iter([warmup, *times])  # the warm-up, then each timed run's seconds
    monkeypatch.setattr(timing._Timing, "once",
                        lambda self: (next(runs_left), np.ones(3, np.float32)))
    m = timing.time_compiled(compiled, time_budget=100.0)
    counted = ([warmup] if runs == 2 else []) + times[:runs]
    assert m.step_samples == pytest.approx(counted)
    assert timing.steady(counted) is (runs < 20)


@pytest.mark.parametrize(("best", "runs"), [
    (0.100, 2),  # two runs over 1.02x the best: not the pick
    (0.102, 4),  # within 1.02x of it: steady decides
    (0.1180, 2),  # two runs under 0.98x the best: the new best
    (0.1170, 4),  # the second within 0.98x of it: steady decides
    (None, 4),  # nothing to beat: steady decides
])
def test_timing_stops_behind_or_ahead_of_the_best_after_two_runs(
        best: float | None, runs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``best``: once ``RANKED_AFTER`` (two) runs all take longer than ``1 + BEATEN`` times
    the best step, or all less than ``1 - BEATEN`` times it, timing stops with their median
    (not cut: the time model reads it); a first run under ``CUT_RATIO`` times the best does
    not cut it."""
    times = [0.1030, 0.1150, 0.1030, 0.1031, *[0.1] * 20]
    compiled = compile_step(lambda x: x * 2.0, (np.ones(3, np.float32),))
    runs_left = iter([0.12, *times])  # the warm-up (under 1.3 x 0.1), then the runs
    monkeypatch.setattr(timing._Timing, "once",
                        lambda self: (next(runs_left), np.ones(3, np.float32)))
    m = timing.time_compiled(compiled, time_budget=100.0, best=best)
    assert m.cut_seconds is None and m.step_samples == pytest.approx(times[:runs])
    assert timing.CUT_RATIO * 0.1 > 0.12 and timing.BEATEN == 0.02 and timing.RANKED_AFTER == 2
