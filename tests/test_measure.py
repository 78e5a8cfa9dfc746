"""measure(): compiled memory figures, timing, and infeasible records."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import autoremat
from autoremat._errors import ProblemError
from autoremat._measure.breakdown import memory_parts, total_of
from autoremat._measure.device import arguments_fingerprint
from autoremat._measure.measure import measure, measure_step
from autoremat._measure.measurement import ERROR, OK, OVER_BUDGET, Measurement
from autoremat._measure.problem import Problem
from autoremat._models.seed_lstm import seed_lstm, seed_model
from autoremat._schedules.base import Schedule
from tests.helpers import assert_close
from tests.tiny_problem import tiny


@pytest.fixture(scope="module")
def seed() -> Problem:
    return seed_lstm(seq_len=64, batch=2, hidden=8)


def test_seed_lstm_plain_and_nested(seed: Problem) -> None:
    plain = measure(seed, autoremat.plain(64), time_budget=0.1)
    nested = measure(seed, autoremat.nested([8, 8], ["nothing_saveable", "everything_saveable"]),
                     time_budget=0.1)
    for m in (plain, nested):
        assert m.status == OK and m.feasible and m.reason == ""
        assert m.total_bytes == m.argument_bytes + m.output_bytes + m.temp_bytes - m.alias_bytes
        assert m.step_seconds is not None and m.step_seconds > 0
        assert m.compile_seconds is not None and m.compile_seconds > 0
        assert 1 <= len(m.step_samples) <= 20
        assert m.device_kind and m.jax_version and m.flax_version
        assert m.loss is not None and m.loss > 0
    assert nested.temp_bytes < plain.temp_bytes
    assert nested.argument_bytes == plain.argument_bytes
    assert plain.to_attrs()["feasible"] is True


def test_measure_step_takes_any_step_and_hands_back_the_warm_up_output() -> None:
    step, args = tiny().build(autoremat.plain(32))
    seen: list[Any] = []
    m = measure_step(step, args, time_budget=0.05, label="hand-written", on_output=seen.append)
    assert m.status == OK and m.schedule_key == "hand-written"
    assert len(seen) == 1 and float(seen[0][1]) == m.loss
    same = measure(tiny(), autoremat.plain(32), time_budget=0.05)  # measure = build + measure_step
    assert (same.total_bytes, same.temp_bytes, same.loss) == (m.total_bytes, m.temp_bytes, m.loss)
    assert same.schedule_key == autoremat.plain(32).key()

    def boom(out: Any) -> None:
        raise ValueError("gradients differ")

    m = measure_step(step, args, on_output=boom)
    assert m.status == ERROR and m.reason.startswith("run failed: ValueError: gradients differ")
    assert (m.failed_at, m.out_of_memory) == ("run", False)
    assert m.total_bytes is not None and m.step_seconds is None


@pytest.mark.parametrize("seq2seq", [False, True])
def test_seed_train_step_around_lax_scan_is_seed_lstm(seq2seq: bool) -> None:
    """``SeedModel.train_step`` is the one seed step: around ``lax.scan`` it is the plain schedule's."""
    import jax
    import jax.numpy as jnp

    model = seed_model(seq_len=16, batch=2, hidden=8, input_dim=3, output_dim=2, seq2seq=seq2seq)

    def run_scan(params: Any, x: Any) -> Any:
        return jax.lax.scan(model.cell_step(params), model.carry0, jnp.moveaxis(x, 1, 0))

    ours = jax.jit(model.train_step(run_scan))(*model.args)
    step, args = seed_lstm(seq_len=16, batch=2, hidden=8, input_dim=3, output_dim=2,
                           seq2seq=seq2seq).build(autoremat.plain(16))
    ref = jax.jit(step)(*args)
    assert model.problem().name == seed_lstm(16, 2, 8, 3, 2, seq2seq=seq2seq).name
    assert_close(ours, ref)


def test_over_budget_is_not_run() -> None:
    m = measure(tiny(), autoremat.plain(32), budget_bytes=100)
    assert m.status == OVER_BUDGET and not m.feasible
    assert m.step_seconds is None and m.step_samples == ()
    assert m.total_bytes is not None and m.total_bytes > 100
    assert "over budget" in m.reason and "not run" in m.reason


