"""autoremat.linen.RNN against flax.linen.RNN (float32, rtol 1e-5), alone and in Bidirectional.

Parameters initialised by one load into the other (same tree); outputs, final
carries and gradients w.r.t. parameters and inputs must agree, for nested
(with a remainder) and binomial schedules, with padded batches
(``seq_lengths``) and ``reverse=True, keep_order=True``.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

import autoremat
import autoremat.linen
from autoremat import Schedule
from tests.helpers import assert_close

B, T, FEAT, HID = 2, 23, 3, 8
KINDS = pytest.mark.parametrize(
    "schedule", [autoremat.nested([4, 5]), autoremat.binomial(3)], ids=["nested", "binomial"])




def outputs_and_grads(model: nn.Module, x: jax.Array, **call: Any) -> tuple[Any, Any, Any]:
    """Params tree, the output, and gradients of a fixed projection of every output leaf."""
    params = model.init(jax.random.key(0), x, **call)

    def loss(p: Any, x: jax.Array) -> tuple[jax.Array, Any]:
        out = model.apply(p, x, **call)
        total = sum(jnp.sum(leaf * jnp.cos(jnp.arange(leaf.size).reshape(leaf.shape)))
                    for leaf in jax.tree_util.tree_leaves(out))
        return total, out

    grads, out = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x)
    return params, out, grads


_REFERENCES: dict[str, Any] = {}


def reference(key: str, model: nn.Module, x: jax.Array, **call: Any) -> Any:
    """``outputs_and_grads`` of an original, once per configuration."""
    if key not in _REFERENCES:
        _REFERENCES[key] = outputs_and_grads(model, x, **call)
    return _REFERENCES[key]


def data(time_major: bool = False) -> jax.Array:
    shape = (T, B, FEAT) if time_major else (B, T, FEAT)
    return jax.random.normal(jax.random.key(1), shape, jnp.float32)


@KINDS
@pytest.mark.parametrize("options", [
    {"reverse": True, "keep_order": True},
    {"seq_lengths": True, "return_carry": True},
    {"seq_lengths": True, "reverse": True, "keep_order": True, "return_carry": True},
    {"time_major": True, "return_carry": True, "unroll": 2},
], ids=["reverse-keep-order", "seq-lengths", "padded-reverse", "time-major-unroll"])
def test_rnn_matches_nn_rnn(schedule: Schedule, options: dict[str, Any]) -> None:
    options = dict(options)
    call = {"seq_lengths": jnp.array([T, 9])} if options.pop("seq_lengths", False) else {}
    x = data(options.get("time_major", False))
    cell = nn.OptimizedLSTMCell(HID)
    ours = outputs_and_grads(autoremat.linen.RNN(cell, schedule=schedule, **options), x, **call)
    assert_close(ours, reference(f"{sorted(options.items())}-{bool(call)}",
                                 nn.RNN(cell, **options), x, **call))


@KINDS
def test_bidirectional_on_autoremat_rnns(schedule: Schedule) -> None:
    x, call = data(), {"seq_lengths": jnp.array([T, 11])}

    def bidirectional(rnn: Any) -> nn.Module:
        return nn.Bidirectional(rnn(nn.GRUCell(HID)), rnn(nn.GRUCell(HID)), return_carry=True)

    ours = bidirectional(lambda c: autoremat.linen.RNN(c, schedule=schedule))
    assert_close(outputs_and_grads(ours, x, **call),
                 reference("bidirectional", bidirectional(nn.RNN), x, **call))


def test_schedule_is_required_and_checked() -> None:
    x = data()
    with pytest.raises(TypeError, match="missing the schedule= argument"):
        autoremat.linen.RNN(nn.GRUCell(HID)).init(jax.random.key(0), x)
    with pytest.raises(autoremat.ScheduleError, match="schedule: expected"):
        autoremat.linen.RNN(nn.GRUCell(HID), schedule=3).init(jax.random.key(0), x)
