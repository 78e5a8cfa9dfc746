"""Binomial (Revolve) against nested schedules on the seed's LSTM train step.

Runs, in one process on the same machine, the plain scan, the nested
schedules a user or the tuner would pick (per-step remat, sqrt(T) two levels,
cube-root three levels, a deep minimum-memory one) and binomial schedules
over a range of snapshot counts, and prints for each: temp and total bytes
(``memory_analysis()``), the median step time and its ratio to the plain
scan, step evaluations per step (``autoremat.bounds``), and whether the loss
matches the plain scan's. It then names, on the measured front (memory vs
time), where binomial beats the best nested schedule and where it loses.

    python studies/binomial.py                    # T = 10^4, both losses (~10 min on 2 CPUs)
    python studies/binomial.py --seq-len 100000 --last-only --quick   # T = 10^5

Writes ``studies/results/binomial.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import autoremat
from autoremat import Schedule, bounds
from autoremat._atomic import atomic_write_text
from autoremat._measure.device import environment
from autoremat._search.pareto import dominates
from autoremat._units import format_bytes


@dataclass(frozen=True)
class Row:
    label: str
    kind: str
    schedule: Schedule
    temp: int | None
    total: int | None
    step: float | None
    loss: float | None
    recompute: float
    vs_optimum: float
    reason: str


def candidates(seq_len: int, quick: bool) -> list[tuple[str, Schedule]]:
    stored, remat = "everything_saveable", "nothing_saveable"
    out = [
        ("plain scan", autoremat.plain(seq_len)),
        ("per-step remat", autoremat.nested([seq_len], remat)),
        ("sqrt 2 levels", autoremat.root(seq_len, 2, [remat, stored])),
        ("cube 3 levels", autoremat.root(seq_len, 3, [remat, remat, stored])),
        ("deep 4 levels", autoremat.root(seq_len, 4, remat)),
    ]
    snapshots = (8, 32, 128) if quick else (4, 8, 16, 32, 64, 128, 256)
    out += [(f"binomial s={s}", autoremat.binomial(s)) for s in snapshots if s < seq_len]
    return out


def run(seq_len: int, seq2seq: bool, quick: bool, time_budget: float) -> list[Row]:
    problem = autoremat.seed_lstm(seq_len=seq_len, seq2seq=seq2seq)
    rows = []
    for label, schedule in candidates(seq_len, quick):
        t0 = time.perf_counter()
        m = autoremat.measure(problem, schedule, time_budget=time_budget, min_repeats=1 if quick else 3)
        c = bounds.cost(schedule, seq_len)
        rows.append(Row(label, schedule.kind, schedule, m.temp_bytes, m.total_bytes, m.step_seconds,
                        m.loss, c.recompute_factor, bounds.distance_to_optimum(schedule, seq_len),
                        m.reason))
        print(f"  {label:<16} {schedule.describe():<44} temp {format_bytes(m.temp_bytes):>10}  "
              f"step {m.step_seconds if m.step_seconds is not None else float('nan'):7.3f} s  "
              f"({time.perf_counter() - t0:.0f} s wall) {m.reason}", file=sys.stderr, flush=True)
    return rows


def front(rows: list[Row]) -> list[Row]:
    timed = [r for r in rows if r.step is not None and r.total is not None]
    return sorted((r for r in timed
                   if not any(dominates((o.total, o.step), (r.total, r.step)) for o in timed)),
                  key=lambda r: r.total)


def verdict(rows: list[Row]) -> list[str]:
    """Where binomial beats the best nested schedule at the same memory, and where it loses."""
    timed = [r for r in rows if r.step is not None and r.total is not None]
    nested = [r for r in timed if r.kind == "nested"]
    lines = []
    for b in (r for r in timed if r.kind == "binomial"):
        fits = [n for n in nested if n.temp is not None and b.temp is not None and n.temp <= b.temp]
        if not fits:
            smallest = min(nested, key=lambda n: n.temp or 0)
            lines.append(f"- {b.label}: temp {format_bytes(b.temp)}, below every nested schedule "
                         f"(smallest: {smallest.label} {format_bytes(smallest.temp)}); "
                         f"{b.step / smallest.step:.2f}x its step time: **binomial wins on memory**")
            continue
        best = min(fits, key=lambda n: n.step)
        word = "faster" if b.step < best.step else "slower"
        lines.append(f"- {b.label}: temp {format_bytes(b.temp)}; the fastest nested schedule within "
                     f"that temp is {best.label} ({format_bytes(best.temp)}, {best.step:.3g} s): "
                     f"binomial is {b.step / best.step:.2f}x, {word}")
    binomials = [r for r in timed if r.kind == "binomial"]
    if nested and binomials:
        fast_n, fast_b = min(nested, key=lambda r: r.step), min(binomials, key=lambda r: r.step)
        word = "loses" if fast_b.step > fast_n.step else "wins"
        lines.append(f"- fastest overall: nested {fast_n.label} {fast_n.step:.3g} s "
                     f"({format_bytes(fast_n.temp)}) vs {fast_b.label} {fast_b.step:.3g} s "
                     f"({format_bytes(fast_b.temp)}): binomial {word} at the fast end")
    return lines


def markdown(results: dict[str, list[Row]], env: dict, command: str) -> str:
    out = ["# Binomial (Revolve) vs nested schedules, seed LSTM train step", "",
           f"Measured on {env['device_kind']} ({env['platform']}), jax {env['jax_version']}, "
           f"flax {env['flax_version']}; `{command}`. Memory from `memory_analysis()`, time the "
           "median of timed runs in the same process; recompute = step evaluations per step "
           "(`autoremat.bounds.cost`), vs opt = over the fewest any schedule storing as many "
           "carries needs.", ""]
    for name, rows in results.items():
        plain = next(r for r in rows if r.label == "plain scan")
        on_front = {id(r) for r in front(rows)}
        out += [f"## {name}", "",
                "| schedule | temp | total | step s | vs plain | recompute | vs opt | loss = plain | front |",
                "|---|---:|---:|---:|---:|---:|---:|:---:|:---:|"]
        for r in rows:
            ratio = f"{r.step / plain.step:.2f}" if r.step and plain.step else "-"
            same = ("yes" if r.loss is not None and plain.loss is not None
                    and math.isclose(r.loss, plain.loss, rel_tol=1e-5) else "no")
            out.append(f"| {r.label}: `{r.schedule.describe()}` | {format_bytes(r.temp)} | "
                       f"{format_bytes(r.total)} | {r.step:.3f} | {ratio} | {r.recompute:.2f} | "
                       f"{r.vs_optimum:.2f} | {same} | {'*' if id(r) in on_front else ''} |"
                       if r.step is not None else
                       f"| {r.label}: `{r.schedule.describe()}` | {format_bytes(r.temp)} | "
                       f"{format_bytes(r.total)} | - | - | {r.recompute:.2f} | {r.vs_optimum:.2f} "
                       f"| - | {r.reason} |")
        out += ["", *verdict(rows), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=10_000)
    parser.add_argument("--last-only", action="store_true", help="only the seq2seq=False loss")
    parser.add_argument("--quick", action="store_true", help="fewer schedules, one timed run each")
    parser.add_argument("--time-budget", type=float, default=6.0, help="seconds of timed runs per row")
    parser.add_argument("--out", type=Path, default=Path("studies/results/binomial.md"))
    args = parser.parse_args(argv)
    results = {}
    for seq2seq in ((False,) if args.last_only else (False, True)):
        name = f"T={args.seq_len}, {'seq2seq' if seq2seq else 'loss on the last step'}"
        print(name, file=sys.stderr)
        results[name] = run(args.seq_len, seq2seq, args.quick, args.time_budget)
    command = "python studies/binomial.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(results, environment(), command.strip())
    atomic_write_text(args.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
