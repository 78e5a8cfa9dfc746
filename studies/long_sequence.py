"""T=10^6 on one machine: the seed LSTM, one real train step per schedule (issue 13).

A benchmark, not a test (minutes per step on a CPU). The plain scan at
T=10^6 would need ~63 GB; with the loss on the last state, or seq2seq with
the readout fused into the step (``seed_lstm(fused_readout=True)``, nothing
stacked), a schedule keeps memory at the inputs' size. For each loss kind:

1. candidates of both kinds are compiled and sized only (``measure(...,
   run=False)``: ``memory_analysis()``, no run -- no tuning at this T);
2. per kind, the candidate with the fewest step evaluations
   (``autoremat.bounds.cost``) whose compiled total is within ``--limit`` is
   chosen (ties: less memory);
3. the chosen schedule's step is compiled and run once: compiled total and
   temp, the wall time of that one run (``block_until_ready``; it includes
   first-run allocation), the loss (must be finite).

Results are written after every run to ``--out`` (markdown)::

    nohup python studies/long_sequence.py > runs/long_sequence.log 2>&1 &
    python studies/long_sequence.py --reference-only   # add the compile-only reference rows

``--reference-only`` compiles (never runs) what cannot run here -- the plain
scan of each loss, and the unfused seq2seq step under the chosen nested
schedule (its ``(T, B, H)`` stack of states is the floor no schedule removes)
-- and replaces the reference section of ``--out``.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import autoremat

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from autoremat import Schedule, measure
from autoremat._measure.device import environment
from autoremat._measure.measurement import Measurement
from autoremat._models.seed_lstm import seed_lstm
from autoremat._units import format_bytes, parse_bytes
from autoremat.bounds import cost

LOSSES = {"last": {"seq2seq": False}, "seq2seq fused": {"seq2seq": True, "fused_readout": True}}


def candidates(seq_len: int) -> dict[str, list[Schedule]]:
    """Nested (2 and 3 levels) and binomial schedules worth sizing at ``seq_len``."""
    nothing, none = "nothing_saveable", "none"
    nested = [autoremat.root(seq_len, 2, [nothing, none]),
              autoremat.root(seq_len, 3, [nothing, nothing, none]),
              autoremat.root(seq_len, 3, nothing)]
    binomial = [autoremat.binomial(s) for s in (64, 1024, 4096) if s < seq_len]
    return {"nested": nested, "binomial": binomial}


def pick(sized: Sequence[tuple[Schedule, Measurement]], seq_len: int,
         limit: int) -> tuple[Schedule, Measurement] | None:
    """The fewest evaluations among those that compiled within ``limit`` (ties: less memory)."""
    fits = [(s, m) for s, m in sized if m.feasible and m.total_bytes is not None
            and m.total_bytes <= limit]
    return min(fits, key=lambda sm: (cost(sm[0], seq_len).evaluations, sm[1].total_bytes),
               default=None)


def run_once(loss: str, schedule: Schedule, seq_len: int, batch: int) -> dict[str, Any]:
    """Compile and run the train step once; memory from ``memory_analysis()``."""
    import jax
    import numpy as np

    from autoremat._measure.measure import _memory_parts, _total

    step, args = seed_lstm(seq_len=seq_len, batch=batch, **LOSSES[loss]).build(schedule)
    t0 = time.perf_counter()
    compiled = jax.jit(step).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    parts = _memory_parts(compiled)
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    step_s = time.perf_counter() - t0
    value = float(np.asarray(out[2]))
    return {"total": _total(parts), "temp": parts["temp"], "compile_s": compile_s,
            "step_s": step_s, "loss": value, "finite": math.isfinite(value)}


REFERENCE = "## Reference: compiled only, not run"


def reference(out: Path, seq_len: int, batch: int) -> None:
    """Replace ``out``'s reference section with compile-only sizes (see the module doc)."""
    rows = []
    nested = candidates(seq_len)["nested"][0]
    cases = [("last", {"seq2seq": False}, autoremat.plain(seq_len)),
             ("seq2seq fused", LOSSES["seq2seq fused"], autoremat.plain(seq_len)),
             ("seq2seq (unfused)", {"seq2seq": True}, autoremat.plain(seq_len)),
             ("seq2seq (unfused)", {"seq2seq": True}, nested)]
    for loss, kwargs, s in cases:
        m = measure(seed_lstm(seq_len=seq_len, batch=batch, **kwargs), s, run=False)
        print(f"{loss} {s.describe()}: total {format_bytes(m.total_bytes)} {m.reason}", flush=True)
        rows.append(f"| {loss} | {s.describe()} | {format_bytes(m.total_bytes)} | "
                    f"{format_bytes(m.temp_bytes)} | {format_bytes(m.stacked_bytes)} |")
    text = out.read_text().split(REFERENCE)[0].rstrip() if out.is_file() else ""
    out.write_text(f"{text}\n\n{REFERENCE}\n\nWhat this machine cannot run at T={seq_len:,}, "
                   "sized by `memory_analysis()`: the plain scan, and the unfused seq2seq step, "
                   "whose stacked (T, B, H) states (and their cotangent) no schedule removes.\n\n"
                   "| loss | schedule | compiled total | temp | stacked by the scan |\n"
                   "|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def write(out: Path, header: str, sizing: list[str], runs: list[str]) -> None:
    head = ("| loss | kind | schedule | evaluations/T | total | temp | step (one run) | "
            "compile | loss value | finite |\n|---|---|---|---|---|---|---|---|---|---|")
    sizes = ("| loss | kind | schedule | evaluations/T | compiled total | temp | stacked |\n"
             "|---|---|---|---|---|---|---|")
    out.write_text("\n\n".join([header, "## Train steps run", head + "\n" + "\n".join(runs),
                                "## Compile-only sizing (how the schedules were picked)",
                                sizes + "\n" + "\n".join(sizing)]) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seq-len", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, help="default: seed_lstm's")
    p.add_argument("--limit", default="4GB", help="largest compiled total to pick (4GB)")
    p.add_argument("--losses", default="last,seq2seq fused")
    p.add_argument("--out", default="studies/results/long_sequence.md")
    p.add_argument("--reference-only", action="store_true",
                   help="only (re)write the compile-only reference section of --out")
    args = p.parse_args(argv)
    if args.reference_only:
        reference(Path(args.out), args.seq_len, args.batch)
        return
    limit, t = parse_bytes(args.limit), args.seq_len
    env = environment()
    sizes = f"B={args.batch}, " if args.batch else ""
    header = (f"# The seed LSTM at T={t:,} ({sizes}seed_lstm's sizes), one train step each\n\n"
              f"Generated by `python studies/long_sequence.py --seq-len {t}` on {env['device_kind']}"
              f" ({env['platform']}), jax {env['jax_version']}, flax {env['flax_version']}, "
              f"{os.cpu_count()} cores (shared). Memory: `compiled.memory_analysis()` (total = "
              "argument + output + temp - alias). Schedules picked by compile-only sizing: "
              f"fewest step evaluations with a total <= {format_bytes(limit)}. Step time: the "
              "wall time of one run (includes first-run allocation).")
    sizing: list[str] = []
    runs: list[str] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    losses = [s.strip() for s in args.losses.split(",") if s.strip()]
    chosen: dict[tuple[str, str], Schedule | None] = {}
    for loss in losses:
        problem = seed_lstm(seq_len=t, batch=args.batch, **LOSSES[loss])
        for kind, cands in candidates(t).items():
            sized = []
            for s in cands:
                t0 = time.perf_counter()
                m = measure(problem, s, run=False)
                sized.append((s, m))
                print(f"{loss} {s.describe()}: total {format_bytes(m.total_bytes)} temp "
                      f"{format_bytes(m.temp_bytes)} {m.reason} ({time.perf_counter() - t0:.0f} s)",
                      flush=True)
                sizing.append(f"| {loss} | {kind} | {s.describe()} | {cost(s, t).evaluations / t:.2f}"
                              f" | {format_bytes(m.total_bytes)} | {format_bytes(m.temp_bytes)} | "
                              f"{format_bytes(m.stacked_bytes)} |")
            best = pick(sized, t, limit)
            chosen[loss, kind] = None if best is None else best[0]
    write(out, header, sizing, runs)
    for kind in candidates(t):  # nested first: both losses get a row soonest
        for loss in losses:
            s = chosen[loss, kind]
            if s is None:
                runs.append(f"| {loss} | {kind} | none within {format_bytes(limit)} | | | | | | | |")
                continue
            print(f"{loss} {kind}: running {s.describe()}", flush=True)
            r = run_once(loss, s, t, args.batch)
            print(f"  {r}", flush=True)
            runs.append(f"| {loss} | {kind} | {s.describe()} | {cost(s, t).evaluations / t:.2f} | "
                        f"{format_bytes(r['total'])} | {format_bytes(r['temp'])} | "
                        f"{r['step_s']:.3g} s | {r['compile_s']:.3g} s | {r['loss']:.6g} | "
                        f"{r['finite']} |")
            write(out, header, sizing, runs)

if __name__ == "__main__":
    main()
