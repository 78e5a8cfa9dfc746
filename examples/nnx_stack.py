"""A Flax NNX layer stack, written the usual NNX way, tuned without a change.

``Stack`` makes its blocks (``Block``) with ``nnx.vmap`` (each parameter stacked over the
layers) and runs them with ``nnx.scan`` over that layer axis, as Flax's "scan over
layers" guide does. Each block tags its own activations with ``checkpoint_name``
under its own names (``attn_qkv``, ``attn_mix``, ``attn_out``, ``ffn_up``,
``ffn_down``). ``problem`` hands it to ``autoremat.nnx.problem`` with ``min_length`` =
the layer count: the model is left as written and its layer scan runs under each
trial's schedule (``autoremat.nnx.remat_scans``); the search finds the tags in the
traced step (``docs/layer_stacks.md``)::

    autoremat tune --problem examples/nnx_stack.py:problem --budget 1GB --out nnx_stack.yaml
    autoremat show nnx_stack.yaml
    autoremat pareto                 # the study's front: memory against step time

Running a tuned schedule: ``autoremat.nnx.remat_scans(loss_fn, schedule,
min_length=LAYERS)`` around the loss (the model untouched), or ``Stack(...,
schedule=schedule)``, which swaps ``nnx.scan`` for the drop-in ``autoremat.nnx.scan``.
Sizes from ``NNX_STACK_LAYERS``, ``NNX_STACK_D_MODEL``, ``NNX_STACK_HEADS``,
``NNX_STACK_MLP``, ``NNX_STACK_SEQ_LEN``, ``NNX_STACK_BATCH`` (default 8 layers of
d_model 128, 4 heads, MLP 512, 128 tokens, batch 4).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

import autoremat
import autoremat.nnx

LAYERS = int(os.environ.get("NNX_STACK_LAYERS", 8))
D_MODEL = int(os.environ.get("NNX_STACK_D_MODEL", 128))
HEADS = int(os.environ.get("NNX_STACK_HEADS", 4))
MLP = int(os.environ.get("NNX_STACK_MLP", 512))
SEQ_LEN = int(os.environ.get("NNX_STACK_SEQ_LEN", 128))
BATCH = int(os.environ.get("NNX_STACK_BATCH", 4))
VOCAB = 256
#: The tags each block gives its activations.
NAMES = ("attn_qkv", "attn_mix", "attn_out", "ffn_up", "ffn_down")


class Block(nnx.Module):
    """Pre-norm causal self-attention and an MLP, residual; its matmul outputs tagged."""

    def __init__(self, d_model: int, heads: int, mlp: int, *, rngs: nnx.Rngs) -> None:
        self.heads = heads
        self.norm1 = nnx.LayerNorm(d_model, rngs=rngs)
        self.qkv = nnx.Linear(d_model, 3 * d_model, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, rngs=rngs)
        self.norm2 = nnx.LayerNorm(d_model, rngs=rngs)
        self.up = nnx.Linear(d_model, mlp, rngs=rngs)
        self.down = nnx.Linear(mlp, d_model, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, s, d = x.shape
        qkv = checkpoint_name(self.qkv(self.norm1(x)), "attn_qkv")
        q, k, v = (qkv.reshape(b, s, 3, self.heads, d // self.heads)[:, :, i] for i in range(3))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // self.heads)
        causal = jnp.tril(jnp.ones((s, s), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        mixed = checkpoint_name(jnp.einsum("bhqk,bkhd->bqhd", weights, v), "attn_mix")
        x = x + checkpoint_name(self.out(mixed.reshape(b, s, d)), "attn_out")
        h = checkpoint_name(self.up(self.norm2(x)), "ffn_up")
        return x + checkpoint_name(self.down(jax.nn.gelu(h)), "ffn_down")


def _layer(x: jax.Array, block: Block) -> jax.Array:
    return block(x)


class Stack(nnx.Module):
    """Token embedding, ``layers`` blocks made by ``nnx.vmap`` and run by ``nnx.scan``,
    a readout. ``schedule``: ``None`` runs ``nnx.scan`` as written; a schedule runs the
    drop-in ``autoremat.nnx.scan`` under it (the same parameters, loss and gradients)."""

    def __init__(self, layers: int = LAYERS, d_model: int = D_MODEL, heads: int = HEADS,
                 mlp: int = MLP, *, seed: int = 0,
                 schedule: autoremat.Schedule | None = None) -> None:
        rngs = nnx.Rngs(seed)
        self.embed = nnx.Embed(VOCAB, d_model, rngs=rngs)

        @nnx.vmap(in_axes=0, out_axes=0)
        def make(key: jax.Array) -> Block:
            return Block(d_model, heads, mlp, rngs=nnx.Rngs(key))

        self.blocks = make(jax.random.split(jax.random.key(seed + 1), layers))
        self.norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.head = nnx.Linear(d_model, VOCAB, rngs=rngs)
        axes = {"in_axes": (nnx.Carry, 0), "out_axes": nnx.Carry}
        self.layers = (nnx.scan(_layer, **axes) if schedule is None
                       else autoremat.nnx.scan(_layer, schedule=schedule, **axes))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.head(self.norm(self.layers(self.embed(tokens), self.blocks)))


def loss_fn(model: Stack, tokens: jax.Array) -> jax.Array:
    """Cross-entropy of each position's prediction of the next token."""
    logits = model(tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


def tokens(batch: int = BATCH, seq_len: int = SEQ_LEN) -> jax.Array:
    return jax.random.randint(jax.random.key(1), (batch, seq_len), 0, VOCAB)


def problem() -> autoremat.Problem:
    """The stack's training step (next-token cross-entropy, Adam 1e-3) for ``autoremat tune``."""
    return autoremat.nnx.problem(
        f"nnx_stack(L={LAYERS},d={D_MODEL},S={SEQ_LEN})",
        model_fn=lambda _plain: Stack(),   # left as written: its nnx.scan is rewritten
        loss_fn=loss_fn,
        optimizer_fn=lambda model: nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param),
        batch=(tokens(),), seq_len=LAYERS, min_length=LAYERS)


if __name__ == "__main__":
    import sys

    budget = autoremat.parse_bytes(sys.argv[1] if len(sys.argv) > 1 else "1GB")
    result = autoremat.tune(problem(), budget, out="nnx_stack.yaml")
    print(result.best.describe() if result.best else "nothing fits")
