"""``Schedule.compiler_options``: XLA options for the jitted step, in the YAML, the key,
the measurements and (on a GPU only) the search space.

No GPU here: what XLA:GPU does with the options is for a GPU run; on this CPU the
tests check what the CPU backend does with them (accepts XLA:GPU's and ignores
them; refuses unknown names) and that they reach the compile.
"""

from __future__ import annotations

import math
import random
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import autoremat
from autoremat._errors import ScheduleError
from autoremat._measure.measure import compile_schedule, measure
from autoremat._measure.measurement import ERROR, OK
from autoremat._schedules import dump_schedule, from_data, parse_schedule
from autoremat._search.planning.predict import Structure
from autoremat._search.space import COMPILER_CHOICES, GRAPH_TYPES, build, propose, seeds
from tests.tiny_problem import tiny

GRAPHS = COMPILER_CHOICES["graph_loops"]
cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="what a CPU does")


def test_without_options_the_yaml_and_the_key_are_unchanged() -> None:
    """The keys of schedules saved before ``compiler_options`` existed (reference:
    this checkout's parent, 11db895)."""
    nested, binomial = autoremat.nested([100, 100]), autoremat.binomial(7, unroll=2)
    assert nested.key() == ("{kind: nested, levels: [{length: 100, policy: nothing_saveable}, "
                            "{length: 100, policy: nothing_saveable}],\n  unroll: 1, version: 1}")
    assert binomial.key() == "{kind: binomial, snapshots: 7, unroll: 2, version: 1}"
    assert "compiler_options" not in dump_schedule(nested)
    assert nested.compiler_options == {} and nested.describe() == "100x100 nothing/nothing unroll=1"


def test_options_round_trip_and_are_part_of_the_key() -> None:
    plain = autoremat.binomial(9)
    tuned = plain.with_options(**GRAPHS)
    text = dump_schedule(tuned)
    assert "compiler_options:" in text and "xla_gpu_graph_min_graph_size: 1" in text
    again = parse_schedule(text)
    assert again == tuned and again.key() == tuned.key() != plain.key()
    assert dict(again.compiler_options) == GRAPHS
    assert tuned.describe().startswith("binomial s=9 unroll=1 xla{gpu_enable_command_buffer=")
    options = {"xla_gpu_graph_min_graph_size": 1, "xla_gpu_enable_command_buffer": "FUSION,WHILE"}
    data = {"version": 1, "kind": "nested", "levels": [{"length": 4}],
            "compiler_options": options}
    loaded = from_data(data)
    assert list(loaded.compiler_options) == sorted(options)
    assert from_data({**data, "compiler_options": None}) == autoremat.nested([4])


@pytest.mark.parametrize(("value", "message"), [
    ([1], "compiler_options: expected a mapping of XLA option names to values"),
    ({"gpu_graph_min_graph_size": 1}, "compiler_options: 'gpu_graph_min_graph_size' (str) "
                                      "is not an XLA option name: expected lower case 'xla_...'"),
    ({"--xla_foo": 1}, "is not an XLA option name"),
    ({"xla_foo": [1]}, "compiler_options.xla_foo: expected a bool, number or string, got [1]"),
    ({"xla_foo": {"a": 1}}, "compiler_options.xla_foo: expected a bool, number or string"),
    ({"xla_foo": math.nan}, "compiler_options.xla_foo: expected a finite number, got nan"),
    ({3: 1}, "compiler_options: 3 (int) is not an XLA option name"),
])
def test_bad_options_name_the_field_and_the_fix(value: object, message: str) -> None:
    data = {"version": 1, "kind": "binomial", "snapshots": 3, "compiler_options": value}
    with pytest.raises(ScheduleError, match=None) as err:
        from_data(data)
    assert message in str(err.value)
    with pytest.raises(ScheduleError):
        autoremat.binomial(3).with_options(**{"xla foo": 1})


