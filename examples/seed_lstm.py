"""The built-in LSTM's training loop, with its scan run under an autoremat schedule.

This is the model of the Flax discussion this project started from (the built-in
problem, ``autoremat.seed_lstm``: a Flax ``OptimizedLSTMCell`` over T=10,000 steps).
Its scan takes two changed lines: ``import autoremat`` and ``nn.scan`` ->
``autoremat.linen.scan`` with a ``schedule``; the ``@nn.remat`` on ``__call__`` that
did not help is gone, and ``--fused-readout`` is an option of this script
(``examples/seed_unmodified.py`` is the discussion's script as written).

    python examples/seed_lstm.py --steps 5                        # sqrt(T) 2-level default
    python examples/seed_lstm.py --schedule schedule.yaml --steps 5   # a tuned schedule
    python examples/seed_lstm.py --schedule plain --steps 2       # the plain scan, for comparison
    python examples/seed_lstm.py --fused-readout --steps 5        # the readout inside the scan

``--fused-readout`` calls the Dense readout and the per-step L2 loss inside the
scanned method (the readout's params broadcast like the cell's) and sums the loss
in the carry, so the scan stacks nothing instead of ``(B, T, 128)`` hidden states:
the stack, its cotangent and the readout's residual -- memory no schedule can
remove -- are gone. Loss and gradients are the same. A schedule tuned that way
(``fuse: true``, what ``autoremat tune`` picks where it is faster or fits) runs
fused by default, as it was measured; ``--no-fused-readout`` runs it with the
readout after the scan, which needs more memory than the tune measured (autoremat
refuses it where that breaks the schedule's budget, and says by how much).

It prints the loss and step time of each step, and the compiled memory of the
train step (``compiled.memory_analysis()``) beside the figure the tune measured.
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
import jax.numpy as jnp
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
            if not self.fused_readout:
                return self.cell(carry, x)
            # fused: the readout and loss run in the step, summed in the carry; nothing
            # is stacked
            (carry, total), (x, y) = carry, x
            carry, h = self.cell(carry, x)
            return (carry, total + optax.l2_loss(self.linear(h), y).sum()), None

        def __call__(self, embedded_inputs: jax.Array,
                     targets: jax.Array | None = None) -> jax.Array:
            """The predictions; fused, the mean L2 loss against ``targets``."""
            batch_size = embedded_inputs.shape[0]
            initial_state = self.cell.initialize_carry(
                jax.random.PRNGKey(0), (batch_size, embedded_inputs.shape[-1])
            )
            if self.fused_readout:
                assert targets is not None, "fused_readout: the loss needs the targets"
                (_, total), _ = self.forward((initial_state, jnp.zeros(())),
                                             (embedded_inputs, targets))
                return total / targets.size
            _, outputs = self.forward(initial_state, embedded_inputs)
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
    parser.add_argument("--fused-readout", action=argparse.BooleanOptionalAction, default=None,
                        help="call the readout and loss inside the scanned step (seq2seq; "
                        "default: as the schedule was tuned, its 'fuse', else not)")
    args = parser.parse_args(argv)
    try:
        schedule = parse_schedule_arg(args.schedule, args.seq_len)
    except autoremat.ScheduleError as e:
        print(f"error: --schedule: {e}", file=sys.stderr)
        return 2
    fused = args.fused_readout if args.fused_readout is not None else bool(schedule.fuse)
    if fused and not args.seq2seq:
        parser.error("--fused-readout needs --seq2seq")

    model = make_model(schedule, args.hidden, args.output_dim, args.seq2seq, fused)

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
            if fused:  # the loss ran inside the scanned step
                return state.apply_fn({"params": params}, x, y)
            preds = state.apply_fn({"params": params}, x)
            return optax.l2_loss(preds, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), {"loss": loss}

    key = jax.random.PRNGKey(1)
    key, sub_key = jax.random.split(key)
    x, y = generate_data(sub_key)
    key, sub_key = jax.random.split(key)
    print(f"schedule: {schedule.describe()}  (T={args.seq_len}, seq2seq={args.seq2seq}, "
          f"fused_readout={fused})")
    t0 = time.perf_counter()
    try:  # a tuned schedule run in a program that breaks its budget is refused at its trace
        params = jax.jit(model.init)(sub_key, x, y if fused else None)["params"]
        state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))
        compiled = train_step.lower(state, x, y).compile()
    except autoremat.ScheduleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    if mem is not None:
        total = (mem.argument_size_in_bytes + mem.output_size_in_bytes
                 + mem.temp_size_in_bytes - mem.alias_size_in_bytes)
        tuned = schedule.meta.get("total_bytes")
        print(f"compiled train step: temp {mem.temp_size_in_bytes / 1e6:.1f} MB, "
              f"total {total / 1e6:.1f} MB"
              + (f" ({total / tuned:.3f}x the tuned {tuned / 1e6:.1f} MB)"
                 if isinstance(tuned, int) and tuned else "")
              + f", compile {compile_s:.1f} s")
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