def test_nan_loss_is_infeasible() -> None:
    m = measure(tiny(nan_for_plain=True), autoremat.plain(32), time_budget=0.05)
    assert m.status == ERROR and not m.feasible
    assert "non-finite output" in m.reason and m.failed_at == "run"
    assert m.total_bytes is not None  # sized before it ran


def test_build_and_compile_failures_are_recorded() -> None:
    def bad_build(schedule: Schedule) -> Any:
        raise RuntimeError("no such model")

    m = measure(Problem("bad", 8, bad_build), autoremat.plain(8))
    assert m.status == ERROR and m.reason.startswith("build failed: RuntimeError: no such model")
    assert m.failed_at == "build"

    def trace_error(schedule: Schedule) -> Any:
        import jax.numpy as jnp

        def step(x: Any) -> Any:
            return jnp.ones(3) @ jnp.ones(4)  # shape error at trace time

        return step, (jnp.ones(2),)

    m = measure(Problem("bad", 8, trace_error), autoremat.plain(8))
    assert m.status == ERROR and m.reason.startswith("compile failed: ")
    assert m.failed_at == "compile" and Measurement.from_attrs(m.to_attrs()) == m
    assert m.total_bytes is None and m.step_seconds is None


def test_repeats_are_bounded() -> None:
    m = measure(tiny(), autoremat.nested([4, 8]), time_budget=10.0, max_repeats=3)
    assert len(m.step_samples) == 3
    m = measure(tiny(), autoremat.nested([4, 8]), time_budget=1e-9, min_repeats=2)
    assert len(m.step_samples) == 2
    assert m.step_seconds == sorted(m.step_samples)[0] + (
        sorted(m.step_samples)[1] - sorted(m.step_samples)[0]) / 2


def test_run_false_sizes_only() -> None:
    m = measure(tiny(), autoremat.plain(32), run=False)
    assert m.status == OK and m.step_seconds is None and m.total_bytes is not None


@pytest.mark.parametrize("analysis", [
    None,
    SimpleNamespace(argument_size_in_bytes=-1, output_size_in_bytes=-1,
                    temp_size_in_bytes=-1, alias_size_in_bytes=-1),
    SimpleNamespace(argument_size_in_bytes=0, output_size_in_bytes=0,
                    temp_size_in_bytes=0, alias_size_in_bytes=0),
])
def test_missing_memory_analysis_gives_none(analysis: Any) -> None:
    compiled = SimpleNamespace(memory_analysis=lambda: analysis)
    assert total_of(memory_parts(compiled)) is None


def test_memory_analysis_raising_and_alias() -> None:
    def boom() -> None:
        raise NotImplementedError("no analysis on this backend")

    assert total_of(memory_parts(SimpleNamespace(memory_analysis=boom))) is None
    ok = SimpleNamespace(argument_size_in_bytes=10, output_size_in_bytes=5,
                         temp_size_in_bytes=7, alias_size_in_bytes=None)
    assert total_of(memory_parts(SimpleNamespace(memory_analysis=lambda: ok))) == 22
    ok.alias_size_in_bytes = 5
    assert total_of(memory_parts(SimpleNamespace(memory_analysis=lambda: [ok]))) == 17


def test_fingerprint_tracks_shapes_not_values() -> None:
    import jax.numpy as jnp

    a = arguments_fingerprint((jnp.zeros((2, 3)), {"w": jnp.ones(4)}))
    assert a == arguments_fingerprint((jnp.ones((2, 3)), {"w": jnp.zeros(4)}))
    assert a != arguments_fingerprint((jnp.zeros((2, 4)), {"w": jnp.ones(4)}))
    assert a != arguments_fingerprint((jnp.zeros((2, 3), jnp.int32), {"w": jnp.ones(4)}))
    assert a != arguments_fingerprint((jnp.zeros((2, 3)), {"v": jnp.ones(4)}))