@cpu_only
def test_the_cpu_accepts_gpu_options_and_ignores_them() -> None:
    """jax 0.10.2 on a CPU: XLA:GPU's options are ``DebugOptions`` fields like any other,
    so the compile accepts them; the step is the same (same bytes, same outputs)."""
    problem = tiny(32)
    plain = autoremat.nested([4, 8])
    a = measure(problem, plain, time_budget=0.01)
    b = measure(problem, plain.with_options(**GRAPHS), time_budget=0.01)
    assert a.status == b.status == OK
    assert (a.total_bytes, a.loss) == (b.total_bytes, b.loss)
    assert b.schedule_key != a.schedule_key


@pytest.mark.parametrize(("options", "reason"), [
    ({"xla_no_such_option": 1}, "No such compile option: 'xla_no_such_option'"),
    ({"xla_gpu_enable_command_buffer": "NOT_A_TYPE"}, "'NOT_A_TYPE' is not a valid enum value"),
    ({"xla_gpu_graph_min_graph_size": "x"}, "'x' is not a valid int32 value"),
])
def test_the_measurement_compiles_with_the_options(options: dict[str, object],
                                                   reason: str) -> None:
    """They reach ``compile(compiler_options=...)``: XLA refuses a bad one at the compile
    (a failed compile, recorded; the tuner does not count it as a trial)."""
    m = compile_schedule(tiny(16), autoremat.nested([16]).with_options(**options)).measurement  # type: ignore[arg-type]
    assert m.status == ERROR and m.reason.startswith("compile failed: ") and reason in m.reason


def test_users_compile_their_step_with_the_options() -> None:
    """What ``docs/schedules.md`` tells users: ``autoremat.scan`` cannot apply them (they
    are the whole step's), ``jax.jit(step, compiler_options=...)`` does."""
    import autoremat

    schedule = autoremat.nested([4, 4]).with_options(xla_gpu_graph_min_graph_size=1)

    def loss(w: jax.Array, xs: jax.Array) -> jax.Array:
        h, _ = autoremat.scan(lambda h, x: (jnp.tanh(h * w + x), None), jnp.zeros(3), xs,
                              schedule=schedule)
        return jnp.sum(h**2)

    xs = jnp.linspace(0.0, 1.0, 48).reshape(16, 3)
    options: dict[str, Any] = dict(schedule.compiler_options)
    step = jax.jit(jax.grad(loss), compiler_options=options)
    ahead = jax.jit(jax.grad(loss)).lower(0.5, xs).compile(compiler_options=options)
    assert float(step(0.5, xs)) == pytest.approx(float(ahead(0.5, xs)), rel=1e-6)


def test_the_cpu_space_has_no_compiler_choice() -> None:
    rng = random.Random(0)
    for _ in range(100):
        schedule, params = propose({}, 1000, "cpu", rng)
        assert not schedule.compiler_options and "compiler" not in params
    assert all("compiler" not in p for _, p in seeds(1000, "cpu"))
    assert all(p["compiler"] == "default" for _, p in seeds(1000, "gpu"))


@pytest.mark.parametrize("platform", ["gpu", "cuda"])
def test_a_gpu_space_tries_command_buffers_that_capture_loops(platform: str) -> None:
    rng = random.Random(0)
    got = [propose({}, 1000, platform, rng)[0] for _ in range(100)]
    with_options = [s for s in got if s.compiler_options]
    assert with_options and len(with_options) < len(got)
    assert all(dict(s.compiler_options) == GRAPHS for s in with_options)
    assert {"WHILE", "CONDITIONAL", "FUSION"} <= set(GRAPH_TYPES.split(","))
    refused = propose({"compiler": "graph_loops"}, 1000, platform, rng,
                      frozenset({"graph_loops"}))[0]
    assert not refused.compiler_options
    fixed = {"kind": "binomial", "snapshots": 20, "backward": "loops", "compiler": "graph_loops"}
    assert build(fixed, 1000, platform) == autoremat.binomial(20).with_options(**GRAPHS)


def test_the_cost_model_sees_the_options_as_graph_captured_trips() -> None:
    plain = autoremat.nested([1000])
    assert Structure.of(plain, 1000).graphs == 0.0
    assert Structure.of(plain.with_options(**GRAPHS), 1000).graphs == 1000.0
    assert Structure.of(autoremat.nested([1000], unroll=4).with_options(**GRAPHS), 1000).graphs == 250.0
