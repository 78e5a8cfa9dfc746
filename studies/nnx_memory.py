"""Compiled temp memory: autoremat's NNX scan / RNNs against the Flax originals.

The seed LSTM (``OptimizedLSTMCell``, hidden 128, batch 10, input 32, output
4, loss on the last hidden state, Adam 1e-3) at T=10^4 under
``autoremat.nested([100, 100])``. For each pair it prints the compiled train
step's ``memory_analysis().temp_size_in_bytes`` and the ratio; the goal is
<= 3% of the original's. Run once (a few minutes on 2 CPUs):

    python studies/nnx_memory.py [--seq-len 10000]
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx

import autoremat
import autoremat.linen
import autoremat.nnx

B, IN, HID, OUT = 10, 32, 128, 4


def temp_bytes(step: Callable[..., Any], args: tuple[Any, ...]) -> int:
    return int(jax.jit(step).lower(*args).compile().memory_analysis().temp_size_in_bytes)


def nnx_step(make_rnn: Callable[[nnx.Module], nnx.Module],
             x: jax.Array, y: jax.Array) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """An NNX train step whose recurrence ``make_rnn(cell)(x)`` gives the last hidden state."""

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.rnn = make_rnn(nnx.OptimizedLSTMCell(IN, HID, rngs=rngs))
            self.linear = nnx.Linear(HID, OUT, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.linear(self.rnn(x))

    def loss_fn(model: Model, x: jax.Array, y: jax.Array) -> jax.Array:
        return optax.l2_loss(model(x), y).mean()

    p = autoremat.nnx.problem("nnx", lambda _: Model(nnx.Rngs(0)), loss_fn,
                              lambda m: nnx.Optimizer(m, optax.adam(1e-3), wrt=nnx.Param),
                              (x, y), x.shape[1])
    return p.build(autoremat.plain(x.shape[1]))


class Scanned(nnx.Module):
    """The seed's loop: ``scan_fn`` over the cell (broadcast), batch-major ``x``."""

    def __init__(self, cell: nnx.Module, scan_fn: Callable[..., Any]) -> None:
        self.cell = cell
        self.step = scan_fn(lambda cell, c, x: cell(c, x), in_axes=(None, nnx.Carry, 1),
                            out_axes=(nnx.Carry, 1))

    def __call__(self, x: jax.Array) -> jax.Array:
        carry = self.cell.initialize_carry(x[:, 0].shape, nnx.Rngs(0))
        (_, h), _ = self.step(self.cell, carry, x)
        return h


class Last(nnx.Module):
    """An RNN's last hidden state."""

    def __init__(self, rnn: nnx.Module) -> None:
        self.rnn = rnn

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.rnn(x, return_carry=True)[0][1]


def linen_step(rnn: nn.Module, x: jax.Array, y: jax.Array) -> tuple[Callable[..., Any], Any]:
    readout = nn.Dense(OUT)
    params = {"rnn": rnn.init(jax.random.key(0), x)["params"],
              "out": readout.init(jax.random.key(1), jnp.zeros((B, HID)))["params"]}
    tx = optax.adam(1e-3)

    def loss_fn(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        carry, _ = rnn.apply({"params": p["rnn"]}, x, return_carry=True)
        return optax.l2_loss(readout.apply({"params": p["out"]}, carry[1]), y).mean()

    def step(p: Any, s: Any, x: jax.Array, y: jax.Array) -> Any:
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    return step, (params, tx.init(params), x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=10_000)
    seq_len = parser.parse_args().seq_len
    schedule = autoremat.nested([100, 100])
    x = jax.random.normal(jax.random.key(0), (B, seq_len, IN))
    y = jax.random.normal(jax.random.key(1), (B, OUT))
    pairs = {
        "autoremat.nnx.scan vs nnx.scan": (
            nnx_step(lambda c: Scanned(c, functools.partial(autoremat.nnx.scan,
                                                            schedule=schedule)), x, y),
            nnx_step(lambda c: Scanned(c, nnx.scan), x, y)),
        "autoremat.nnx.RNN vs nnx.RNN": (
            nnx_step(lambda c: Last(autoremat.nnx.RNN(c, schedule=schedule)), x, y),
            nnx_step(lambda c: Last(nnx.RNN(c)), x, y)),
        "autoremat.linen.RNN vs nn.RNN": (
            linen_step(autoremat.linen.RNN(nn.OptimizedLSTMCell(HID), schedule=schedule), x, y),
            linen_step(nn.RNN(nn.OptimizedLSTMCell(HID)), x, y)),
    }
    print(f"seed LSTM, T={seq_len}, B={B}, H={HID}, loss on the last state, "
          f"schedule {schedule.describe()}; compiled temp_size_in_bytes")
    for name, (ours, theirs) in pairs.items():
        a, b = temp_bytes(*ours), temp_bytes(*theirs)
        print(f"  {name:34s} {a / 1e6:9.2f} MB vs {b / 1e6:9.2f} MB = {100 * a / b:6.2f}%")


if __name__ == "__main__":
    main()
