"""autoremat.bounds and the Revolve plan against brute force (pure Python, fast)."""

from __future__ import annotations

import functools
import math

import pytest

import autoremat
from autoremat import bounds
from autoremat._schedules.revolve import tables
from tests.helpers import brute_advances


def brute_max_steps(slots: int, reps: int) -> int:
    """The longest chain whose optimal reversal advances no step more than ``reps`` times."""
    length = 1
    while _max_repeats(length + 1, slots) <= reps:
        length += 1
    return length


@functools.cache
def _max_repeats(length: int, slots: int) -> int:
    """Least possible maximum number of advances of any single step."""
    if length == 1:
        return 0
    if slots == 1:
        return length - 1
    return min(max(1 + _max_repeats(m, slots), _max_repeats(length - m, slots - 1))
               for m in range(1, length))


def test_min_advances_is_the_brute_force_optimum() -> None:
    for slots in range(1, 10):
        for length in range(1, 151):
            assert bounds.min_advances(length, slots) == brute_advances(length, slots), (
                length, slots)


def test_max_steps_is_the_binomial_coefficient() -> None:
    for slots in range(1, 5):
        for reps in range(0, 5):
            assert bounds.max_steps(slots, reps) == math.comb(slots + reps, slots)
            assert bounds.max_steps(slots, reps) == brute_max_steps(slots, reps), (slots, reps)
    assert bounds.repetitions(10, 3) == 2 and bounds.repetitions(11, 3) == 3


def _simulate(steps: int, snapshots: int) -> int:
    """Run the plan on integer "carries" (a carry is its position); count step runs."""
    p = tables(steps, snapshots)
    slots: dict[int, int] = {p.snapshots: 0}  # the initial carry
    targets = dict(zip(p.forward_positions.tolist(), p.forward_slots.tolist(), strict=True))
    assert sorted(targets) == p.forward_positions.tolist()
    assert len(targets) <= p.snapshots  # never more slots than allowed
    for position in range(steps):
        if position in targets:
            slots[targets[position]] = position
    runs = steps
    for k in range(steps):
        carry = slots[int(p.restore_slot[k])]
        assert carry == p.restore_position[k]
        for j in range(p.pair_start[k], p.pair_start[k + 1]):
            carry += int(p.pair_advance[j])
            runs += int(p.pair_advance[j])
            if p.pair_slot[j] >= 0:
                assert 0 <= p.pair_slot[j] < p.snapshots - 1
                slots[int(p.pair_slot[j])] = carry
        assert carry == steps - 1 - k  # the carry of the step being reversed
        runs += 1
    return runs


def test_plan_is_correct_and_optimal_for_all_small_T() -> None:
    """Every reversal gets the right carry, and the plan runs the optimum's step count."""
    for steps in range(1, 121):
        for snapshots in range(1, 9):
            want = brute_advances(steps, min(snapshots, steps)) + 1 + steps
            assert _simulate(steps, snapshots) == want == tables(steps, snapshots).evaluations
            assert bounds.min_evaluations(steps, min(snapshots, steps)) == want


@pytest.mark.parametrize(("steps", "snapshots"), [(10_000, 8), (100_000, 32), (1009, 1009)])
def test_large_plans(steps: int, snapshots: int) -> None:
    p = tables(steps, snapshots)
    assert p.evaluations == bounds.min_evaluations(steps, min(snapshots, steps))
    assert len(p.restore_slot) == steps


def test_cost_of_nested_schedules() -> None:
    T = 10_000
    plain = bounds.cost(autoremat.plain(T), T)
    assert (plain.evaluations, plain.stored_carries, plain.recompute_factor) == (T, T, 1.0)
    per_step = bounds.cost(autoremat.nested([T], "nothing_saveable"), T)
    assert per_step.recompute_factor == 2.0 and per_step.stored_carries == T
    two = bounds.cost(autoremat.nested([100, 100], ["nothing_saveable", "everything_saveable"]), T)
    assert two.recompute_factor == 2.0 and two.stored_carries == 200
    three = bounds.cost(autoremat.nested([25, 20, 20], "nothing_saveable"), T)
    assert three.recompute_factor == 4.0 and three.stored_carries == 65
    # The mixed-radix remainder of 1009 = 10 * 100 + 9: ten chunks, nine single steps.
    odd = bounds.cost(autoremat.nested([10, 100], ["nothing_saveable", "none"]), 1009)
    assert odd.evaluations == 1000 * 2 + 9 * 1
    assert odd.stored_carries == 10 + 9 + 100


def test_binomial_is_the_optimum_and_nested_is_measured_against_it() -> None:
    T = 10_000
    assert bounds.distance_to_optimum(autoremat.binomial(16), T) == 1.0
    three = autoremat.nested([25, 20, 20], "nothing_saveable")
    assert bounds.distance_to_optimum(three, T) > 1.0  # 4 T runs where 65 carries need fewer
    opt = bounds.optimal_cost(T, 65)
    assert opt.evaluations < bounds.cost(three, T).evaluations
    assert bounds.optimal_cost(T, 20_000).stored_carries == T


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(ValueError, match="snapshots: expected an integer >= 1"):
        bounds.min_advances(10, 0)
    with pytest.raises(ValueError, match="seq_len"):
        bounds.cost(autoremat.binomial(3), 0)
