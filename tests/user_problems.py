"""Problems the tuner has never seen, passed as ``--problem tests/user_problems.py:gru``.

A GRU and a 2-layer LSTM (flax cells), loss on the last hidden state, one SGD
step; small sizes so each compiles in about a second.
"""

from __future__ import annotations

from typing import Any

from autoremat._problem import Problem
from autoremat._schedule import Schedule

SEQ_LEN, BATCH, FEAT, HIDDEN = 64, 4, 8, 16


def _problem(name: str, layers: int, gru: bool) -> Problem:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from autoremat._scan import scan

    cells = [nn.GRUCell(HIDDEN) if gru else nn.OptimizedLSTMCell(HIDDEN) for _ in range(layers)]
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (SEQ_LEN, BATCH, FEAT))
    carry0, params = [], []
    width = FEAT
    for i, cell in enumerate(cells):
        c = cell.initialize_carry(jax.random.fold_in(key, i), (BATCH, width))
        params.append(cell.init(jax.random.fold_in(key, 10 + i), c, jnp.zeros((BATCH, width))))
        carry0.append(c)
        width = HIDDEN

    def build(schedule: Schedule) -> tuple[Any, tuple[Any, ...]]:
        def loss_fn(ps: Any, x: Any) -> jax.Array:
            def step(carry: Any, xt: Any) -> tuple[Any, None]:
                out, h = [], xt
                for cell, p, c in zip(cells, ps, carry, strict=True):
                    c, h = cell.apply(p, c, h)
                    out.append(c)
                return out, None

            carry, _ = scan(step, carry0, x, schedule=schedule)
            h = carry[-1] if gru else carry[-1][1]
            return jnp.mean(h**2)

        def train(ps: Any, x: Any) -> tuple[Any, jax.Array]:
            loss, g = jax.value_and_grad(loss_fn)(ps, x)
            return jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, ps, g), loss

        return train, (params, x)

    return Problem(name=f"{name}(T={SEQ_LEN},H={HIDDEN})", seq_len=SEQ_LEN, build=build)


def gru() -> Problem:
    return _problem("gru", 1, gru=True)


def lstm2() -> Problem:
    return _problem("lstm2", 2, gru=False)
