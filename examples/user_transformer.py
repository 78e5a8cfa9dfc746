"""A user's own transformer, written the usual Flax way, tuned without a change.

``Decoder`` below scans its ``Block`` over the layers with ``nn.scan`` (parameters
stacked per layer), as Flax's and MaxText's examples do, and tags its matmul outputs
with ``checkpoint_name`` under MaxText's names (``query_proj``, ``mlpwi``, ...).
``problem`` is all autoremat needs: ``autoremat.linen.problem`` runs the layer scan
under each trial's schedule (``autoremat.remat_scans``; ``min_length`` = the layer
count, so the 256-token attention inside is left alone), and the search finds the
tags in the traced step: MaxText's presets over them are tried first, then what each
tag costs decides the rest (``docs/layer_stacks.md``). ``untagged`` is the same model
without tags: the dots policies and remat of each layer are its presets. ``--nearest``:
where the format cannot write the pick, export the nearest measured trial it can::

    autoremat tune --problem examples/user_transformer.py:problem --budget 1GB
    autoremat pareto                       # the measured front, what each tag costs
    autoremat export --format maxtext --nearest   # the pick as MaxText's remat_policy: custom
    autoremat export --format flax --nearest      # ... or as nn.remat / nnx.remat's policy
    autoremat tune --problem examples/user_transformer.py:untagged --budget 1GB

Sizes from ``USER_LAYERS``, ``USER_D_MODEL``, ``USER_HEADS``, ``USER_MLP``,
``USER_SEQ_LEN``, ``USER_BATCH`` (default 8 layers of d_model 256, 4 heads, MLP 1024,
256 tokens, batch 8: seconds a step on a CPU).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

import autoremat
import autoremat.linen

LAYERS = int(os.environ.get("USER_LAYERS", 8))
D_MODEL = int(os.environ.get("USER_D_MODEL", 256))
HEADS = int(os.environ.get("USER_HEADS", 4))
MLP = int(os.environ.get("USER_MLP", 1024))
SEQ_LEN = int(os.environ.get("USER_SEQ_LEN", 256))
BATCH = int(os.environ.get("USER_BATCH", 8))
VOCAB = 512


class Block(nn.Module):
    """Pre-norm causal self-attention and an MLP, residual; its matmuls tagged."""

    d_model: int
    heads: int
    mlp: int
    tagged: bool = True

    def tag(self, value: jax.Array, name: str) -> jax.Array:
        return checkpoint_name(value, name) if self.tagged else value

    @nn.compact
    def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
        head_dim = self.d_model // self.heads
        h = nn.LayerNorm()(x)
        q, k, v = (self.tag(nn.DenseGeneral((self.heads, head_dim), name=n)(h), tag)
                   for n, tag in (("query", "query_proj"), ("key", "key_proj"),
                                  ("value", "value_proj")))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(head_dim)
        causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        attended = self.tag(jnp.einsum("bhqk,bkhd->bqhd", weights, v), "attention_out")
        x = x + self.tag(nn.DenseGeneral(self.d_model, axis=(-2, -1), name="out")(attended),
                         "out_proj")
        h = nn.gelu(self.tag(nn.Dense(self.mlp, name="wi")(nn.LayerNorm()(x)), "mlpwi"))
        return x + self.tag(nn.Dense(self.d_model, name="wo")(h), "mlpwo"), None


class Decoder(nn.Module):
    """Token embedding, ``layers`` blocks in one ``nn.scan``, a readout to the vocabulary."""

    layers: int
    d_model: int
    heads: int
    mlp: int
    tagged: bool = True

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(VOCAB, self.d_model)(tokens)
        stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                        length=self.layers)
        x, _ = stack(self.d_model, self.heads, self.mlp, self.tagged, name="layers")(x, None)
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


def next_token_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Cross-entropy of each position's prediction of the next token."""
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


def problem(tagged: bool = True) -> autoremat.Problem:
    """The model's training step (next-token cross-entropy, Adam 1e-3) for ``autoremat tune``."""
    model = Decoder(LAYERS, D_MODEL, HEADS, MLP, tagged)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (BATCH, SEQ_LEN), 0, VOCAB)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)["params"]
    name = f"user_transformer(L={LAYERS},d={D_MODEL},S={SEQ_LEN}{'' if tagged else ',untagged'})"
    return autoremat.linen.problem(name, model, params, (tokens, tokens), optax.adam(1e-3),
                                   loss=next_token_loss, min_length=LAYERS)


def untagged() -> autoremat.Problem:
    """The same model with no ``checkpoint_name`` tags."""
    return problem(tagged=False)


if __name__ == "__main__":
    import sys

    budget = autoremat.parse_bytes(sys.argv[1] if len(sys.argv) > 1 else "1GB")
    result = autoremat.tune(problem(), budget, out="user_transformer.yaml")
    print(result.best.describe() if result.best else "nothing fits")
