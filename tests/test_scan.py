"""autoremat.scan against the reference: a plain lax.scan (float32, rtol 1e-5)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import autoremat
from autoremat import Schedule
from autoremat._models.seed_lstm import seed_lstm
from autoremat._schedules.nested import pieces as _pieces
from autoremat._schedules.policy import ZERO_ARG_POLICIES
from tests.helpers import (
    CELLS,
    _inputs,
    _loss_and_grads,
    _temp_bytes,
    assert_close,
    close_or_why,
    in_float64,
    kind_matrix,
    one_per_kind,
)


def test_tolerance_covers_rounding_of_the_sum_and_not_a_missing_term() -> None:
    """``assert_close``'s atol grows with the float32 rounding of what each gradient sums
    (shown by the float64 reference), yet a gradient short of one step still fails."""
    make, params, carry0 = CELLS["dict"]()
    xs0 = _inputs("dict", 97, 0)

    def loss(p: Any, carry: Any, xs: Any, drop: int, nested: bool) -> jax.Array:
        def step(c: Any, tx: Any) -> Any:  # step ``drop`` sees its params as constants
            t, x = tx
            q = jax.tree_util.tree_map(lambda a: jnp.where(t == drop, lax.stop_gradient(a), a), p)
            return make(q)(c, x)

        ts = jnp.arange(97)
        c, (h, _) = (autoremat.scan(step, carry, (ts, xs), schedule=autoremat.nested([10, 10]))
                     if nested else lax.scan(step, carry, (ts, xs)))
        return jnp.sum(c["h"] ** 2) + jnp.sum(jnp.cos(ts)[:, None, None] * h)

    def run(p: Any, carry: Any, xs: Any, drop: int, nested: bool = False) -> Any:
        return jax.jit(jax.value_and_grad(loss), static_argnums=(3, 4))(p, carry, xs, drop, nested)

    want, exact = run(params, carry0, xs0, -1), in_float64(run, params, carry0, xs0, -1)
    assert_close(run(params, carry0, xs0, -1, True), want, exact)  # the same sums, reordered
    wrong = run(params, carry0, xs0, 50)  # step 50's parameter gradient left out
    assert "[1]['u']" in close_or_why(wrong, want, exact)
    assert "[1]['w']" in close_or_why((want[0], {**want[1], "w": wrong[1]["w"]}), want, exact)


@pytest.mark.parametrize(("cell", "steps", "axis", "reverse", "schedule"), kind_matrix())
def test_gradients_match_plain_scan(
    cell: str, steps: int, axis: int, reverse: bool, schedule: Schedule
) -> None:
    """Every kind's examples, w.r.t. closed-over params (flax cells), the initial
    carry and the inputs, against a plain lax.scan (``helpers.kind_matrix``)."""
    want = _loss_and_grads(cell, None, steps, axis=axis, reverse=reverse)
    got = _loss_and_grads(cell, schedule, steps, axis=axis, reverse=reverse)
    assert_close(got, want)


#: T=29 (its last chunk short) checks in the default suite what T=32 (whole chunks) checks
#: under ``-m slow``: every seed off a CPU against the plain scan.
@pytest.mark.parametrize("steps", [29, pytest.param(32, marks=pytest.mark.slow)])
def test_an_accelerators_seeds_match_plain_scan(steps: int) -> None:
    """The seeds off a CPU, the unrolled short chunks among them (``T/4 x 4``, its last
    chunk short at T=29), against a plain lax.scan."""
    from autoremat._search.space import seeds

    want = _loss_and_grads("lstm", None, steps, axis=1)
    found = [schedule for schedule, _ in seeds(steps, "tpu")]
    assert "8x4 nothing/everything unroll=4" in [s.describe() for s in found]
    for schedule in found:
        assert_close(_loss_and_grads("lstm", schedule, steps, axis=1), want)


@pytest.mark.parametrize("policy", ZERO_ARG_POLICIES)
def test_every_zero_argument_policy(policy: str) -> None:
    schedule = autoremat.nested((3, 4), ("nothing_saveable", policy), unroll=2)
    assert_close(_loss_and_grads("lstm", schedule, 29, axis=1),
                  _loss_and_grads("lstm", None, 29, axis=1))


def test_name_policy_with_checkpoint_name() -> None:
    from jax.ad_checkpoint import checkpoint_name

    w = jnp.linspace(-1.0, 1.0, 16).reshape(4, 4)
    xs = jnp.sin(jnp.arange(40.0)).reshape(10, 4)

    def loss(w: jax.Array, schedule: Schedule | None) -> jax.Array:
        def f(c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            z = checkpoint_name(c @ w + x, "gates")
            return jnp.tanh(z), z

        if schedule is None:
            c, ys = lax.scan(f, jnp.ones(4), xs)
        else:
            c, ys = autoremat.scan(f, jnp.ones(4), xs, schedule=schedule)
        return c.sum() + ys.sum()

    schedule = autoremat.nested((2, 5), ("nothing_saveable", {"save_only_these_names": ["gates"]}))
    assert_close(jax.value_and_grad(loss)(w, schedule), jax.value_and_grad(loss)(w, None))


def test_xs_none_with_length() -> None:
    w = jnp.array([[0.9, -0.2], [0.3, 0.8]])

    def loss(w: jax.Array, schedule: Schedule | None) -> jax.Array:
        def f(c: jax.Array, _: None) -> tuple[jax.Array, jax.Array]:
            c = jnp.tanh(c @ w + 0.1)
            return c, c[0]

        if schedule is None:
            c, ys = lax.scan(f, jnp.ones(2), None, length=23)
        else:
            c, ys = autoremat.scan(f, jnp.ones(2), None, length=23, schedule=schedule)
        return c.sum() + jnp.sum(ys * jnp.arange(23.0))

    for lengths in [(23,), (4, 5), (2, 3, 2)]:
        schedule = autoremat.nested(lengths)
        assert_close(jax.value_and_grad(loss)(w, schedule), jax.value_and_grad(loss)(w, None))


@pytest.mark.parametrize(
    "schedule", [autoremat.nested((2, 2, 3)), autoremat.binomial(4), *one_per_kind()], ids=str)
def test_outputs_match_without_grad(schedule: Schedule) -> None:
    """Forward values (carry and stacked outputs) equal lax.scan, pytrees, axis=1."""
    make, params, carry = CELLS["dict"]()
    xs = _inputs("dict", 31, 1)
    f = make(params)
    want_c, want_ys = lax.scan(f, carry, jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), xs))
    got_c, got_ys = autoremat.scan(f, carry, xs, schedule=schedule, axis=1)
    assert_close(got_c, want_c)
    assert_close(got_ys, jax.tree_util.tree_map(lambda y: jnp.swapaxes(y, 0, 1), want_ys))


def _check_any_length_any_levels(steps: int, lengths: list[int], reverse: bool) -> None:
    w = jnp.array([[0.5, -0.4, 0.1], [0.2, 0.6, -0.3], [-0.1, 0.3, 0.7]])
    xs = jnp.cos(jnp.arange(steps * 3, dtype=jnp.float32)).reshape(steps, 3)

    def loss(w: jax.Array, xs: jax.Array, schedule: Schedule | None) -> jax.Array:
        def f(c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            c = jnp.tanh(c @ w + x)
            return c, c * x

        if schedule is None:
            c, ys = lax.scan(f, jnp.ones(3), xs, reverse=reverse)
        else:
            c, ys = autoremat.scan(f, jnp.ones(3), xs, schedule=schedule, reverse=reverse)
        return c.sum() + jnp.sum(ys**2)

    # jitted: one compile per case (op by op, a nested schedule compiles many small pieces)
    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)
    assert_close(grad(w, xs, autoremat.nested(lengths)), grad(w, xs, None))


ANY_LENGTH = {"steps": st.integers(1, 60), "reverse": st.booleans(),
              "lengths": st.lists(st.integers(1, 9), min_size=1, max_size=4)}


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(**ANY_LENGTH)
def test_property_any_length_any_levels(steps: int, lengths: list[int], reverse: bool) -> None:
    _check_any_length_any_levels(steps, lengths, reverse)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(**ANY_LENGTH)
def test_property_any_length_any_levels_many(steps: int, lengths: list[int], reverse: bool) -> None:
    """The same property on 200 cases (``-m slow``)."""
    _check_any_length_any_levels(steps, lengths, reverse)


@settings(derandomize=True, database=None)
@given(steps=st.integers(1, 10_000), lengths=st.lists(st.integers(1, 50), min_size=1, max_size=4))
def test_pieces_cover_every_step_once(steps: int, lengths: list[int]) -> None:
    pieces = _pieces(steps, tuple(lengths))
    position = 0
    for start, count, level in pieces:
        assert start == position
        position += count * math.prod(lengths[level + 1:])
    assert position == steps
    assert len(pieces) <= len(lengths)


def test_bad_arguments_name_the_argument() -> None:
    f = lambda c, x: (c, x)  # noqa: E731
    with pytest.raises(ValueError, match="no values to scan over and `length` not provided"):
        autoremat.scan(f, 0.0, None, schedule=autoremat.nested([2]))
    with pytest.raises(ValueError, match="same size along the scanned axis"):
        autoremat.scan(f, 0.0, (jnp.ones(3), jnp.ones(4)), schedule=autoremat.nested([2]))
    with pytest.raises(ValueError, match="scan got `length` argument of 5 which disagrees"):
        autoremat.scan(f, 0.0, jnp.ones(3), length=5, schedule=autoremat.nested([2]))
    with pytest.raises(autoremat.ScheduleError, match=r"schedule: expected an autoremat\.Schedule"):
        autoremat.scan(f, 0.0, jnp.ones(3), schedule={"levels": [2]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="axis: 2 is out of range"):
        autoremat.scan(f, 0.0, jnp.ones((3, 2)), schedule=autoremat.nested([2]), axis=2)


def test_memory_two_levels_at_1e4_is_under_3_percent_of_plain() -> None:
    problem = seed_lstm(seq_len=10_000, seq2seq=False)
    plain = _temp_bytes(problem, autoremat.plain(10_000))
    nested = _temp_bytes(problem, autoremat.nested([100, 100]))
    assert plain > 500e6  # the linear cost this library exists to remove
    assert nested <= 0.03 * plain, (nested, plain)


def test_memory_three_levels_at_1e5_is_under_10_mb() -> None:
    problem = seed_lstm(seq_len=100_000, seq2seq=False)
    assert _temp_bytes(problem, autoremat.nested([40, 50, 50])) <= 10e6


def test_batch_major_input_is_not_transposed_whole() -> None:
    """axis=1 on (B, T, X) must not allocate a T x B x X copy of the input."""
    problem = seed_lstm(seq_len=20_000, batch=10, hidden=16, input_dim=64, seq2seq=False)
    input_bytes = 10 * 20_000 * 64 * 4
    assert _temp_bytes(problem, autoremat.nested([100, 200])) < 0.25 * input_bytes


def test_a_schedule_file_path_runs_like_the_schedule(tmp_path: Path) -> None:
    """``autoremat.scan`` takes the path of a schedule file, as ``linen.scan``, ``nnx.scan``
    and ``remat_scans`` do; values and gradients equal ``lax.scan``'s."""
    path = autoremat.save_schedule(autoremat.nested([4, 5]), tmp_path / "s.yaml")
    w = jnp.linspace(0.1, 0.9, 3)
    xs = jnp.sin(jnp.arange(60.0).reshape(20, 3))

    def loss(w: jax.Array, run: Any) -> jax.Array:
        carry, ys = run(lambda c, x: (jnp.tanh(c * w + x), jnp.sum(c)), jnp.zeros(3), xs)
        return jnp.sum(carry) + jnp.sum(ys**2)

    want = jax.value_and_grad(loss)(w, lax.scan)
    for schedule in (path, str(path)):
        got = jax.value_and_grad(loss)(
            w, lambda f, c, x, s=schedule: autoremat.scan(f, c, x, schedule=s))
        assert_close(got, want)
    with pytest.raises(autoremat.ScheduleError, match=r"schedule: expected an autoremat\.Schedule"):
        autoremat.scan(lambda c, x: (c, x), 0.0, xs, schedule=3)  # type: ignore[arg-type]
