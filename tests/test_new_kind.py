"""A new kind needs only its class and one ``register`` line (CONTRIBUTING.md).

``_EveryK`` -- uniform checkpointing every ``k`` steps -- is defined here only,
registered by a fixture, and run through everything that reads a kind: YAML
and its errors, ``show``, ``bounds.cost``, ``autoremat.scan`` (gradients vs
``lax.scan``), the cost model, the search space and ``tune``.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

import autoremat
from autoremat import Schedule, ScheduleError, bounds
from autoremat._schedules import KINDS, parse_schedule, register
from autoremat._schedules.base import NO_NAMES, Features, Param
from autoremat._schedules.policy import check_int
from autoremat._search.tune import tune


@dataclass(frozen=True, kw_only=True)
class _EveryK(Schedule):
    """``kind: every_k`` -- a ``lax.scan`` over chunks of ``every`` steps, each chunk
    under ``jax.checkpoint``: ``ceil(T / k)`` carries plus one chunk's residuals
    stored, every step run twice. A remainder of ``T mod k`` steps runs as a plain scan."""

    kind: ClassVar[str] = "every_k"
    FIELDS: ClassVar[Mapping[str, str]] = {"every": "every: 10"}
    every: int

    def __post_init__(self) -> None:
        check_int("every", self.every)
        super().__post_init__()

    @classmethod
    def parse_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        return {"every": data["every"]}

    def fields_data(self) -> dict[str, Any]:
        return {"every": self.every}

    def describe(self) -> str:
        return f"every {self.every} unroll={self.unroll}"

    def explain(self) -> list[str]:
        return [f"  a checkpoint every {self.every} steps"]

    def cost(self, seq_len: int) -> bounds.Cost:
        k = min(self.every, seq_len)
        return bounds.Cost(seq_len, 2 * seq_len, seq_len // k + k + seq_len % k)

    def features(self, seq_len: int) -> Features:
        k = min(self.every, seq_len)
        chunks = seq_len // k
        return Features(evaluations=float(self.cost(seq_len).evaluations),
                        boundaries=2.0 * chunks, terms=(float(chunks), float(k), 0.0))

    def run(self, step: Any, init: Any, leaves: list[Any], axes: list[int], steps: int,
            reverse: bool) -> tuple[Any, Any]:
        import jax
        import jax.numpy as jnp

        xs = [jnp.moveaxis(x, a, 0) for x, a in zip(leaves, axes, strict=True)]
        if reverse:  # a reversed scan is the forward scan of the reversed inputs
            carry, ys = self._forward(step, init, [x[::-1] for x in xs], steps)
            return carry, jax.tree_util.tree_map(lambda y: y[::-1], ys)
        return self._forward(step, init, xs, steps)

    def _forward(self, step: Any, init: Any, xs: list[Any], steps: int) -> tuple[Any, Any]:
        import jax
        import jax.numpy as jnp

        k = min(self.every, steps)
        n, rest = divmod(steps, k)

        @jax.checkpoint
        def chunk(c: Any, x: list[Any]) -> tuple[Any, Any]:
            return jax.lax.scan(step, c, x, length=k, unroll=min(self.unroll, k))

        main = [x[:n * k].reshape((n, k, *x.shape[1:])) for x in xs]
        carry, ys = jax.lax.scan(chunk, init, main, length=n)
        ys = jax.tree_util.tree_map(lambda y: y.reshape((n * k, *y.shape[2:])), ys)
        if not rest:
            return carry, ys
        carry, tail = jax.lax.scan(step, carry, [x[n * k:] for x in xs], length=rest)
        return carry, jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), ys, tail)

    @classmethod
    def parameters(cls, seq_len: int, platform: str, chosen: Mapping[str, Any],
                   named: Mapping[str, Any] = NO_NAMES) -> list[Param]:
        return [Param("every", low=1, high=seq_len, log=True)]

    @classmethod
    def from_params(cls, params: Mapping[str, Any], seq_len: int, platform: str,
                    named: Mapping[str, Any] = NO_NAMES) -> Schedule:
        return cls(every=params["every"])

    @classmethod
    def seed_params(cls, seq_len: int, platform: str = "cpu") -> list[dict[str, Any]]:
        return [{"every": max(1, math.isqrt(seq_len))}]

    @classmethod
    def examples(cls) -> list[Schedule]:
        return [cls(every=3), cls(every=4, unroll=2), cls(every=1), cls(every=50)]


@pytest.fixture()
def every_k() -> Iterator[type[_EveryK]]:
    register(_EveryK)
    try:
        yield _EveryK
    finally:
        KINDS.pop(_EveryK.kind)
    assert "every_k" not in KINDS


def test_yaml_errors_show_and_bounds(every_k: type[_EveryK], tmp_path: Path) -> None:
    from autoremat._cli.show_text import describe_schedule

    schedule = every_k(every=7, unroll=3, meta={"seq_len": 100})
    path = autoremat.save_schedule(schedule, tmp_path / "s.yaml")
    assert "kind: every_k\nevery: 7\n" in path.read_text()
    assert autoremat.load_schedule(path) == schedule
    assert parse_schedule("version: 1\nkind: every_k\nevery: 2\n") == every_k(every=2)
    with pytest.raises(ScheduleError, match=r"every: missing; a every_k schedule needs e\.g\."):
        parse_schedule("version: 1\nkind: every_k\n")
    with pytest.raises(ScheduleError, match="every: must be >= 1, got 0"):
        parse_schedule("version: 1\nkind: every_k\nevery: 0\n")
    with pytest.raises(ScheduleError, match="levels: a every_k schedule has no levels"):
        parse_schedule("version: 1\nkind: every_k\nevery: 2\nlevels: [{length: 2}]\n")
    with pytest.raises(ScheduleError, match=r"every: a nested schedule has no every \(a every_k"):
        parse_schedule("version: 1\nlevels: [{length: 2}]\nevery: 2\n")
    assert "a checkpoint every 7 steps" in describe_schedule(schedule)
    assert bounds.cost(schedule, 100).recompute_factor == 2.0


@pytest.mark.parametrize(("every", "reverse"), [(3, False), (4, True), (11, False), (20, True)])
def test_gradients_match_lax_scan(every_k: type[_EveryK], every: int, reverse: bool) -> None:
    import jax
    import jax.numpy as jnp

    from tests.helpers import assert_close

    w = jnp.array([[0.5, -0.4], [0.2, 0.6]])
    xs = jnp.sin(jnp.arange(22.0)).reshape(11, 2)

    def loss(w: jax.Array, s: Schedule | None) -> jax.Array:
        def f(c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            c = jnp.tanh(c @ w + x)
            return c, c * x

        scan = jax.lax.scan if s is None else functools.partial(autoremat.scan, schedule=s)
        c, ys = scan(f, jnp.ones(2), xs, reverse=reverse)
        return c.sum() + jnp.sum(ys**2 * jnp.arange(1.0, 12.0)[:, None])

    assert_close(jax.value_and_grad(loss)(w, every_k(every=every, unroll=2)),
                  jax.value_and_grad(loss)(w, None))


def test_the_cost_model_reads_its_features(every_k: type[_EveryK]) -> None:
    from autoremat._search.planning.memory_model import MemoryModel
    from autoremat._search.planning.predict import Structure, TimeModel

    seq_len = 100
    structures = {k: Structure.of(every_k(every=k), seq_len) for k in (2, 5, 10, 25)}
    for s in structures.values():
        assert s.kind == "every_k" and s.evaluations > 0 and s.boundaries > 0
        assert all(math.isfinite(x) for x in s.row(1e4)) and any(s.terms)
    rows = {tuple(s.row(1e4)) for s in structures.values()}
    assert len(rows) == len(structures)  # each k its own features
    assert len({s.terms for s in structures.values()}) == len(structures)

    def truth(s: Structure) -> float:  # a made-up machine: boundaries cost extra
        return 1e-6 * s.evaluations + 1e-5 * s.boundaries

    model = TimeModel()
    model.fit([(s, 1e4, truth(s)) for s in structures.values()])
    assert model.points == len(structures)
    for s in structures.values():  # a timed schedule is predicted as measured
        assert model.predict(s, 1e4) == pytest.approx(truth(s), rel=1e-6)
    held_out = Structure.of(every_k(every=4), seq_len)
    predicted = model.predict(held_out, 1e4)
    assert predicted is not None and math.isfinite(predicted) and predicted > 0
    many, few = (model.predict(Structure.of(every_k(every=k), seq_len), 1e4) for k in (3, 50))
    assert many is not None and few is not None and many > few  # more boundaries, slower
    memory = MemoryModel()
    for s in structures.values():
        memory.add(s, int(100 * sum(s.terms)), over_budget=False)
    guess = memory.predict(held_out)
    assert guess is not None and guess > 0


def test_the_space_offers_and_seeds_it(every_k: type[_EveryK]) -> None:
    from autoremat._search.space import build, neighbours, seeds

    assert (every_k(every=10), {"kind": "every_k", "every": 10}) in seeds(100)
    assert build({"kind": "every_k", "every": 7}, 100, "cpu") == every_k(every=7)
    near = neighbours({"kind": "every_k", "every": 10}, 100, "cpu", random.Random(0))
    assert {s.every for s, _ in near if isinstance(s, _EveryK)} >= {5, 7, 14, 20}


def test_tune_measures_it(every_k: type[_EveryK], tmp_path: Path) -> None:
    import optuna

    from autoremat._search import space
    from tests.tiny_problem import tiny

    problem = tiny()
    storage = f"sqlite:///{tmp_path / 's.db'}"
    seeds = space.seeds(problem.seq_len)
    assert seeds[-1][1] == {"kind": "every_k", "every": 5}
    result = tune(problem, 10**6, n_trials=len(seeds), time_budget=0.02, storage=storage,
                  time_limit=None)
    assert result.measured == len(seeds)
    study = optuna.load_study(study_name=result.study_name, storage=storage)
    measured = [t for t in study.trials if t.user_attrs.get("measured")
                and t.user_attrs["schedule"]["kind"] == "every_k"]
    assert len(measured) == 1
    attrs = measured[0].user_attrs
    assert attrs["describe"] == "every 5 unroll=1"
    seconds = attrs["step_seconds"] or attrs["cut_seconds"]  # timed in full, or cut
    assert attrs["total_bytes"] > 0 and seconds is not None and seconds > 0

