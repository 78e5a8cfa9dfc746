"""A tiny tanh-RNN training step (compiles in well under a second) for tests.

Used by the tune/pareto/CLI tests, in-process and as ``--problem
tests/tiny_problem.py:tiny``. Plain scan at T=32: about 2.6 KB total.
"""

from __future__ import annotations

from typing import Any

import autoremat
from autoremat._measure.problem import Problem
from autoremat._schedules.base import Schedule


def tiny(seq_len: int = 32, hidden: int = 4, nan_for_plain: bool = False) -> Problem:
    """``h = tanh(h @ w + x_t)``, loss ``sum(h_T^2)``, one SGD step.

    With ``nan_for_plain`` the plain scan's loss is NaN (to test failures).
    """
    import jax
    import jax.numpy as jnp

    from autoremat._scan.scan import scan

    key = jax.random.PRNGKey(0)
    w = jax.random.normal(key, (hidden, hidden)) * 0.3
    x = jax.random.normal(jax.random.PRNGKey(1), (seq_len, hidden))

    def build(schedule: Schedule) -> tuple[Any, tuple[Any, ...]]:
        poison = nan_for_plain and schedule.key() == autoremat.plain(seq_len).key()

        def loss_fn(w: jax.Array, x: jax.Array) -> jax.Array:
            def f(h: jax.Array, xt: jax.Array) -> tuple[jax.Array, None]:
                return jnp.tanh(h @ w + xt), None

            h, _ = scan(f, jnp.zeros(hidden), x, schedule=schedule)
            loss = jnp.sum(h**2)
            return loss * jnp.nan if poison else loss

        def step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            loss, g = jax.value_and_grad(loss_fn)(w, x)
            return w - 0.1 * g, loss

        return step, (w, x)

    name = f"tiny(T={seq_len},H={hidden}{',nan' if nan_for_plain else ''})"
    return Problem(name=name, seq_len=seq_len, build=build)
