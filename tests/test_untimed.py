"""What keeps a sized candidate untimed (``autoremat._search.planning.untimed``): pure rules on the
figures they name, checked without a planner."""

from __future__ import annotations

from autoremat._measure.measure import Compiled
from autoremat._measure.measurement import OK, Measurement
from autoremat._search.planning.candidates import Verdict
from autoremat._search.planning.untimed import (
    Reach,
    dominated,
    guessed_over,
    over_at_runtime,
    overstated_after,
    untimed,
)

GB = 10**9


def sized(total: int, executable: object = object()) -> Compiled:
    return Compiled(Measurement("k", OK, "", total_bytes=total), executable=executable)


def test_a_run_decides_the_fit_where_sizes_overstate_runs() -> None:
    overstated = overstated_after(None, Measurement("a", OK, "", total_bytes=3 * GB))
    assert overstated is None  # no run's peak: nothing known
    overstated = overstated_after(overstated, Measurement(
        "b", OK, "", total_bytes=17_540_000_000, runtime_peak_bytes=12_200_000_000))
    assert overstated == 5_340_000_000
    tpu = Reach(12 * GB, "tpu", overstated, ())
    assert over_at_runtime(21_470_000_000, tpu) and not over_at_runtime(17 * GB, tpu)
    assert not over_at_runtime(21_470_000_000, Reach(12 * GB, "cpu", overstated, ()))
    assert guessed_over(18 * GB, tpu) and not guessed_over(17 * GB, tpu)
    assert guessed_over(13 * GB, Reach(12 * GB, "cpu", overstated, ()))  # no slack there


def test_untimed_names_why_and_dominated_compares_memory_and_time() -> None:
    timed = ((100, 1.0),)
    reach = Reach(1000, "cpu", None, timed)
    assert dominated(200, 1.5, timed) and not dominated(50, 1.5, timed)
    assert not dominated(200, 0.9, timed) and not dominated(None, 1.5, timed)
    assert untimed(sized(200, None), 1.5, reach) is Verdict.NO_EXECUTABLE
    assert untimed(sized(200), 1.5, reach) is Verdict.DOMINATED
    assert untimed(sized(200), 1.5, reach, dominated_too=True) is None
    assert untimed(sized(50), 1.5, reach) is None
    over = Reach(1000, "tpu", 0, timed)
    assert untimed(sized(2000), 0.5, over) is Verdict.OVER_AT_RUNTIME
