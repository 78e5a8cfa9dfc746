"""autoremat.scan against the reference: a plain lax.scan (float32, rtol 1e-5)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import autoremat
from autoremat import Schedule
from autoremat._problem import seed_lstm
from autoremat._schedule import ZERO_ARG_POLICIES
from autoremat._schedule import pieces as _pieces

RTOL = 1e-5
ATOL = 1e-6
BATCH, FEAT, HID = 3, 5, 6


def _flax_cell(cell: nn.Module) -> tuple[Callable[..., Any], Any, Any]:
    """A flax RNN cell as a pure step ``f(params)(carry, x)``, its params, carry."""
    key = jax.random.PRNGKey(0)
    carry = cell.initialize_carry(key, (BATCH, FEAT))
    params = cell.init(key, carry, jnp.zeros((BATCH, FEAT)))["params"]

    def make(p: Any) -> Callable[..., Any]:
        return lambda c, x: cell.apply({"params": p}, c, x)

    return make, params, carry


def _dict_cell() -> tuple[Callable[..., Any], Any, Any]:
    """Pure JAX: dict carry, a tuple of inputs, a tuple of outputs."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(1))
    params = {
        "w": jax.random.normal(k1, (HID, HID)) * 0.3,
        "u": jax.random.normal(k2, (FEAT, HID)) * 0.3,
    }
    carry = {"h": jnp.zeros((BATCH, HID)), "n": jnp.zeros((BATCH,))}

    def make(p: Any) -> Callable[..., Any]:
        def f(c: Any, x: Any) -> Any:
            a, b = x
            h = jnp.tanh(c["h"] @ p["w"] + a @ p["u"]) * (1.0 + 0.1 * jnp.sin(b)[:, None])
            return {"h": h, "n": c["n"] + h.mean(-1)}, (h, h.sum(-1))

        return f

    return make, params, carry


CELLS: dict[str, Callable[[], tuple[Callable[..., Any], Any, Any]]] = {
    "lstm": lambda: _flax_cell(nn.OptimizedLSTMCell(HID)),
    "gru": lambda: _flax_cell(nn.GRUCell(HID)),
    "dict": _dict_cell,
}


def _inputs(cell: str, steps: int, axis: int) -> Any:
    key = jax.random.PRNGKey(steps)
    shape = (steps, BATCH, FEAT) if axis == 0 else (BATCH, steps, FEAT)
    a = jax.random.normal(key, shape)
    if cell == "dict":
        return (a, jax.random.normal(jax.random.fold_in(key, 1), shape[:2]))
    return a


def _loss_and_grads(
    cell: str, schedule: Schedule | None, steps: int, *, axis: int = 0, reverse: bool = False
) -> Any:
    """value_and_grad w.r.t. params, initial carry and inputs; None = plain lax.scan."""
    make, params, carry = CELLS[cell]()
    xs = _inputs(cell, steps, axis)

    def loss(p: Any, c0: Any, xs: Any) -> jax.Array:
        f = make(p)
        if schedule is None:
            moved = jax.tree_util.tree_map(lambda x: jnp.moveaxis(x, axis, 0), xs)
            c, ys = lax.scan(f, c0, moved, reverse=reverse)
            ys = jax.tree_util.tree_map(lambda y: jnp.moveaxis(y, 0, axis), ys)
        else:
            c, ys = autoremat.scan(f, c0, xs, schedule=schedule, reverse=reverse, axis=axis)
        weights = jnp.cos(jnp.arange(steps, dtype=jnp.float32))
        y = ys[0] if isinstance(ys, tuple) else ys
        y = jnp.moveaxis(y, axis, 0)
        return sum(jnp.sum(v**2) for v in jax.tree_util.tree_leaves(c)) + jnp.sum(
            weights[:, None, None] * y
        )

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(params, carry, xs)


def _assert_close(got: Any, want: Any) -> None:
    """Elementwise rtol 1e-5, with atol 1e-5 of the array's largest magnitude.

    Parameter gradients are sums over T steps; a nested scan adds them chunk by
    chunk, so float32 reassociation moves tiny entries by ~1e-6 absolute. The
    scale-relative atol accepts exactly that and nothing larger.
    """
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves, strict=True):
        w = np.asarray(w)
        scale = float(np.max(np.abs(w))) if w.size else 0.0
        np.testing.assert_allclose(np.asarray(g), w, rtol=RTOL, atol=max(ATOL, RTOL * scale))


# (cell, T, lengths, policy, axis, reverse): every cell, every T in the issue,
# 1-4 levels, both axes, both directions, covered without the full product.
CASES = [
    ("lstm", 1, (4, 4), "nothing_saveable", 0, False),
    ("lstm", 7, (2, 3), "nothing_saveable", 1, False),
    ("lstm", 97, (10, 10), "dots_saveable", 1, True),
    ("lstm", 1000, (10, 10, 10), "nothing_saveable", 1, False),
    ("lstm", 1009, (10, 10, 10), "nothing_saveable", 0, True),
    ("lstm", 97, (2, 2, 3, 4), "dots_with_no_batch_dims_saveable", 0, False),
    ("gru", 1, (1,), "nothing_saveable", 1, True),
    ("gru", 7, (7,), "everything_saveable", 0, False),
    ("gru", 97, (4, 5, 6), "nothing_saveable", 1, False),
    ("gru", 1009, (30, 30), "nothing_saveable", 1, True),
    ("dict", 1, (3,), "none", 0, False),
    ("dict", 7, (3, 2), "nothing_saveable", 0, True),
    ("dict", 97, (3, 4, 5, 2), "nothing_saveable", 1, True),
    ("dict", 1000, (25, 40), "dots_saveable", 0, False),
    ("dict", 1009, (2, 5, 10, 10), "nothing_saveable", 1, False),
]


