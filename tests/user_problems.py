"""Problems the tuner has never seen, passed as ``--problem tests/user_problems.py:gru``.

A GRU and a 2-layer LSTM (flax cells), loss on the last hidden state, one SGD
step; small sizes by default so each compiles in about a second (the slow
benchmark in ``test_search`` passes larger ones).
"""

from __future__ import annotations

from typing import Any

from autoremat._measure.problem import Problem
from autoremat._schedules.base import Schedule

SEQ_LEN, BATCH, FEAT, HIDDEN = 64, 4, 8, 16


def _problem(name: str, layers: int, gru: bool, seq_len: int, batch: int, hidden: int) -> Problem:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from autoremat._scan.scan import scan

    cells = [nn.GRUCell(hidden) if gru else nn.OptimizedLSTMCell(hidden) for _ in range(layers)]
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (seq_len, batch, FEAT))
    carry0, params = [], []
    width = FEAT
    for i, cell in enumerate(cells):
        c = cell.initialize_carry(jax.random.fold_in(key, i), (batch, width))
        params.append(cell.init(jax.random.fold_in(key, 10 + i), c, jnp.zeros((batch, width))))
        carry0.append(c)
        width = hidden

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

    return Problem(name=f"{name}(T={seq_len},B={batch},H={hidden})", seq_len=seq_len, build=build)


def gru(seq_len: int = SEQ_LEN, batch: int = BATCH, hidden: int = HIDDEN) -> Problem:
    return _problem("gru", 1, True, seq_len, batch, hidden)


def gru_long() -> Problem:
    """The GRU at T=160: past ``SHORT_SCAN`` (128), so the search draws from the space
    instead of listing every structure of a short scan (and its groups of layers)."""
    return gru(seq_len=160)


def lstm2(seq_len: int = SEQ_LEN, batch: int = BATCH, hidden: int = HIDDEN) -> Problem:
    return _problem("lstm2", 2, False, seq_len, batch, hidden)
