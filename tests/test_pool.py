"""The planner's pool, alone: seeded draws, refused choices, groups only for a layer
stack, what is open, a new best's neighbours."""

from __future__ import annotations

from autoremat._search import space
from autoremat._search.planning.candidates import Verdict
from autoremat._search.planning.pool import Pool


def test_the_same_seed_draws_the_same_pool_after_the_spaces_seeds() -> None:
    pool = Pool(1000, "cpu", seed=3)
    assert list(pool) == list(Pool(1000, "cpu", seed=3))  # a worker's trial sequence repeats
    assert list(pool) != list(Pool(1000, "cpu", seed=4))
    seeds = [s.key() for s, _ in space.seeds(1000, "cpu")]
    assert list(pool)[:len(seeds)] == seeds


def test_a_choice_the_probe_left_out_is_never_proposed() -> None:
    def uses(pool: Pool, label: str) -> int:
        return sum(label in c.params.values() for c in pool.values())

    assert uses(Pool(1000, "tpu"), "offload_carries") > 0
    refused = Pool(1000, "tpu", refused=frozenset({"offload_carries"}))
    assert uses(refused, "offload_carries") == 0
    assert all("offload_carries" not in p.values()
               for _, p in (refused.propose({}) for _ in range(50)))


def test_groups_draws_join_only_a_layer_stack() -> None:
    def kinds(pool: Pool) -> set[str]:
        return {c.schedule.kind for c in pool.values()}

    assert "groups" not in kinds(Pool(32, "cpu"))
    assert "groups" in kinds(Pool(32, "cpu", layer_stack=True))


def test_open_leaves_out_what_is_taken_or_decided_and_dominated_ones_come_back() -> None:
    pool = Pool(1000, "cpu")
    first, second, third = list(pool.values())[:3]
    pool.take({first.schedule.key()})
    pool.mark(second, Verdict.DOMINATED)
    pool.mark(third, Verdict.MEASURED)
    opened = pool.open()
    assert first not in opened and second not in opened and third not in opened
    assert len(opened) == len(pool) - 3
    pool.reopen_dominated()
    assert second in pool.open() and third not in pool.open()


def test_a_drawn_best_brings_its_neighbours_and_a_measured_schedule_joins_once() -> None:
    pool = Pool(1000, "cpu")
    drawn = next(k for k, c in pool.items() if c.params.get("depth") == 2)
    before = len(pool)
    pool.grow_around(drawn)
    assert len(pool) > before
    seed = space.seeds(1000, "cpu")[0][0]
    size = len(pool)
    assert pool.candidate(seed) is pool[seed.key()] and len(pool) == size
