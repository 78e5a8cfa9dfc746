"""The built-in layer stack: a decoder-only transformer whose layers are one scan.

On accelerators the scan people rematerialize is the one over layers (MaxText's
``scan_layers``, Flax's ``nn.scan`` over blocks), 12-100 steps of heavy work,
not a recurrence over 10^4 time steps. ``layer_stack`` is that training step:
token embedding, ``layers`` pre-norm blocks shaped like MaxText's default decoder
layer (RMSNorm, causal multi-head attention, RMSNorm, a gated MLP:
``wo(silu(wi_0 h) * wi_1 h)``, MaxText's ``mlp_activations: [silu, linear]``) scanned
by ``autoremat.linen.scan`` over per-layer parameters, a final norm, a vocabulary
readout, next-token cross-entropy and Adam(1e-3). Activations are ``dtype``
(bfloat16 by default, as TPU users train), parameters and the loss float32.

Each block tags its values with ``jax.ad_checkpoint.checkpoint_name``, with the
names MaxText's layers give the same values (``CHECKPOINT_NAMES``; MaxText 0.2.5's
``layers/attentions.py`` and ``layers/linears.py``): the block's input, the three
projections, the attention's output before its projection (``attention_out``), that
projection (``out_proj``), the MLP's two input projections (``mlpwi_0``, ``mlpwi_1``)
and its output (``mlpwo``). So a schedule's level can keep some of them
(``save_only_these_names``), offload them (``save_and_offload_only_these_names``)
or keep all else (``save_anything_except_these_names``), and MaxText's
``remat_policy`` presets act on it as on MaxText's own block. The attention is
MaxText's ``dot_product`` path, written out (scores and probabilities
``(batch, heads, seq, seq)``, as XLA's non-flash attention stores them), so a
layer's residuals grow with ``seq_len ** 2``: which values a schedule keeps
matters. There is no flash kernel here (on a CPU, dense attention is the only kind
MaxText runs too), so the tag ``context`` -- MaxText's name for a flash kernel's saved
residuals -- does not occur.

The problem's ``seq_len`` -- the length of the scan a schedule tiles -- is the
number of layers; the token sequence length is the model's own ``seq_len``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from autoremat._errors import ProblemError
from autoremat._measure.problem import Problem, Step
from autoremat._schedules import plain
from autoremat._schedules.base import Schedule

#: The values each block tags (MaxText's names, ``layers/attentions.py`` and
#: ``layers/linears.py``): the block's input, the three attention projections,
#: the attention's output before its projection, that projection, the gated MLP's
#: two input projections and its output.
CHECKPOINT_NAMES: Final = ("decoder_layer_input", "query_proj", "key_proj", "value_proj",
                           "attention_out", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")
DTYPES: Final = ("bfloat16", "float32")


@dataclass(frozen=True)
class LayerStack:
    """The sizes of the built-in layer stack (``layer_stack``).

    Attributes:
      layers: transformer blocks, the length of the scan a schedule tiles.
      d_model: the model width; ``heads`` must divide it.
      heads: attention heads.
      mlp: the gated MLP's hidden width (each of its two input projections').
      seq_len: tokens per sequence.
      batch: sequences per step.
      vocab: the vocabulary (embedding and readout).
      dtype: the activations' dtype (``"bfloat16"`` or ``"float32"``); parameters,
        the attention softmax and the loss are float32.
    """

    layers: int = 24
    d_model: int = 1024
    heads: int = 16
    mlp: int = 4096
    seq_len: int = 2048
    batch: int = 8
    vocab: int = 1024
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("layers", "d_model", "heads", "mlp", "seq_len", "batch", "vocab"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProblemError(f"{name}: expected a positive integer, got {value!r}")
        if self.seq_len < 2:
            raise ProblemError(f"seq_len: next-token prediction needs >= 2 tokens, got "
                               f"{self.seq_len}")
        if self.d_model % self.heads:
            raise ProblemError(f"heads: must divide d_model={self.d_model}, got {self.heads}; "
                               f"e.g. heads={math.gcd(self.d_model, 16)}")
        if self.dtype not in DTYPES:
            raise ProblemError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")

    def small(self) -> LayerStack:
        """The same layers, heads and dtype at a size whose plain scan runs anywhere in
        moments (``Problem.small``: the probe's instance): 8 dimensions a head, 16
        tokens, one sequence."""
        return replace(self, d_model=8 * self.heads, mlp=32 * self.heads,
                       seq_len=min(self.seq_len, 16), batch=1, vocab=min(self.vocab, 64))

    @property
    def name(self) -> str:
        dtype = "bf16" if self.dtype == "bfloat16" else "f32"
        return (f"layer_stack(L={self.layers},d={self.d_model},H={self.heads},mlp={self.mlp},"
                f"S={self.seq_len},B={self.batch},{dtype})")


def decoder(sizes: LayerStack, schedule: Schedule | None, *,
            flax_policy: Callable[..., Any] | None = None) -> Any:
    """The linen model: ``model.apply({"params": p}, tokens) -> logits (float32)``; its
    layers scanned by ``autoremat.linen.scan`` under ``schedule``; when that is ``None``,
    by ``flax.linen.scan`` as written (the unscheduled model), over ``nn.remat`` blocks
    when ``flax_policy`` (a ``jax.checkpoint_policies`` member) is given -- MaxText's
    way, the study's peer. The parameters are the same either way."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    from autoremat._flax.linen_scan import scan

    dtype = jnp.dtype(sizes.dtype)
    head_dim = sizes.d_model // sizes.heads

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array, _: Any = None) -> tuple[jax.Array, None]:
            x = checkpoint_name(x, "decoder_layer_input")
            h = nn.RMSNorm(dtype=dtype, name="pre_attention_norm")(x)

            def proj(name: str) -> jax.Array:
                dense = nn.DenseGeneral((sizes.heads, head_dim), use_bias=False, dtype=dtype,
                                        name=name.removesuffix("_proj"))
                return checkpoint_name(dense(h), name)

            q, k, v = proj("query_proj"), proj("key_proj"), proj("value_proj")
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
            scores = scores / math.sqrt(head_dim)
            causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
            scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
            probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
            attended = checkpoint_name(jnp.einsum("bhqk,bkhd->bqhd", probs, v),
                                       "attention_out")
            out = nn.DenseGeneral(sizes.d_model, axis=(-2, -1), use_bias=False, dtype=dtype,
                                  name="out")(attended)
            x = x + checkpoint_name(out, "out_proj")
            h = nn.RMSNorm(dtype=dtype, name="pre_mlp_norm")(x)

            def wi(i: int) -> jax.Array:
                dense = nn.Dense(sizes.mlp, use_bias=False, dtype=dtype, name=f"wi_{i}")
                return checkpoint_name(dense(h), f"mlpwi_{i}")

            gated = nn.silu(wi(0)) * wi(1)  # MaxText's mlp_activations: [silu, linear]
            wo = nn.Dense(sizes.d_model, use_bias=False, dtype=dtype, name="wo")(gated)
            return x + checkpoint_name(wo, "mlpwo"), None

    options: dict[str, Any] = {"variable_axes": {"params": 0}, "split_rngs": {"params": True},
                               "length": sizes.layers}
    if schedule is None:
        block = Block if flax_policy is None else nn.remat(Block, prevent_cse=False,
                                                           policy=flax_policy)
        stack = nn.scan(block, **options)
    else:
        stack = scan(Block, schedule=schedule, **options)

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, tokens: jax.Array) -> jax.Array:
            x = nn.Embed(sizes.vocab, sizes.d_model, dtype=dtype, name="embed")(tokens)
            x, _ = stack(name="layers")(x)
            x = nn.RMSNorm(dtype=dtype, name="final_norm")(x)
            return nn.Dense(sizes.vocab, use_bias=False, dtype=jnp.float32,
                            name="logits")(x.astype(jnp.float32))

    return Decoder()


