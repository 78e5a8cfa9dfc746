"""The planner's judge, alone: the stop rule, the rival, the ranking."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from autoremat._measure.measurement import OK, Measurement
from autoremat._search.planning.candidates import Candidate, Verdict
from autoremat._search.planning.judge import MAX_STOP, STOP_RATIO, Judge, Round
from autoremat._search.planning.memory_model import MemoryModel
from autoremat._search.planning.pool import Pool
from autoremat._search.planning.predict import TimeModel
from autoremat._search.planning.screening import Action, Decision, next_action
from autoremat._search.planning.standings import Standings


def judge(best_seconds: float | None = None, *, points: int = 2, error: float = 0.0,
          explore_front: bool = False, presets: Any = None) -> Judge:
    standings = Standings(budget_bytes=100)
    if best_seconds is not None:
        standings.record("best", Measurement("best", OK, "", total_bytes=50,
                                             step_seconds=best_seconds))
    model = TimeModel("cpu")
    model.points, model.error = points, error
    return Judge("cpu", standings, model, MemoryModel(), explore_front, presets)


def test_the_stop_ratio_widens_with_the_models_error_within_its_bounds() -> None:
    assert judge(error=0.0).stop_ratio() == STOP_RATIO
    assert judge(error=0.05).stop_ratio() == STOP_RATIO  # 1 + 2 x 0.05: under the floor
    assert judge(error=0.2).stop_ratio() == pytest.approx(1.4)  # 1 + 2 x 0.2
    assert judge(error=1.0).stop_ratio() == MAX_STOP


def test_past_the_stop_only_once_calibrated_and_never_while_exploring() -> None:
    beyond = 1.0 * STOP_RATIO * 1.01
    assert judge(1.0).past_stop(beyond)
    assert not judge(1.0).past_stop(0.99 * STOP_RATIO)
    assert not judge(1.0).past_stop(beyond, explore=True)
    assert not judge(1.0, points=1).past_stop(beyond)  # one timing: not calibrated
    assert not judge(None).past_stop(beyond)  # nothing fits yet
    assert judge(1.0).stop_seconds() == STOP_RATIO and judge(None).stop_seconds() is None


def test_the_rival_is_the_best_unless_the_whole_front_is_wanted() -> None:
    assert judge(0.5).rival() == 0.5
    assert judge(0.5, explore_front=True).rival() is None
    assert judge(None).rival() is None


def test_presets_rank_first_in_their_order_then_the_fastest_predicted() -> None:
    cands: list[Candidate] = list(Pool(1000, "cpu").values())[:5]
    order = {cands[3].schedule.key(): 0, cands[4].schedule.key(): 1}  # two presets
    presets = SimpleNamespace(priority=lambda c: order.get(c.schedule.key()),
                              over=lambda s: False)
    j = judge(1.0, presets=presets)
    predicted = {id(c): p for c, p in zip(cands, [0.3, 0.1, 0.2, 0.9, 0.05], strict=True)}
    j.predict = lambda c: predicted[id(c)]  # type: ignore[method-assign]
    ranked = [c for _, c in j.rank(cands)]
    assert ranked == [cands[3], cands[4], cands[1], cands[2], cands[0]]
    j = judge(1.0)  # no presets
    j.predict = lambda c: predicted[id(c)]  # type: ignore[method-assign]
    assert [c for _, c in j.rank(cands)] == [cands[4], cands[1], cands[2], cands[0], cands[3]]
    cands[0].compiled = SimpleNamespace()  # type: ignore[assignment]
    assert j.rank(cands, compiled_first=True)[0][1] is cands[0]


@dataclass(frozen=True)
class Given:
    """A candidate's facts, as ``next_action`` reads them (``screening.Facts``), given."""

    preset: bool = False
    preset_over: bool = False
    compiled: bool = False
    failed: bool = False
    executable: bool = True
    early: bool = False
    past_stop: bool = False
    past_own_stop: bool = False
    patience_spent: bool = False
    twin_found: bool = True
    surely_over: bool = False
    dominated: bool = False
    compile_fits: bool = True
    any_compile_fits: bool = True
    untimed: Verdict | None = None
    timing_fits: bool = True


def test_one_function_orders_the_screening_rules() -> None:
    """Every rule's outcome, from facts given (no model, no clock): the one order the
    planner's ranking, the compiles ahead and the device's choice meanwhile all ask."""
    act = lambda **facts: next_action(Given(**facts))  # noqa: E731
    # a preset: compiled, then timed, whatever is predicted
    assert act(preset=True, past_stop=True) == Decision(Action.COMPILE)
    assert act(preset=True, preset_over=True) == Decision(Action.SKIP, Verdict.SURELY_OVER)
    assert act(preset=True, compile_fits=False) == Decision(Action.SKIP)
    assert act(preset=True, compiled=True, past_stop=True) == Decision(Action.TIME)
    assert act(preset=True, compiled=True, failed=True) == Decision(Action.FAIL)
    assert act(preset=True, compiled=True, executable=False) == Decision(
        Action.SKIP, Verdict.NO_EXECUTABLE)
    # any other: the stop first, then its own stop
    assert act(past_stop=True, surely_over=True) == Decision(Action.STOP)
    assert act(past_own_stop=True) == Decision(Action.SKIP)
    # an early one (an unroll of the leader), ranked out of predicted order: skipped, not
    # the end of the round
    assert act(past_stop=True, early=True) == Decision(Action.SKIP)
    assert act(patience_spent=True, early=True) == Decision(Action.SKIP)
    # not compiled yet
    assert act() == Decision(Action.COMPILE)
    assert act(patience_spent=True, compile_fits=False) == Decision(Action.SKIP)
    assert act(twin_found=False) == Decision(Action.SKIP)
    assert act(surely_over=True) == Decision(Action.SKIP, Verdict.SURELY_OVER)
    assert act(dominated=True, compile_fits=False) == Decision(Action.SKIP)
    assert act(compile_fits=False, any_compile_fits=False) == Decision(Action.STOP)
    # its own compile (unrolled) does not fit where a cheaper one would: not started
    assert act(compile_fits=False) == Decision(Action.SKIP, Verdict.TOO_LATE)
    # compiled
    assert act(compiled=True) == Decision(Action.TIME)
    assert act(compiled=True, failed=True, untimed=Verdict.DOMINATED) == Decision(Action.FAIL)
    assert act(compiled=True, untimed=Verdict.DOMINATED, timing_fits=False) == Decision(
        Action.SKIP, Verdict.DOMINATED)
    assert act(compiled=True, timing_fits=False) == Decision(Action.STOP)


def test_the_judges_facts_are_read_only_where_a_rule_asks() -> None:
    """A candidate past the stop is never offered to its twin (which proposes candidates:
    a side effect), and one in the patience's way neither."""
    asked: list[str] = []

    def twin(c: Candidate) -> Candidate | None:
        asked.append(c.schedule.key())
        return None

    j = judge(1.0, points=3)
    cand = Pool(16, "cpu", seed=0).open()[0]
    past = j.facts(cand, 10.0, Round(twin=twin))
    assert next_action(past).action is Action.STOP and asked == []
    spent = j.facts(cand, 1.0, Round(twin=twin, own_left=0))
    assert next_action(spent).action is Action.SKIP and asked == []
    found = j.facts(cand, 1.0, Round(twin=twin))
    assert next_action(found) == Decision(Action.SKIP) and asked == [cand.schedule.key()]
    assert found.target is cand
