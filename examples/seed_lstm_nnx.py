"""The built-in LSTM's training loop in Flax NNX, its scan run under an autoremat schedule.

The model of the Flax discussion this project started from (the built-in
``autoremat.seed_lstm``: ``OptimizedLSTMCell`` over T=10,000 steps,
a Linear readout, L2 loss, Adam 1e-3) written in NNX. Compared with plain
NNX code, one line changed: ``nnx.scan`` -> ``autoremat.nnx.scan`` with a
``schedule`` (loaded from YAML).

    python examples/seed_lstm_nnx.py --schedule schedule.yaml --steps 5
    python examples/seed_lstm_nnx.py --schedule plain --steps 2     # plain scan
    autoremat tune --problem examples/seed_lstm_nnx.py:problem --budget 1GB --trials 4

``problem`` (for ``autoremat tune``) reads ``SEED_LSTM_NNX_SEQ_LEN`` and
``SEED_LSTM_NNX_HIDDEN`` (default 10000 and 128) from the environment.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import optax
from flax import nnx

import autoremat
import autoremat.nnx


class SimpleLSTM(nnx.Module):
    def __init__(self, schedule: autoremat.Schedule, input_dim: int, hidden: int,
                 output_dim: int, seq2seq: bool, *, rngs: nnx.Rngs) -> None:
        self.cell = nnx.OptimizedLSTMCell(input_dim, hidden, rngs=rngs)
        self.linear = nnx.Linear(hidden, output_dim, rngs=rngs)
        self.seq2seq = seq2seq
        # the one change: nnx.scan -> autoremat.nnx.scan(schedule=...)
        self.forward = autoremat.nnx.scan(
            _step, schedule=schedule, in_axes=(None, nnx.Carry, 1), out_axes=(nnx.Carry, 1))

    def __call__(self, x: jax.Array) -> jax.Array:
        carry = self.cell.initialize_carry(x[:, 0].shape, nnx.Rngs(0))
        _, outputs = self.forward(self.cell, carry, x)
        return self.linear(outputs) if self.seq2seq else self.linear(outputs[:, -1])


def _step(cell: nnx.OptimizedLSTMCell, carry: tuple[jax.Array, jax.Array],
          x: jax.Array) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
    return cell(carry, x)


def loss_fn(model: SimpleLSTM, x: jax.Array, y: jax.Array) -> jax.Array:
    return optax.l2_loss(model(x), y).mean()


def make_data(key: jax.Array, batch: int, seq_len: int, input_dim: int, output_dim: int,
              seq2seq: bool) -> tuple[jax.Array, jax.Array]:
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (batch, seq_len, input_dim))
    return x, jax.random.normal(ky, (batch, seq_len, output_dim) if seq2seq else (batch, output_dim))


def problem(seq_len: int | None = None, hidden: int | None = None, batch: int = 10,
            input_dim: int = 32, output_dim: int = 4, seq2seq: bool = True) -> autoremat.Problem:
    """This training step as an ``autoremat.Problem`` (``autoremat tune --problem``)."""
    seq_len = seq_len or int(os.environ.get("SEED_LSTM_NNX_SEQ_LEN", "10000"))
    hidden = hidden or int(os.environ.get("SEED_LSTM_NNX_HIDDEN", "128"))
    data = make_data(jax.random.key(0), batch, seq_len, input_dim, output_dim, seq2seq)
    return autoremat.nnx.problem(
        f"seed_lstm_nnx(T={seq_len},B={batch},H={hidden})",
        model_fn=lambda schedule: SimpleLSTM(schedule, input_dim, hidden, output_dim, seq2seq,
                                             rngs=nnx.Rngs(0)),
        loss_fn=loss_fn,
        optimizer_fn=lambda model: nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param),
        batch=data, seq_len=seq_len,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", help="a schedule YAML file, or 'plain' "
                        "(default: two levels of about sqrt(T))")
    parser.add_argument("--steps", type=int, default=5, help="training steps (5)")
    parser.add_argument("--seq-len", type=int, default=10_000, help="T (10000)")
    parser.add_argument("--hidden", type=int, default=128, help="LSTM width (128)")
    args = parser.parse_args(argv)
    args.batch, args.input_dim, args.output_dim, args.seq2seq = 10, 32, 4, True
    try:
        schedule = (autoremat.plain(args.seq_len) if args.schedule == "plain"
                    else autoremat.load_schedule(args.schedule) if args.schedule
                    else autoremat.root(args.seq_len, 2))
    except autoremat.ScheduleError as e:
        print(f"error: --schedule: {e}", file=sys.stderr)
        return 2

    model = SimpleLSTM(schedule, args.input_dim, args.hidden, args.output_dim, args.seq2seq,
                       rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    data = jax.jit(functools.partial(make_data, batch=args.batch, seq_len=args.seq_len,
                                     input_dim=args.input_dim, output_dim=args.output_dim,
                                     seq2seq=args.seq2seq))

    @nnx.jit
    def train_step(model: SimpleLSTM, optimizer: nnx.Optimizer, x: jax.Array,
                   y: jax.Array) -> jax.Array:
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    print(f"schedule: {schedule.describe()}  (T={args.seq_len}, seq2seq={args.seq2seq})")
    key = jax.random.key(1)
    for i in range(args.steps):
        key, sub = jax.random.split(key)
        x, y = data(sub)
        t0 = time.perf_counter()
        loss = float(train_step(model, optimizer, x, y))
        print(f"step {i}: loss {loss:.6f}  {time.perf_counter() - t0:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
