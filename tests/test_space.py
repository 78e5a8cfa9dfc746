"""The search space: every schedule it proposes is valid and covers T."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoremat._schedules.base import SHORT_SCAN, Schedule
from autoremat._schedules.binomial import BinomialSchedule, snapshot_range
from autoremat._schedules.groups import GroupsSchedule
from autoremat._schedules.lengths import snap
from autoremat._schedules.nested import NestedSchedule
from autoremat._schedules.nested_space import (
    OFFLOAD_POLICIES,
    POLICIES,
    UNROLLS,
    depths,
    policy_choices,
    unrolled_inner,
)
from autoremat._schedules.policy import NO_REMAT
from autoremat._search.space import neighbours, propose, seeds
from autoremat.bounds import repetitions


def _check(schedule: Schedule, seq_len: int, platform: str = "cpu") -> None:
    if isinstance(schedule, BinomialSchedule):
        low, high = snapshot_range(seq_len)
        assert low <= schedule.snapshots <= high
        assert repetitions(seq_len, schedule.snapshots) <= 6 or schedule.snapshots == high
        return
    if isinstance(schedule, GroupsSchedule):
        assert seq_len <= SHORT_SCAN and schedule.tuned_length == seq_len
        assert all(g.policy.name in {p.name for p in policy_choices(platform).values()} | {NO_REMAT}
                   for g in schedule.groups)
        return
    assert isinstance(schedule, NestedSchedule)
    allowed = {p.name for p in policy_choices(platform).values()}
    assert 1 <= schedule.depth <= 4
    assert schedule.unroll in UNROLLS or schedule.unroll == schedule.lengths[-1]
    assert schedule.unroll <= schedule.lengths[-1]
    if schedule.depth == 1:
        assert schedule.lengths == (seq_len,)
        assert schedule.levels[0].policy.name in allowed | {NO_REMAT}
        return
    inner = math.prod(schedule.lengths[1:])
    assert all(n >= 2 for n in schedule.lengths[1:])
    assert inner <= seq_len
    assert schedule.tuned_length >= seq_len  # the outer count covers T
    assert schedule.lengths[0] == math.ceil(seq_len / inner)
    assert all(lv.policy.name in allowed for lv in schedule.levels)


@pytest.mark.parametrize("seq_len", [16, 64, 97, 10_000, 100_000])
def test_random_proposals_give_valid_schedules(seq_len: int) -> None:
    rng = random.Random(seq_len)
    seen = set()
    for _ in range(150):
        schedule = propose({}, seq_len, "cpu", rng)[0]
        _check(schedule, seq_len)
        seen.add(schedule.depth if isinstance(schedule, NestedSchedule) else schedule.kind)
    assert seen == {*depths(seq_len), "binomial", *(["groups"] if seq_len <= SHORT_SCAN else [])}


def test_seed_candidates_come_first_and_are_the_obvious_ones() -> None:
    described = [s.describe() for s, _ in seeds(10_000)]
    assert described == [
        "10000 no-remat unroll=1",
        "10000 nothing unroll=1",
        "100x100 nothing/everything unroll=1",
        "25x20x20 nothing/nothing/everything unroll=1",
        "100x10x10 nothing/dots/everything unroll=1",  # short chunks (bench_tune)
        "binomial s=38 unroll=1",  # C(38 + 3, 3) >= 10^4: three repetitions
    ]
    deep = seeds(100_000)[3][0]
    assert isinstance(deep, NestedSchedule) and deep.lengths == (50, 40, 50)


def test_off_a_cpu_short_unrolled_chunks_are_seeded_third() -> None:
    for platform in ("tpu", "gpu"):
        described = [s.describe() for s, _ in seeds(10_000, platform)]
        assert described[:4] == ["10000 no-remat unroll=1", "10000 nothing unroll=1",
                                 "2500x4 nothing/everything unroll=4",  # UNROLLED_CHUNK
                                 "100x100 nothing/everything unroll=1"]
        assert not any("dots" in d for d in described)  # the CPU's short-chunk seed
    assert [s.describe() for s, _ in seeds(7, "tpu")] == [
        "7 no-remat unroll=1", "7 nothing unroll=1", "3x3 nothing/everything unroll=1"]


@given(st.integers(min_value=1, max_value=200_000))
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
def test_seed_candidates_cover_any_length(seq_len: int) -> None:
    for schedule, _ in seeds(seq_len):
        _check(schedule, seq_len)
    assert len(seeds(seq_len)) == (2 + sum(d in depths(seq_len) for d in (2, 3))
                                   + (seq_len >= 1000) + (seq_len >= 2))


def test_offload_policies_only_on_accelerators() -> None:
    assert set(policy_choices("cpu")) == set(POLICIES)
    for platform in ("gpu", "tpu"):
        assert set(OFFLOAD_POLICIES) <= set(policy_choices(platform))
    rng = random.Random(1)
    names = set()
    for _ in range(100):
        schedule = propose({}, 1000, "gpu", rng)[0]
        _check(schedule, 1000, "gpu")
        if isinstance(schedule, NestedSchedule):
            names |= {lv.policy.name for lv in schedule.levels}
    assert "offload_dot_with_no_batch_dims" in names


def test_snap_prefers_near_divisors() -> None:
    assert snap(33, 64) == 32
    assert snap(95, 10_000) == 100  # within 25%
    assert snap(10, 97) == 10  # 97 is prime: no divisor near, keep the length
    assert depths(3) == [1] and depths(8) == [1, 2, 3] and depths(10_000) == [1, 2, 3, 4]


def test_neighbours_of_a_nested_schedule_run_its_innermost_level_fully_unrolled() -> None:
    """Besides one-parameter moves, the innermost length and unroll move together
    (``unrolled_inner``): from 3334x3 unroll 2, 5000x2 unroll 2 and 2500x4 unroll 4 --
    the TPU v5e's fastest, which moving one of them at a time passed by."""
    rng = random.Random(0)
    wanted = {"kind": "nested", "depth": 2, "d2_n0": 3, "d2_p0": "nothing",
              "d2_p1": "everything", "d2_unroll": 2}
    schedule, params = propose(wanted, 10_000, "tpu", rng, fuse=True)
    assert schedule.describe().startswith("3334x3 nothing/everything unroll=2")
    found = {s.describe() for s, _ in neighbours(params, 10_000, "tpu", rng, fuse=True)}
    fuse = schedule.options_note()
    assert {f"5000x2 nothing/everything unroll=2{fuse}",
            f"2500x4 nothing/everything unroll=4{fuse}"} <= found
    assert unrolled_inner({**params, "d2_n0": 8, "d2_unroll": 8}) == [
        {**params, "d2_n0": 4, "d2_unroll": 4}]
    assert unrolled_inner({"kind": "nested", "depth": 1, "d1_policy": "nothing",
                           "d1_unroll": 2}) == []
    # only where the innermost level is short: from 100 steps at unroll 1, none
    assert unrolled_inner({**params, "d2_n0": 100, "d2_unroll": 1}) == []