@pytest.mark.parametrize(("cell", "steps", "lengths", "policy", "axis", "reverse"), CASES)
def test_gradients_match_plain_scan(
    cell: str, steps: int, lengths: tuple[int, ...], policy: str, axis: int, reverse: bool
) -> None:
    schedule = Schedule.nested(lengths, policy)
    want = _loss_and_grads(cell, None, steps, axis=axis, reverse=reverse)
    got = _loss_and_grads(cell, schedule, steps, axis=axis, reverse=reverse)
    _assert_close(got, want)


@pytest.mark.parametrize("policy", ZERO_ARG_POLICIES)
def test_every_zero_argument_policy(policy: str) -> None:
    schedule = Schedule.nested((3, 4), ("nothing_saveable", policy), unroll=2)
    _assert_close(_loss_and_grads("lstm", schedule, 29, axis=1),
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

    schedule = Schedule.nested((2, 5), ("nothing_saveable", {"save_only_these_names": ["gates"]}))
    _assert_close(jax.value_and_grad(loss)(w, schedule), jax.value_and_grad(loss)(w, None))


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
        schedule = Schedule.nested(lengths)
        _assert_close(jax.value_and_grad(loss)(w, schedule), jax.value_and_grad(loss)(w, None))


def test_outputs_match_without_grad() -> None:
    """Forward values (carry and stacked outputs) equal lax.scan, axis=1."""
    make, params, carry = CELLS["dict"]()
    xs = _inputs("dict", 31, 1)
    f = make(params)
    want_c, want_ys = lax.scan(f, carry, jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), xs))
    got_c, got_ys = autoremat.scan(f, carry, xs, schedule=Schedule.nested((2, 2, 3)), axis=1)
    _assert_close(got_c, want_c)
    _assert_close(got_ys, jax.tree_util.tree_map(lambda y: jnp.swapaxes(y, 0, 1), want_ys))


@settings(max_examples=20, deadline=None)
@given(
    steps=st.integers(1, 60),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    reverse=st.booleans(),
)
def test_property_any_length_any_levels(steps: int, lengths: list[int], reverse: bool) -> None:
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

    grad = jax.value_and_grad(loss, argnums=(0, 1))
    _assert_close(grad(w, xs, Schedule.nested(lengths)), grad(w, xs, None))


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
    with pytest.raises(ValueError, match="length: must be given"):
        autoremat.scan(f, 0.0, None, schedule=Schedule.nested([2]))
    with pytest.raises(ValueError, match="same size along the scanned axis"):
        autoremat.scan(f, 0.0, (jnp.ones(3), jnp.ones(4)), schedule=Schedule.nested([2]))
    with pytest.raises(ValueError, match="length: 5 does not match"):
        autoremat.scan(f, 0.0, jnp.ones(3), length=5, schedule=Schedule.nested([2]))
    with pytest.raises(autoremat.ScheduleError, match=r"schedule: expected an autoremat\.Schedule"):
        autoremat.scan(f, 0.0, jnp.ones(3), schedule={"levels": [2]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="axis: 2 is out of range"):
        autoremat.scan(f, 0.0, jnp.ones((3, 2)), schedule=Schedule.nested([2]), axis=2)


def _temp_bytes(problem: Any, schedule: Schedule) -> int:
    step, args = problem.build(schedule)
    analysis = jax.jit(step).lower(*args).compile().memory_analysis()
    return int(analysis.temp_size_in_bytes)


def test_memory_two_levels_at_1e4_is_under_3_percent_of_plain() -> None:
    problem = seed_lstm(seq_len=10_000, seq2seq=False)
    plain = _temp_bytes(problem, Schedule.plain(10_000))
    nested = _temp_bytes(problem, Schedule.nested([100, 100]))
    assert plain > 500e6  # the linear cost this library exists to remove
    assert nested <= 0.03 * plain, (nested, plain)


def test_memory_three_levels_at_1e5_is_under_10_mb() -> None:
    problem = seed_lstm(seq_len=100_000, seq2seq=False)
    assert _temp_bytes(problem, Schedule.nested([40, 50, 50])) <= 10e6


def test_batch_major_input_is_not_transposed_whole() -> None:
    """axis=1 on (B, T, X) must not allocate a T x B x X copy of the input."""
    problem = seed_lstm(seq_len=20_000, batch=10, hidden=16, input_dim=64, seq2seq=False)
    input_bytes = 10 * 20_000 * 64 * 4
    assert _temp_bytes(problem, Schedule.nested([100, 200])) < 0.25 * input_bytes
