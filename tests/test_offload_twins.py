"""An offloading candidate waits for its twin (the same schedule keeping on the device what
it offloads) and is dropped where the twin fits; it goes on where the twin does not.

No TPU here: the platform is the string ``"tpu"`` (its offload placements) on this CPU;
the twin's figures are recorded measurements, so nothing is compiled.
"""

from __future__ import annotations

import pytest

from autoremat._measure.measurement import OK, OVER_BUDGET, Measurement
from autoremat._measure.timing import Compiled
from autoremat._search.planning.candidates import Candidate, Verdict
from autoremat._search.planning.offload_twins import ON_DEVICE, OffloadTwins, on_device
from autoremat._search.planning.planner import Planner
from autoremat._search.short_runs import ShortRuns
from tests.tiny_problem import tiny

BUDGET = 10**6


def _planner(explore_front: bool = False) -> Planner:
    problem = tiny(64)
    return Planner(problem, BUDGET, "tpu", ShortRuns(problem), explore_front=explore_front)


def _offloading(planner: Planner, label: str) -> Candidate:
    return next(c for c in planner.pool.values() if label in c.params.values())


def _twins(planner: Planner) -> OffloadTwins:
    assert planner.twins is not None
    return planner.twins


def _first(planner: Planner, cand: Candidate) -> Candidate | None:
    """What the planner screens in ``cand``'s place, asked as its ranking asks (the copies'
    limit: ``stop_ratio`` times the best step that fits)."""
    best = planner.standings.best
    limit = None if best is None else planner.judge.stop_ratio() * best[2]
    return _twins(planner).first(cand, planner.pool.taken, limit)


def test_the_twin_keeps_on_the_device_what_is_offloaded() -> None:
    params = {"kind": "nested", "depth": 2, "d2_n0": 8, "d2_p0": "offload_carries",
              "d2_p1": "offload_dots", "d2_unroll": 2}
    assert on_device(params) == {**params, "d2_p0": "nothing", "d2_p1": "dots_no_batch"}
    assert on_device({"kind": "nested", "depth": 1, "d1_policy": "offload_step"}) == {
        "kind": "nested", "depth": 1, "d1_policy": "dots_no_batch"}
    assert on_device({**params, "d2_p0": "nothing", "d2_p1": "everything"}) is None
    assert set(ON_DEVICE) == {"offload_step", "offload_dots", "offload_carries"}


@pytest.mark.parametrize("label", ["offload_dots", "offload_carries", "offload_step"])
def test_an_offload_waits_for_its_twin_and_is_dropped_where_the_twin_fits(label: str) -> None:
    planner = _planner()
    cand = _offloading(planner, label)
    twin = _twins(planner).twin(cand)
    assert twin is not None and twin.params == on_device(cand.params)
    assert twin.schedule.key() in planner.pool
    assert (twin.schedule.lengths, twin.schedule.unroll) == (  # type: ignore[attr-defined]
        cand.schedule.lengths, cand.schedule.unroll)  # type: ignore[attr-defined]
    assert _first(planner, cand) is twin  # its fit unknown: the twin is screened first
    assert cand.compiled is None and cand.verdict is Verdict.UNDECIDED
    key = twin.schedule.key()
    planner.record(twin.schedule, Measurement(key, OK, "", total_bytes=BUDGET // 6,
                                              step_seconds=0.1))
    assert _first(planner, cand) is None and cand.verdict is Verdict.DOMINATED
    assert cand not in planner.ahead.upcoming(len(planner.pool))  # never compiled ahead either


def test_an_offload_goes_on_where_its_twin_is_over_the_budget() -> None:
    planner = _planner()
    cand = _offloading(planner, "offload_dots")
    twin = _twins(planner).twin(cand)
    assert twin is not None
    planner.record(twin.schedule, Measurement(twin.schedule.key(), OVER_BUDGET, "over budget",
                                              total_bytes=2 * BUDGET))
    assert _twins(planner).fits(twin, planner.pool.taken) is False
    assert _first(planner, cand) is cand and cand.verdict is Verdict.UNDECIDED


