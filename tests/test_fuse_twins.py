"""An unfused candidate's fused twin (``autoremat._search.fuse_twins``): once one schedule
was measured both ways, an unfused one whose fused twin plus that cost is over the budget
is not compiled."""

from __future__ import annotations

from autoremat._measure.measurement import OK, Measurement
from autoremat._search.planner import Planner
from autoremat._search.short_runs import ShortRuns
from autoremat._search.space import seeds
from tests.tiny_problem import tiny

GB = 10**9


def _timed(planner: Planner, schedule: object, runtime: int) -> None:
    key = schedule.key()  # type: ignore[attr-defined]
    planner.record(schedule, Measurement(key, OK, "", total_bytes=runtime,  # type: ignore[arg-type]
                                         runtime_peak_bytes=runtime, step_seconds=0.4))


def test_an_unfused_schedule_is_not_compiled_where_its_fused_twin_is_over_with_unfusing() -> None:
    """Big model on a TPU v5e, 12 GB: 100x100 took 1.1 GB fused and 11.4 GB unfused
    (unfusing: 10.3 GB, its stack and cotangent); 5000x2's fused twin took 1.9 GB, so
    unfused it needs about 12.2 GB: not compiled. With a fused twin of 1.6 GB, or no pair
    measured, or the twin not known, it goes on as any other candidate."""
    problem = tiny(64)
    planner = Planner(problem, 12 * GB, "tpu", ShortRuns(problem))
    pair, other, small = [s for s, _ in seeds(64)][:3]
    unfused = [planner.candidate(s.with_fuse(False)) for s in (other, small)]
    assert not any(planner.unfused_over(c) for c in unfused)  # no pair measured yet
    _timed(planner, pair.with_fuse(True), int(1.1 * GB))
    _timed(planner, pair.with_fuse(False), int(11.4 * GB))
    assert planner.unfusing() == int(11.4 * GB) - int(1.1 * GB)
    assert not any(planner.unfused_over(c) for c in unfused)  # their fused twins: unknown
    _timed(planner, other.with_fuse(True), int(1.9 * GB))
    _timed(planner, small.with_fuse(True), int(1.6 * GB))
    assert planner.unfused_over(unfused[0]) and planner._surely_over(unfused[0])
    assert not planner.unfused_over(unfused[1])  # 11.9 GB: a compile decides
    fused = planner.candidate(other.with_fuse(True))
    assert not planner.unfused_over(fused)  # fused: nothing to unfuse
