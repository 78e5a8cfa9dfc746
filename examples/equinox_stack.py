"""An equinox layer stack, written the usual equinox way, tuned without a change.

``Stack`` makes its blocks (``Block``) with ``eqx.filter_vmap`` (each array stacked over the
layers) and runs them with ``lax.scan`` over the stacked arrays: ``eqx.partition``
splits the blocks into those arrays and the rest, and each step puts one layer back
together with ``eqx.combine``. Each block tags its own activations with
``checkpoint_name`` (``attn_qkv``, ``attn_mix``, ``attn_out``, ``ffn_up``,
``ffn_down``). ``problem`` hands the loss of the model's arrays
(``eqx.partition(model, eqx.is_inexact_array)``) to ``autoremat.Problem.from_loss``
with ``min_length`` = the layer count: the model is left as written and its layer
scan runs under each trial's schedule (``autoremat.remat_scans``)::

    autoremat tune --problem examples/equinox_stack.py:problem --budget 1GB --out equinox_stack.yaml
    autoremat show equinox_stack.yaml
    autoremat pareto                 # the study's front: memory against step time

Running a tuned schedule: ``autoremat.remat_scans(loss_fn, schedule,
min_length=LAYERS)`` around the loss, or ``Stack(..., schedule=schedule)``, which
swaps ``lax.scan`` for the drop-in ``autoremat.scan``. Needs equinox (the ``test``
and ``bench`` extras). Sizes from ``EQX_STACK_LAYERS``, ``EQX_STACK_D_MODEL``,
``EQX_STACK_HEADS``, ``EQX_STACK_MLP``, ``EQX_STACK_SEQ_LEN``, ``EQX_STACK_BATCH``
(default 8 layers of d_model 128, 4 heads, MLP 512, 128 tokens, batch 4).
"""

from __future__ import annotations

import os
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.ad_checkpoint import checkpoint_name

import autoremat

LAYERS = int(os.environ.get("EQX_STACK_LAYERS", 8))
D_MODEL = int(os.environ.get("EQX_STACK_D_MODEL", 128))
HEADS = int(os.environ.get("EQX_STACK_HEADS", 4))
MLP = int(os.environ.get("EQX_STACK_MLP", 512))
SEQ_LEN = int(os.environ.get("EQX_STACK_SEQ_LEN", 128))
BATCH = int(os.environ.get("EQX_STACK_BATCH", 4))
VOCAB = 256
#: The tags each block gives its activations.
NAMES = ("attn_qkv", "attn_mix", "attn_out", "ffn_up", "ffn_down")


def _tokens(layer: eqx.Module, x: jax.Array) -> jax.Array:
    """``layer`` (one token's) on every token of ``x`` (``(S, D)``)."""
    return jax.vmap(layer)(x)