def test_the_host_link_is_timed_once_by_copies_there_and_back() -> None:
    """``host_bandwidth``: bytes over the best copy's seconds, timed once per process."""
    import autoremat._measure.device as device

    device.host_bandwidth.cache_clear()
    bandwidth = device.host_bandwidth()
    if bandwidth is None:
        pytest.skip("this jax's CPU has no pinned_host memory to copy to")
    assert 0 < bandwidth < math.inf and device.host_bandwidth() is bandwidth  # no speed asked


def test_breakdown_fields_round_trip_and_add_up(seed: Problem) -> None:
    from autoremat._cli.breakdown_text import breakdown_lines
    from autoremat._measure.breakdown import floor_bytes
    from autoremat._measure.measurement import Measurement

    step, args = seed.build(autoremat.plain(64))
    first = measure_step(step, args, run=False, arg_names=seed.arg_names)
    again = measure_step(step, args, run=False)  # the same step: traced anew, still recorded
    assert first.stacked_bytes == again.stacked_bytes == 64 * 2 * 8 * 4  # (T, B, H) float32
    assert first.carry_bytes == 2 * 2 * 8 * 4  # the LSTM's (c, h)
    assert [n for n, _ in first.argument_parts] == ["params", "opt_state", "x", "y"]
    assert [n for n, _ in again.argument_parts] == ["arg0", "arg1", "arg2", "arg3"]
    assert sum(b for _, b in first.argument_parts) == first.argument_bytes
    back = Measurement.from_attrs(first.to_attrs())
    assert back == first and isinstance(back.argument_parts, tuple)
    floor = floor_bytes(first.to_attrs())
    assert floor == first.argument_bytes + first.output_bytes - first.alias_bytes + \
        first.stacked_bytes
    lines = "\n".join(breakdown_lines(first.to_attrs()))
    assert "arguments: params" in lines and "stacked by the scan 4.1 KB" in lines
    no_scan = measure_step(lambda x: x * 2, (np.ones(3, np.float32),), run=False)
    assert no_scan.stacked_bytes is None and no_scan.argument_parts == (("arg0", 12),)


def test_the_least_is_under_every_schedules_total_fused_or_not() -> None:
    """``least_bytes``: the arguments and outputs, the same for every schedule of a step
    and under each one's total, fused or not (the floor is not: it counts the unfused
    readout's stack)."""
    from autoremat._measure.breakdown import floor_bytes, least_bytes

    problem = seed_lstm(seq_len=64, batch=2, hidden=8, fused_readout=None)
    two = autoremat.nested([8, 8], ["nothing_saveable", "everything_saveable"])
    found = [measure(problem, dataclasses.replace(s, fuse=fuse), run=False)
             for s in (autoremat.plain(64), two) for fuse in (True, False)]
    least = {least_bytes(m) for m in found}
    assert len(least) == 1
    (bound,) = least
    assert bound is not None and all(bound <= m.total_bytes for m in found)
    assert bound < max(floor_bytes(m) or 0 for m in found)  # an unfused floor is higher


def test_arg_names_must_be_a_tuple_of_strings() -> None:
    with pytest.raises(ProblemError, match="arg_names: expected a tuple of non-empty strings"):
        Problem("p", 4, lambda s: (None, ()), arg_names=["x"])  # type: ignore[arg-type]


def test_argument_parts_count_typed_prng_keys() -> None:
    """A model holding ``nnx.Rngs`` passes typed keys (``key<fry>``, 8 bytes each)."""
    import jax

    from autoremat._measure.breakdown import argument_parts

    keys = jax.random.split(jax.random.key(0), 3)
    assert argument_parts([keys, np.zeros(4, np.float32)], ["rngs", "x"]) == (
        ("rngs", 3 * keys.dtype.itemsize), ("x", 16))




