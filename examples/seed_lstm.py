"""The seed's LSTM training loop, with its scan run under an autoremat schedule.

This is the model from the original report (a Flax ``OptimizedLSTMCell`` over
T=10,000 steps). Compared with the report, two lines changed: ``import
autoremat`` and ``nn.scan`` -> ``autoremat.linen.scan`` with a ``schedule``.

    python examples/seed_lstm.py --steps 5                        # sqrt(T) 2-level default
    python examples/seed_lstm.py --schedule schedule.yaml --steps 5   # a tuned schedule
    python examples/seed_lstm.py --schedule plain --steps 2       # the plain scan, for comparison
    python examples/seed_lstm.py --fused-readout --steps 5        # the readout inside the scan

``--fused-readout`` calls the Dense readout inside the scanned method (its
params broadcast like the cell's), so the scan stacks ``(B, T, 4)``
predictions instead of ``(B, T, 128)`` hidden states: the stack, its
cotangent and the readout's residual -- memory no schedule can remove --
shrink 32x. Loss and gradients are the same.

It prints the loss and step time of each step, and the compiled memory of the
train step (``compiled.memory_analysis()``).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import flax.linen as nn
import jax
import optax
from flax.training.train_state import TrainState

import autoremat


def make_model(schedule: autoremat.Schedule, hidden_size: int, output_dim: int,
               seq2seq: bool, fused_readout: bool = False) -> nn.Module:
    if fused_readout and not seq2seq:
        raise ValueError("fused_readout: needs seq2seq (the last-state loss stacks nothing)")

    class SimpleLSTM(nn.Module):
        hidden_size: int
        output_dim: int
        seq2seq: bool
        fused_readout: bool

        def setup(self) -> None:
            self.cell = nn.OptimizedLSTMCell(self.hidden_size)
            self.linear = nn.Dense(self.output_dim)

        @functools.partial(
            autoremat.linen.scan,  # change 2 of 2: was nn.scan
            schedule=schedule,
            variable_broadcast="params",
            in_axes=1,
            out_axes=1,
            split_rngs={"params": False},
        )
        def forward(self, carry, x):  # type: ignore[no-untyped-def]
            carry, h = self.cell(carry, x)
            # fused: the readout runs in the step, so only predictions are stacked
            return carry, (self.linear(h) if self.fused_readout else h)

        def __call__(self, embedded_inputs: jax.Array) -> jax.Array:
            batch_size = embedded_inputs.shape[0]
            initial_state = self.cell.initialize_carry(
                jax.random.PRNGKey(0), (batch_size, embedded_inputs.shape[-1])
            )
            _, outputs = self.forward(initial_state, embedded_inputs)
            if self.fused_readout:
                return outputs
            if self.seq2seq:
                return self.linear(outputs)
            return self.linear(outputs[:, -1])

    return SimpleLSTM(hidden_size=hidden_size, output_dim=output_dim, seq2seq=seq2seq,
                      fused_readout=fused_readout)


def parse_schedule_arg(value: str | None, seq_len: int) -> autoremat.Schedule:
    if value == "plain":
        return autoremat.plain(seq_len)
    if value:
        return autoremat.load_schedule(value)
    return autoremat.root(seq_len, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", help="a schedule YAML file, or 'plain' (default: sqrt(T) 2-level)")
    parser.add_argument("--steps", type=int, default=5, help="training steps to run (default 5)")
    parser.add_argument("--seq-len", type=int, default=10_000, help="T (default 10000)")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--input-dim", type=int, default=32)
    parser.add_argument("--output-dim", type=int, default=4)
    parser.add_argument("--seq2seq", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--fused-readout", action="store_true",
                        help="call the readout inside the scanned step (seq2seq)")
    args = parser.parse_args(argv)
    if args.fused_readout and not args.seq2seq:
        parser.error("--fused-readout needs --seq2seq")
    try:
        schedule = parse_schedule_arg(args.schedule, args.seq_len)
    except autoremat.ScheduleError as e:
        print(f"error: --schedule: {e}", file=sys.stderr)
        return 2

    model = make_model(schedule, args.hidden, args.output_dim, args.seq2seq, args.fused_readout)

    @jax.jit
    def generate_data(key: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = jax.random.normal(key, (args.batch, args.seq_len, args.input_dim))
        key, sub_key = jax.random.split(key)
        y_shape = (args.batch, args.seq_len, args.output_dim) if args.seq2seq else (
            args.batch, args.output_dim)
        return x, jax.random.normal(sub_key, y_shape)

    @jax.jit
    def train_step(state: TrainState, x: jax.Array, y: jax.Array) -> tuple[TrainState, dict]:
        def loss_fn(params: dict) -> jax.Array:
            preds = state.apply_fn({"params": params}, x)
            return optax.l2_loss(preds, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), {"loss": loss}

    key = jax.random.PRNGKey(1)
    key, sub_key = jax.random.split(key)
    x, y = generate_data(sub_key)
    key, sub_key = jax.random.split(key)
    params = jax.jit(model.init)(sub_key, x)["params"]
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))

    t0 = time.perf_counter()
    compiled = train_step.lower(state, x, y).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    print(f"schedule: {schedule.describe()}  (T={args.seq_len}, seq2seq={args.seq2seq}, "
          f"fused_readout={args.fused_readout})")
    if mem is not None:
        total = (mem.argument_size_in_bytes + mem.output_size_in_bytes
                 + mem.temp_size_in_bytes - mem.alias_size_in_bytes)
        print(f"compiled train step: temp {mem.temp_size_in_bytes / 1e6:.1f} MB, "
              f"total {total / 1e6:.1f} MB, compile {compile_s:.1f} s")
    for i in range(args.steps):
        t0 = time.perf_counter()
        key, sub_key = jax.random.split(key)
        x, y = generate_data(sub_key)
        state, metrics = compiled(state, x, y)
        loss = float(jax.device_get(metrics["loss"]))
        print(f"step {i}: loss {loss:.6f}  {time.perf_counter() - t0:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