class Block(eqx.Module):
    """Pre-norm causal self-attention and an MLP on one sequence (``(S, D)``), residual."""

    norm1: eqx.nn.LayerNorm
    qkv: eqx.nn.Linear
    out: eqx.nn.Linear
    norm2: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear
    heads: int = eqx.field(static=True)

    def __init__(self, d_model: int, heads: int, mlp: int, key: jax.Array) -> None:
        k = jax.random.split(key, 4)
        self.heads = heads
        self.norm1, self.norm2 = eqx.nn.LayerNorm(d_model), eqx.nn.LayerNorm(d_model)
        self.qkv = eqx.nn.Linear(d_model, 3 * d_model, key=k[0])
        self.out = eqx.nn.Linear(d_model, d_model, key=k[1])
        self.up = eqx.nn.Linear(d_model, mlp, key=k[2])
        self.down = eqx.nn.Linear(mlp, d_model, key=k[3])

    def __call__(self, x: jax.Array) -> jax.Array:
        s, d = x.shape
        qkv = checkpoint_name(_tokens(self.qkv, _tokens(self.norm1, x)), "attn_qkv")
        q, k, v = (qkv.reshape(s, 3, self.heads, d // self.heads)[:, i] for i in range(3))
        scores = jnp.einsum("qhd,khd->hqk", q, k) / jnp.sqrt(d // self.heads)
        causal = jnp.tril(jnp.ones((s, s), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        mixed = checkpoint_name(jnp.einsum("hqk,khd->qhd", weights, v), "attn_mix")
        x = x + checkpoint_name(_tokens(self.out, mixed.reshape(s, d)), "attn_out")
        h = checkpoint_name(_tokens(self.up, _tokens(self.norm2, x)), "ffn_up")
        return x + checkpoint_name(_tokens(self.down, jax.nn.gelu(h)), "ffn_down")


class Stack(eqx.Module):
    """Token embedding, ``layers`` blocks made by ``eqx.filter_vmap`` and run by
    ``lax.scan`` over their stacked arrays, a readout; on one sequence of tokens.
    ``schedule``: ``None`` runs ``lax.scan`` as written; a schedule runs the drop-in
    ``autoremat.scan`` under it (the same loss and gradients)."""

    embed: eqx.nn.Embedding
    blocks: Block
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear
    schedule: autoremat.Schedule | None = eqx.field(static=True)

    def __init__(self, layers: int = LAYERS, d_model: int = D_MODEL, heads: int = HEADS,
                 mlp: int = MLP, *, seed: int = 0,
                 schedule: autoremat.Schedule | None = None) -> None:
        k = jax.random.split(jax.random.key(seed), 3)
        self.embed = eqx.nn.Embedding(VOCAB, d_model, key=k[0])
        make = eqx.filter_vmap(lambda key: Block(d_model, heads, mlp, key))
        self.blocks = make(jax.random.split(k[1], layers))
        self.norm = eqx.nn.LayerNorm(d_model)
        self.head = eqx.nn.Linear(d_model, VOCAB, key=k[2])
        self.schedule = schedule

    def __call__(self, tokens: jax.Array) -> jax.Array:
        arrays, rest = eqx.partition(self.blocks, eqx.is_array)

        def layer(x: jax.Array, one: Any) -> tuple[jax.Array, None]:
            return eqx.combine(one, rest)(x), None

        x = _tokens(self.embed, tokens)
        if self.schedule is None:
            x, _ = lax.scan(layer, x, arrays)
        else:
            x, _ = autoremat.scan(layer, x, arrays, schedule=self.schedule)
        return _tokens(self.head, _tokens(self.norm, x))


def split(model: Stack) -> tuple[Any, Any]:
    """``(params, static)``: the arrays trained, and the rest (``eqx.combine`` joins them)."""
    return eqx.partition(model, eqx.is_inexact_array)


def make_loss(static: Any) -> Any:
    """``loss_fn(params, tokens)``: mean next-token cross-entropy of the model
    ``eqx.combine(params, static)`` over a batch of sequences."""

    def loss_fn(params: Any, tokens: jax.Array) -> jax.Array:
        logits = jax.vmap(eqx.combine(params, static))(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(
            logits[:, :-1], tokens[:, 1:]).mean()

    return loss_fn


def tokens(batch: int = BATCH, seq_len: int = SEQ_LEN) -> jax.Array:
    return jax.random.randint(jax.random.key(1), (batch, seq_len), 0, VOCAB)


def problem() -> autoremat.Problem:
    """The stack's training step (next-token cross-entropy, Adam 1e-3) for ``autoremat tune``."""
    params, static = split(Stack())
    return autoremat.Problem.from_loss(
        f"equinox_stack(L={LAYERS},d={D_MODEL},S={SEQ_LEN})", make_loss(static), params,
        (tokens(),), optax.adam(1e-3), min_length=LAYERS)


if __name__ == "__main__":
    import sys

    budget = autoremat.parse_bytes(sys.argv[1] if len(sys.argv) > 1 else "1GB")
    result = autoremat.tune(problem(), budget, out="equinox_stack.yaml")
    print(result.best.describe() if result.best else "nothing fits")
