"""``remat_scans`` on the unmodified seed model against the explicit API, same schedule.

The report's ``SimpleLSTM`` (``examples/seed_unmodified.py``: ``nn.scan`` over
``OptimizedLSTMCell``, ``@nn.remat`` on ``__call__``, x and y as jit arguments)
is trained (L2 loss, Adam 1e-3) two ways under each schedule:

* wrapped: the model as written, its loss wrapped by ``autoremat.remat_scans``
  (``autoremat.linen.problem``);
* explicit: the same model with ``nn.scan`` -> ``autoremat.linen.scan(schedule=...)``.

For each pair it records the compiled total and temp bytes (``measure_step``)
and the step time, timing the two executables alternately in one process, and
prints the ratios (wrapped / explicit).

    python studies/bench_remat_scans.py              # T = 10^4, ~2-3 min on 2 CPUs

Writes ``studies/results/remat_scans.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
import time
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import optax

import autoremat
import autoremat.linen
from autoremat._atomic import atomic_write_text
from autoremat._measure.device import environment
from autoremat._units import format_bytes

ROOT = Path(__file__).resolve().parents[1]


def load_seed(seq_len: int | None = None) -> Any:
    """``examples/seed_unmodified.py`` as a module (``seq_len``: its ``SEED_SEQ_LEN``; the
    one loader, ``tests/test_fuse_readout.py`` imports it too)."""
    if seq_len is not None:
        os.environ["SEED_SEQ_LEN"] = str(seq_len)
    spec = importlib.util.spec_from_file_location("seed_unmodified",
                                                  ROOT / "examples" / "seed_unmodified.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def explicit_model(seed: Any, schedule: autoremat.Schedule) -> nn.Module:
    """The seed's model with the two-line change: ``nn.scan`` -> ``autoremat.linen.scan``."""

    class ExplicitLSTM(seed.SimpleLSTM):  # type: ignore[name-defined,misc]
        @functools.partial(autoremat.linen.scan, schedule=schedule,
                           variable_broadcast="params", in_axes=1, out_axes=1,
                           split_rngs={"params": False})
        def forward(self, carry: Any, x: Any) -> Any:
            return self.cell(carry, x)

    return ExplicitLSTM(hidden_size=seed.hidden_size, output_dim=seed.output_dim,
                        seq2seq=seed.seq2seq)


def explicit_step(model: nn.Module, tx: optax.GradientTransformation) -> Any:
    def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return optax.l2_loss(model.apply({"params": params}, x), y).mean()

    def train_step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def interleaved(steps: list[Any], args: tuple[Any, ...], rounds: int) -> list[float]:
    """Median seconds of each compiled step, timed alternately ``rounds`` times (warm-up first)."""
    compiled = [jax.jit(s).lower(*args).compile() for s in steps]
    for c in compiled:
        jax.block_until_ready(c(*args))
    samples: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for c, out in zip(compiled, samples, strict=True):
            t0 = time.perf_counter()
            jax.block_until_ready(c(*args))
            out.append(time.perf_counter() - t0)
    return [statistics.median(s) for s in samples]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs of each step")
    parser.add_argument("--out", type=Path, default=ROOT / "studies" / "results" / "remat_scans.md")
    args = parser.parse_args(argv)
    seed = load_seed(args.seq_len)
    T = args.seq_len
    # fuse=False: the readout stays after the scan, as in the explicit model (the fused
    # unmodified model is compared with the hand-fused one in bench_fuse_readout.py)
    params, _, x, y = seed.problem().build(autoremat.plain(T))[1]
    model = seed.SimpleLSTM(hidden_size=seed.hidden_size, output_dim=seed.output_dim,
                            seq2seq=seed.seq2seq)
    problem = autoremat.linen.problem(f"seed_unmodified(T={T})", model, params, (x, y),
                                      optax.adam(1e-3), fuse=False)
    depth2 = autoremat.root(T, 2)
    schedules = [("nested", depth2), ("binomial", autoremat.binomial(16))]
    rows = []
    for kind, schedule in schedules:
        wrapped, step_args = problem.build(schedule)
        model = explicit_model(seed, schedule)
        explicit = explicit_step(model, optax.adam(1e-3))
        m_w = autoremat.measure_step(wrapped, step_args, run=False, arg_names=problem.arg_names)
        m_e = autoremat.measure_step(explicit, step_args, run=False, arg_names=problem.arg_names)
        t_w, t_e = interleaved([wrapped, explicit], step_args, args.rounds)
        loss_w = float(jax.jit(wrapped)(*step_args)[2])
        loss_e = float(jax.jit(explicit)(*step_args)[2])
        rows.append((kind, schedule.describe(), m_w, m_e, t_w, t_e, loss_w, loss_e))
        print(kind, m_w.total_bytes, m_e.total_bytes, m_w.temp_bytes, m_e.temp_bytes, t_w, t_e,
              flush=True)
    env = environment()
    lines = [
        "# remat_scans on the unmodified seed model vs the explicit API",
        "",
        f"`python studies/bench_remat_scans.py --seq-len {T} --rounds {args.rounds}` "
        f"({env['device_kind']}, jax {env['jax_version']}, flax {env['flax_version']}). "
        "The report's `SimpleLSTM` (B=10, X=32, H=128, Y=4, `@nn.remat` on `__call__` kept) "
        f"at T={T}; train step = L2 loss + Adam(1e-3), x and y jit arguments. *wrapped*: "
        "the model as written, loss under `autoremat.remat_scans`; *explicit*: `nn.scan` -> "
        "`autoremat.linen.scan(schedule=...)`. Memory from `compiled.memory_analysis()` "
        f"(`measure_step`); step time the median of {args.rounds} runs, the two steps timed "
        "alternately in one process.",
        "",
        "| schedule | total wrapped | total explicit | ratio | temp wrapped | temp explicit "
        "| ratio | step wrapped | step explicit | ratio | same loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, desc, m_w, m_e, t_w, t_e, loss_w, loss_e in rows:
        lines.append(
            f"| {kind} `{desc}` | {format_bytes(m_w.total_bytes)} | {format_bytes(m_e.total_bytes)} "
            f"| {m_w.total_bytes / m_e.total_bytes:.4f} | {format_bytes(m_w.temp_bytes)} "
            f"| {format_bytes(m_e.temp_bytes)} | {m_w.temp_bytes / m_e.temp_bytes:.4f} "
            f"| {t_w:.3f} s | {t_e:.3f} s | {t_w / t_e:.3f} "
            f"| {abs(loss_w - loss_e) <= 1e-5 * abs(loss_e)} |")
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
