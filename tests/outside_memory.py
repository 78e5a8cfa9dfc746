"""A model whose memory lives outside its scans, for the tests of what autoremat says.

The shape of a hybrid recurrent language model: blocks of a gated linear recurrence
(``vmap`` of a ``lax.scan`` written with its own ``unroll=8``, a carry of ``D`` floats),
then dense causal attention over the sequence and a wide MLP. The recurrence's residuals
are a few ``(B, T, D)`` arrays; the attention's ``(B, T, T)`` and the MLP's ``(B, T,
WIDE)`` are not the scans' and no schedule of them removes these (attention mixes the
time steps, so nothing after it moves into a scan's step): scheduling saves a few
percent of the step at most.
``hybrid_problem`` is ``Problem.from_loss`` of it, ``--problem
tests/outside_memory.py:hybrid_problem`` on the command line; ``associative_loss`` is
the same recurrence as a ``lax.associative_scan`` (no scan to schedule).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax

import autoremat

T, B, D, WIDE, BLOCKS, UNROLL = 128, 2, 8, 64, 2, 8


def init(key: jax.Array) -> dict[str, Any]:
    keys = jax.random.split(key, 3 * BLOCKS)
    return {f"block{i}": {"gate": jnp.zeros(D),
                          "w_in": jax.random.normal(keys[3 * i], (D, D)) * 0.3,
                          "up": jax.random.normal(keys[3 * i + 1], (D, WIDE)) * 0.3,
                          "down": jax.random.normal(keys[3 * i + 2], (WIDE, D)) * 0.1}
            for i in range(BLOCKS)}


def _recurrence(decay: jax.Array, u: jax.Array) -> jax.Array:
    """``h_t = decay * h_{t-1} + u_t`` over one sequence ``u`` (T, D)."""
    def step(h: jax.Array, ut: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = decay * h + ut
        return h, h

    return lax.scan(step, jnp.zeros(D), u, unroll=UNROLL)[1]


def _associative(decay: jax.Array, u: jax.Array) -> jax.Array:
    """The same recurrence as a parallel prefix (no sequential loop)."""
    def combine(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]
                ) -> tuple[jax.Array, jax.Array]:
        return a[0] * b[0], b[0] * a[1] + b[1]

    return lax.associative_scan(combine, (jnp.broadcast_to(decay, u.shape), u))[1]


def _forward(params: dict[str, Any], x: jax.Array, recurrence: Any) -> jax.Array:
    for i in range(BLOCKS):
        p = params[f"block{i}"]
        decay = jax.nn.sigmoid(p["gate"])
        x = x + jax.vmap(lambda u, d=decay: recurrence(d, u))(x @ p["w_in"])
        scores = jnp.einsum("btd,bsd->bts", x, x) / jnp.sqrt(D)
        causal = jnp.tril(jnp.ones((T, T), bool))
        x = x + jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1) @ x
        x = x + jax.nn.gelu(x @ p["up"]) @ p["down"]
    return x


def loss(params: dict[str, Any], x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((_forward(params, x, _recurrence) - y) ** 2)


def associative_loss(params: dict[str, Any], x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((_forward(params, x, _associative) - y) ** 2)


def batch() -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, D))
    return x, jnp.roll(x, 1, axis=1)


def hybrid_problem() -> autoremat.Problem:
    return autoremat.Problem.from_loss("hybrid", loss, init(jax.random.PRNGKey(0)), batch(),
                                       optax.sgd(1e-2))