@dataclass(frozen=True)
class LayerStackModel:
    """The layer stack's parameters, optimizer and tokens, built once; ``train_step``
    around any way of running the layers (``decoder``'s ``schedule`` and ``flax_policy``)."""

    sizes: LayerStack
    args: tuple[Any, ...]  # (params, opt_state, tokens)
    tx: Any

    ARG_NAMES = ("params", "opt_state", "tokens")

    def loss_fn(self, schedule: Schedule | None, *,
                flax_policy: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """``loss(params, tokens)``: mean next-token cross-entropy, float32."""
        import jax.numpy as jnp
        import optax

        model = decoder(self.sizes, schedule, flax_policy=flax_policy)

        def loss(params: Any, tokens: Any) -> Any:
            logits = model.apply({"params": params}, tokens)
            return optax.softmax_cross_entropy_with_integer_labels(
                logits[:, :-1], tokens[:, 1:]).astype(jnp.float32).mean()

        return loss

    def train_step(self, schedule: Schedule | None, *,
                   flax_policy: Callable[..., Any] | None = None) -> Step:
        """``train_step(params, opt_state, tokens) -> (params, opt_state, loss)``."""
        import jax
        import optax

        loss = self.loss_fn(schedule, flax_policy=flax_policy)

        def train_step(params: Any, opt_state: Any, tokens: Any) -> Any:
            value, grads = jax.value_and_grad(loss)(params, tokens)
            updates, opt_state = self.tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, value

        return train_step

    def problem(self) -> Problem:
        """This train step as a ``Problem``: its layer scan under each schedule."""

        def build(schedule: Schedule) -> tuple[Step, tuple[Any, ...]]:
            return self.train_step(schedule), self.args

        return Problem(name=self.sizes.name, seq_len=self.sizes.layers, build=build,
                       arg_names=self.ARG_NAMES,
                       small=lambda: layer_stack_model(self.sizes.small()).problem())


def layer_stack_model(sizes: LayerStack) -> LayerStackModel:
    """Parameters (``PRNGKey(0)``; the same under every schedule), Adam(1e-3) and
    random tokens (``PRNGKey(1)``)."""
    import jax
    import optax

    tokens = jax.random.randint(jax.random.PRNGKey(1), (sizes.batch, sizes.seq_len), 0,
                                sizes.vocab)
    model = decoder(sizes, plain(sizes.layers))
    params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)["params"]
    tx = optax.adam(1e-3)
    return LayerStackModel(sizes, (params, tx.init(params), tokens), tx)


#: The layer stack's default sizes: ``LayerStack``'s, their one home (``layer_stack`` and the
#: command read them here).
DEFAULT: Final = LayerStack()


def layer_stack(layers: int = DEFAULT.layers, d_model: int = DEFAULT.d_model,
                heads: int = DEFAULT.heads, mlp: int = DEFAULT.mlp,
                seq_len: int = DEFAULT.seq_len, batch: int = DEFAULT.batch, *,
                vocab: int = DEFAULT.vocab, dtype: str = DEFAULT.dtype) -> Problem:
    """The built-in layer-stack problem (``autoremat tune --problem layer_stack``):
    the module docstring's decoder at these sizes; its scan is over ``layers``."""
    sizes = LayerStack(layers, d_model, heads, mlp, seq_len, batch, vocab, dtype)
    return layer_stack_model(sizes).problem()
