"""The unmodified seed model, its readout and loss moved into the scan by ``remat_scans``,
against the same model hand-fused with ``autoremat.fuse_loss`` (issue 31).

The report's ``SimpleLSTM`` (``examples/seed_unmodified.py``: ``nn.scan``,
``@nn.remat`` on ``__call__``, ``nn.Dense`` and ``optax.l2_loss(...).mean()``
after the scan; B=10, X=32, H=128, Y=4) is trained (Adam 1e-3) three ways
under each schedule:

* unmodified: as written, through ``autoremat.linen.problem`` (``remat_scans``,
  fusion on, the default);
* unfused: the same with ``fuse=False`` (what ``remat_scans`` did before);
* hand-fused: the same cell, Dense and parameters with the readout and the
  per-step L2 loss in the scanned step (``autoremat.fuse_loss``, the built-in
  ``seed_lstm(fused_readout=True)`` step).

It prints the compiled temp and total bytes (``measure_step``) and the step
times, timed alternately in one process, as ratios to the hand-fused step;
then, at ``--long-seq-len`` (default 10^5), the total memory of the unmodified
model under a nested schedule against the plain scan's (compiled, not run).

    python studies/bench_fuse_readout.py           # ~5 min on 2 CPUs

Writes ``studies/results/fuse_readout.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import optax

import autoremat
import autoremat.linen
from autoremat._atomic import atomic_write_text
from autoremat._measure.device import environment
from autoremat._models.seed_lstm import seed_model
from autoremat._units import format_bytes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "studies"))
from bench_remat_scans import load_seed  # noqa: E402


def problems(seq_len: int) -> tuple[Any, Any, Any]:
    """(unmodified, unfused, hand-fused) problems on the same parameters and data."""
    seed = load_seed(seq_len)
    unmodified = seed.problem()
    model = seed.SimpleLSTM(hidden_size=seed.hidden_size, output_dim=seed.output_dim,
                            seq2seq=seed.seq2seq)
    params, _, x, y = unmodified.build(autoremat.plain(seq_len))[1]
    unfused = autoremat.linen.problem("unfused", model, params, (x, y), optax.adam(1e-3),
                                      fuse=False)
    hand = seed_model(seq_len, seed.batch_size, seed.hidden_size, seed.input_dim,
                      seed.output_dim, fused_readout=True)
    hand_params = {"cell": params["cell"], "readout": params["linear"]}
    hand = replace(hand, args=(hand_params, hand.tx.init(hand_params), x, y))
    return unmodified, unfused, hand.problem()


def interleaved(steps: list[Any], args: list[tuple[Any, ...]], rounds: int) -> list[float]:
    """Median seconds of each compiled step, timed alternately ``rounds`` times (warm-up first)."""
    compiled = [jax.jit(s).lower(*a).compile() for s, a in zip(steps, args, strict=True)]
    for c, a in zip(compiled, args, strict=True):
        jax.block_until_ready(c(*a))
    samples: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for c, a, out in zip(compiled, args, samples, strict=True):
            t0 = time.perf_counter()
            jax.block_until_ready(c(*a))
            out.append(time.perf_counter() - t0)
    return [statistics.median(s) for s in samples]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=10_000)
    parser.add_argument("--long-seq-len", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5, help="timed runs of each step")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "studies" / "results" / "fuse_readout.md")
    args = parser.parse_args(argv)
    T = args.seq_len
    named = dict(zip(("unmodified", "unfused", "hand-fused"), problems(T), strict=True))
    schedules = [("nested", autoremat.nested([100, 100]) if T == 10_000
                  else autoremat.root(T, 2)),
                 ("binomial", autoremat.binomial(16))]
    rows = []
    for kind, schedule in schedules:
        built = {n: p.build(schedule) for n, p in named.items()}
        mem = {n: autoremat.measure_step(s, a, run=False, arg_names=named[n].arg_names)
               for n, (s, a) in built.items()}
        losses = {n: float(jax.jit(s)(*a)[-1]) for n, (s, a) in built.items()}
        times = dict(zip(built, interleaved([s for s, _ in built.values()],
                                            [a for _, a in built.values()], args.rounds),
                         strict=True))
        rows.append((kind, schedule.describe(), mem, times, losses))
        print(kind, {n: (m.temp_bytes, m.total_bytes) for n, m in mem.items()}, times, losses,
              flush=True)
    long = args.long_seq_len
    seed, as_written, _ = problems(long)
    nested = autoremat.root(long, 2)
    plain = autoremat.plain(long)
    m_long = {
        "nested": autoremat.measure_step(*seed.build(nested), run=False,
                                         arg_names=seed.arg_names),
        # the model as written, jit(value_and_grad) of its loss: a plain scan, readout after it
        "plain": autoremat.measure_step(*as_written.build(plain), run=False,
                                        arg_names=seed.arg_names),
        "plain fused": autoremat.measure_step(*seed.build(plain), run=False,
                                              arg_names=seed.arg_names),
    }
    print("long", {k: m.total_bytes for k, m in m_long.items()}, flush=True)
    atomic_write_text(args.out, report(args, rows, long, nested, m_long))
    print(args.out.read_text())
    return 0


def report(args: Any, rows: list[Any], long: int, nested: Any, m_long: dict[str, Any]) -> str:
    env = environment()
    lines = [
        "# remat_scans moves the seed model's readout and loss into the scan",
        "",
        f"`python studies/bench_fuse_readout.py --seq-len {args.seq_len} --long-seq-len "
        f"{args.long_seq_len} --rounds {args.rounds}` ({env['device_kind']}, jax "
        f"{env['jax_version']}, flax {env['flax_version']}). The report's `SimpleLSTM` "
        "(B=10, X=32, H=128, Y=4, `@nn.remat` on `__call__`), L2 loss + Adam(1e-3), x and y "
        f"jit arguments, T={args.seq_len}. *unmodified*: the model as written through "
        "`autoremat.linen.problem` (`remat_scans`, fusion on); *unfused*: the same with "
        "`fuse=False`; *hand-fused*: the same cell, Dense and parameters with the readout and "
        "loss in the step (`autoremat.fuse_loss`). Memory from `compiled.memory_analysis()`; "
        f"step time the median of {args.rounds} runs, the three steps timed alternately in one "
        "process. Ratios are to the hand-fused step.",
        "",
        "| schedule | temp unmodified | temp unfused | temp hand-fused | temp ratio "
        "| total unmodified | total hand-fused | step unmodified | step unfused "
        "| step hand-fused | step ratio | same loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, desc, mem, times, losses in rows:
        u, f, h = mem["unmodified"], mem["unfused"], mem["hand-fused"]
        same = abs(losses["unmodified"] - losses["hand-fused"]) <= 1e-5 * abs(
            losses["hand-fused"])
        lines.append(
            f"| {kind} `{desc}` | {format_bytes(u.temp_bytes)} | {format_bytes(f.temp_bytes)} "
            f"| {format_bytes(h.temp_bytes)} | {u.temp_bytes / h.temp_bytes:.2f} "
            f"| {format_bytes(u.total_bytes)} | {format_bytes(h.total_bytes)} "
            f"| {times['unmodified']:.3f} s | {times['unfused']:.3f} s "
            f"| {times['hand-fused']:.3f} s "
            f"| {times['unmodified'] / times['hand-fused']:.3f} | {same} |")
    m_nested, m_plain, m_fused = m_long["nested"], m_long["plain"], m_long["plain fused"]
    args_bytes = m_nested.argument_bytes or 0
    lines += [
        "",
        f"At T={long} (compiled, not run): the unmodified model under `{nested.describe()}` "
        f"needs {format_bytes(m_nested.total_bytes)} in total (temp "
        f"{format_bytes(m_nested.temp_bytes)}, arguments {format_bytes(args_bytes)}); the "
        f"model as written with a plain scan (`fuse=False`, `autoremat.plain`: what "
        f"`jax.jit(jax.value_and_grad(loss))` compiles) {format_bytes(m_plain.total_bytes)} "
        f"(temp {format_bytes(m_plain.temp_bytes)}): "
        f"**{100 * m_nested.total_bytes / m_plain.total_bytes:.2f}%** of plain's. Against the "
        f"plain scan with the readout fused ({format_bytes(m_fused.total_bytes)}): "
        f"{100 * m_nested.total_bytes / m_fused.total_bytes:.2f}%; the arguments alone (x and y) "
        f"are {100 * args_bytes / m_plain.total_bytes:.2f}% of plain's.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