def test_the_whole_front_tries_offloads_in_their_own_right() -> None:
    planner = _planner(explore_front=True)
    cand = _offloading(planner, "offload_dots")
    assert planner.twins is None  # no twin asked first: the offload is a point of the front
    assert cand in planner.ahead.upcoming(len(planner.pool))  # compiled as any other


def test_a_twin_the_memory_model_puts_far_under_the_budget_is_not_compiled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the memory model is sure the twin fits (``MemoryModel.far_under``), the offload
    is dominated at once: no compile of the twin to find out."""
    planner = _planner()
    cand = _offloading(planner, "offload_dots")
    seen: list[int] = []

    def far_under(structure: object, budget: int) -> bool:
        seen.append(budget)
        return True

    monkeypatch.setattr(planner.judge.memory_model, "far_under", far_under)
    assert _first(planner, cand) is None and cand.verdict is Verdict.DOMINATED
    twin = _twins(planner).twin(cand)
    assert twin is not None and twin.compiled is None and seen == [BUDGET]


@pytest.mark.parametrize("bandwidth, dropped", [(1e6, True), (1e12, False)])
def test_an_offload_whose_copies_alone_are_slower_than_the_best_is_dropped(
        monkeypatch: pytest.MonkeyPatch, bandwidth: float, dropped: bool) -> None:
    """Its twin over the budget, an offload still moves at least what the twin keeps more:
    over a host link of ``bandwidth`` bytes/s, 1.5 MB take 1.5 s (dropped: the best takes
    0.1 s) or 1.5 us (it goes on)."""
    import autoremat._search.planning.offload_twins as twins_module

    monkeypatch.setattr(twins_module, "host_bandwidth", lambda: bandwidth)
    planner = _planner()
    cand = _offloading(planner, "offload_dots")
    twin = _twins(planner).twin(cand)
    assert twin is not None
    twin.compiled = Compiled(Measurement(twin.schedule.key(), OVER_BUDGET, "over budget",
                                         total_bytes=2 * BUDGET))  # sized: over
    best = next(c for c in planner.pool.values() if c.params.get("depth") == 1
                and c.params.get("d1_policy") == "nothing")
    planner.record(best.schedule, Measurement(best.schedule.key(), OK, "",
                                              total_bytes=BUDGET // 2, step_seconds=0.1))
    monkeypatch.setattr(planner.judge.memory_model, "predict", lambda s: BUDGET // 2)
    assert _first(planner, cand) is (None if dropped else cand)
    assert (cand.verdict is Verdict.DOMINATED) is dropped


@pytest.mark.parametrize(("label", "dropped"), [("offload_dots", True),
                                                ("offload_carries", False)])
def test_an_inner_offload_of_dots_moves_every_steps_dots(
        monkeypatch: pytest.MonkeyPatch, label: str, dropped: bool) -> None:
    """Its twin keeps hardly more at the peak (a chunk's dots), but an offload of dots moves
    every step's, each step: 64 steps of 10 KB over 1 MB/s take 0.64 s, the best 0.1 s.
    An offload of carries moves what the twin keeps more: nothing here."""
    import autoremat._search.planning.offload_twins as twins_module

    monkeypatch.setattr(twins_module, "host_bandwidth", lambda: 1e6)
    planner = _planner()
    cand = _offloading(planner, label)
    twin = _twins(planner).twin(cand)
    assert twin is not None
    twin.compiled = Compiled(Measurement(twin.schedule.key(), OVER_BUDGET, "over budget",
                                         total_bytes=2 * BUDGET))
    best = next(c for c in planner.pool.values() if c.params.get("depth") == 1
                and c.params.get("d1_policy") == "nothing")
    planner.record(best.schedule, Measurement(best.schedule.key(), OK, "",
                                              total_bytes=BUDGET // 2, step_seconds=0.1))
    monkeypatch.setattr(planner.judge.memory_model, "predict", lambda s: 2 * BUDGET)  # as the twin
    monkeypatch.setattr(planner.judge.memory_model, "step_dots_bytes", lambda: 1e4)
    assert _first(planner, cand) is (None if dropped else cand)