#: A trial's attrs as a study written before ``Measurement`` held records stored them.
OLD_ATTRS: dict[str, Any] = {
    "schedule_key": "k", "status": "error", "reason": "run: out of memory", "total_bytes": 30,
    "temp_bytes": 10, "argument_bytes": 12, "output_bytes": 8, "alias_bytes": 0,
    "peak_bytes": 40, "step_seconds": 0.5, "step_samples": [0.5, 0.6], "compile_seconds": 1.0,
    "loss": 0.25, "device_kind": "TPU", "platform": "tpu", "jax_version": "0.10",
    "flax_version": "0.12", "argument_parts": [["params", 12]], "stacked_bytes": 4,
    "carry_bytes": 1, "cut_seconds": None, "devices": 2, "mesh": "data=2",
    "argument_sharding": [["params", "replicated"]], "timed_seq_len": 8, "short_seq_len": 8,
    "short_seconds": 0.05, "extrapolated_seconds": 0.4, "runtime_peak_bytes": 33,
    "compile_scratch_bytes": 2, "fit_proof_bytes": None, "fit_proof_failed": "",
    "compiler_bytes": 50, "failed_at": "run", "out_of_memory": True, "feasible": False,
}


def test_a_measurement_is_records_flat_at_the_study_boundary() -> None:
    from autoremat._measure.figures import Failure, Sizes, Timing

    m = Measurement.from_attrs(OLD_ATTRS)
    assert m.to_attrs() == OLD_ATTRS  # an old study reads, and writes back, the same
    assert m.sizes == Sizes(30, 10, 12, 8, 0, (("params", 12),), 4, 1)
    assert m.failure == Failure("run", True, 50) and m.timing.short_seconds == 0.05
    assert (m.total_bytes, m.step_samples, m.mesh, m.fit_proof_failed) == (
        30, (0.5, 0.6), "data=2", "")  # the old names still read
    flat = Measurement("k", OK, total_bytes=30, step_seconds=0.5)  # and still construct
    assert flat == Measurement("k", OK, sizes=Sizes(total_bytes=30),
                               timing=Timing(step_seconds=0.5))
    import dataclasses

    assert dataclasses.replace(flat, step_seconds=0.25).timing.step_seconds == 0.25


def test_a_misspelt_figure_fails() -> None:
    from autoremat._measure.measurement import figure_names

    with pytest.raises(TypeError, match="totl_bytes"):
        Measurement("k", OK, totl_bytes=1)
    with pytest.raises(TypeError, match="step_second'"):
        figure_names("status", "step_second")
    with pytest.raises(AttributeError):
        Measurement("k", OK).sizes.totl_bytes  # type: ignore[attr-defined]  # noqa: B018


def test_a_breakdown_reads_a_measurement_and_its_meta_alike() -> None:
    from autoremat._cli.breakdown_text import breakdown_lines, floor_message
    from autoremat._measure.breakdown import floor_bytes

    m = Measurement.from_attrs({**OLD_ATTRS, "fit_proof_bytes": 64})
    meta = {k: v for k, v in OLD_ATTRS.items() if k not in ("schedule_key", "status")}
    meta.update(argument_parts={"params": 12}, argument_sharding={"params": "replicated"},
                fit_proof_bytes=64)  # as a schedule's meta holds them
    assert breakdown_lines(m) == breakdown_lines(meta) and len(breakdown_lines(m)) >= 4
    assert floor_bytes(m) == floor_bytes(meta) == 12 + 8 + 4
    assert floor_message(m, 10) == floor_message(meta, 10) is not None


def test_a_floor_is_a_record_and_its_fixes_are_the_problems() -> None:
    from autoremat._cli.breakdown_text import floor_message
    from autoremat._measure.breakdown import breakdown_of, floor_of
    from autoremat._models import LAYER_STACK, SEED_FIXES, floor_fixes, model

    m = Measurement.from_attrs({**OLD_ATTRS, "fit_proof_bytes": 64})
    floor, b = floor_of(m), breakdown_of(m)
    assert floor is not None and floor.bytes == 12 + 8 + 4 and not floor.on_chip
    assert b is not None and b.floor == floor and b.device is not None
    assert b.device.proof_bytes == 64 and b.total_bytes == m.total_bytes
    model_of_default = model(None)
    assert model_of_default is not None and model_of_default.name == "seed_lstm"
    assert model("pkg.module:name") is None and floor_fixes("pkg.module:name") == SEED_FIXES
    seed = floor_message(m, 10)
    stack = floor_message(m, 10, fixes=floor_fixes(LAYER_STACK))
    assert seed is not None and "seed_lstm(fused_readout=...)" in seed
    assert stack is not None and "fused_readout" not in stack and "seed_lstm(seq_len=...)" in stack
