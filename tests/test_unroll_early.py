"""Unroll where it pays, early: the unrolls of the leader and its closest rivals are
ranked before the rest (``Planner.propose_unrolls``, ``Judge.early``), an unrolled
compile's cost is its own (``Clock.compile_cost_of``), and one whose compile would end
past the limit is not started, and the result says so (``TooLate``). Made-up figures
and a fixed time left: nothing here reads the wall clock."""

from __future__ import annotations

from typing import Any

import pytest

from autoremat._cli.printing import too_late_lines
from autoremat._measure.measure import Compiled
from autoremat._measure.measurement import OK, Measurement
from autoremat._search import space
from autoremat._search.planning.candidates import TooLate, Verdict
from autoremat._search.planning.clock import UNROLL_SLOPE, Clock
from autoremat._search.planning.planner import EARLY, Planner
from autoremat._search.planning.pool import Pool
from autoremat._search.short_runs import ShortRuns
from autoremat._search.study import TuneResult
from tests.tiny_problem import tiny

T = 64


def test_an_unrolled_compile_costs_more_by_its_unroll_learned_from_those_measured() -> None:
    clock = Clock()
    assert clock.compile_cost_of(8) == 0.0  # nothing measured
    clock.add_compile(2.0)
    clock.add_compile(2.0)
    assert clock.compile_cost_of(1) == clock.compile_cost() == 2.0
    assert clock.compile_cost_of(8) == pytest.approx(2.0 * (1 + UNROLL_SLOPE * 7))  # the prior
    clock.add_compile(8.0, unroll=4)  # 4x at unroll 4: a slope of 1 per unrolled step
    assert clock.compile_cost_of(4) == 8.0  # measured at that unroll
    assert clock.compile_cost_of(8) == pytest.approx(2.0 * 8)


def test_compiles_beside_each_other_cost_their_seconds_over_how_many_ran_at_once() -> None:
    clock = Clock()
    for end in (10.0, 20.0, 30.0):  # one after another: each costs its seconds
        clock.add_compile(6.0, ended=end)
    assert clock.overlap() == 1.0 and clock.compile_cost() == 6.0
    beside = Clock()
    for _ in range(3):  # three at once, 0-6 s: each 6 s, three done in 6 s of the search
        beside.add_compile(6.0, ended=6.0)
    beside.add_compile(6.0, unroll=4, ended=12.0)  # then one alone
    assert beside.overlap() == pytest.approx(24.0 / 12.0)
    assert beside.compile_cost() == pytest.approx(6.0 / 2.0)
    assert beside.compile_cost_of(4) == pytest.approx(6.0 / 2.0)  # its own seconds, shared too
    assert Clock(compile_seconds=[4.0], unrolls=[1]).overlap() == 1.0  # no span known


def test_the_pool_offers_a_schedule_at_each_other_unroll() -> None:
    pool = Pool(T, "cpu", seed=0)
    seed = next(c for c in pool.values() if any(k.endswith("_unroll") for k in c.params)
                and c.schedule.unroll == 1 and c.schedule.kind == "nested"
                and c.schedule.levels[-1].length >= 8)  # type: ignore[attr-defined]
    variants = pool.unrolled(seed.schedule.key())
    assert sorted(c.schedule.unroll for c in variants) == [2, 4, 8]
    assert all(c.schedule.with_options().key() != seed.schedule.key() for c in variants)
    assert all(c.schedule.key() in pool for c in variants)


def planner_with_a_leader() -> tuple[Planner, list[Any]]:
    problem = tiny(T)
    planner = Planner(problem, 10**9, "cpu", ShortRuns(problem))
    seeds = [s for s, _ in space.seeds(T)]
    nested = [s for s in seeds if s.kind == "nested" and s.unroll == 1][:2]
    for i, schedule in enumerate(nested):  # two timed: the leader is the first
        planner.record(schedule, Measurement(schedule.key(), OK, "", total_bytes=10**6,
                                             step_seconds=0.010 + i * 0.0005))
    return planner, nested


def test_the_leaders_unrolls_are_ranked_first_the_fastest_predicted_first() -> None:
    planner, (leader, rival) = planner_with_a_leader()
    early = planner.judge.early
    assert 0 < len(early) <= EARLY
    ranked = [c for _, c in planner.judge.rank(planner.pool.open())]
    assert [c.schedule.key() for c in ranked[:len(early)]] == sorted(early, key=early.get)
    for cand in ranked[:len(early)]:
        assert cand.schedule.unroll > 1  # an unroll of the leader or its rival
        levels = cand.schedule.levels  # type: ignore[attr-defined]
        assert any(tuple(lv.length for lv in levels) == tuple(
            lv.length for lv in s.levels) for s in (leader, rival))  # type: ignore[attr-defined]


def test_an_unrolled_compile_that_would_end_past_the_limit_is_not_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """6 s left, compiles of 4 s at unroll 1 (so about 4 x (1 + 0.8 x (u - 1)) unrolled):
    the early unrolls are set aside as too late, and said so; an unroll-1 candidate is
    compiled instead."""
    planner, _ = planner_with_a_leader()
    planner.clock.add_compile(4.0)
    screened: list[Any] = []

    def screen(cand: Any) -> None:  # sized, as a compile would, without compiling
        screened.append(cand)
        cand.compiled = Compiled(Measurement(cand.schedule.key(), OK, "", total_bytes=10**6))

    monkeypatch.setattr(planner, "screen", screen)
    monkeypatch.setattr(planner.judge, "dominated", lambda cand, predicted: False)
    early = dict(planner.judge.early)
    assert planner.choose(6.0) == "again"
    assert screened and screened[0].schedule.unroll == 1
    late = {t.schedule for t in planner.too_late}
    assert late and all(planner.pool[k].verdict is Verdict.TOO_LATE for k in early
                        if planner.pool[k].schedule.describe() in late)
    assert all(t.seconds > 6.0 for t in planner.too_late)
    result = TuneResult("s", "sqlite://", 1, None, None, None, None, 0, 0,
                        too_late=(TooLate("12 dots unroll=8", 50.0),))
    assert "12 dots unroll=8 (~50 s)" in " ".join(too_late_lines(result))
