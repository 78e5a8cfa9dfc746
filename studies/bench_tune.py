"""Benchmarks of ``autoremat tune`` (issue 3); not run in CI.

Case a: the default problem (seed LSTM, T=10^4, seq2seq) with a budget of 25%
of the plain scan's measured total. Reports the chosen schedule's step time as
a ratio to the plain scan's and to the best schedule of an exhaustive grid
over a reduced space (depth <= 3, a ladder of lengths, three policies), and
the tuner's wall time as a ratio to the grid's.

Case b: T=10^5 under 4 GB: the chosen schedule against the plain scan (over
budget, measured anyway), per-cell remat, sqrt(T) two levels and cube-root
three levels (``Schedule.root``, as the tuner's first trials).

Every figure is measured in this run (``autoremat._measure.measure``)::

    python studies/bench_tune.py a [--trials 20] [--ladder 25,100,400]
    python studies/bench_tune.py b [--trials 12]
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

from autoremat._budget import format_bytes, parse_bytes
from autoremat._measure import Measurement, measure
from autoremat._problem import Problem, seed_lstm
from autoremat._schedule import Schedule
from autoremat._tune import tune

GRID_POLICIES = ("nothing_saveable", "dots_saveable", "everything_saveable")


def grid(seq_len: int, ladder: list[int]) -> list[Schedule]:
    """Depth <= 3, inner lengths from ``ladder``, each level one of three policies."""
    out = [Schedule.nested([seq_len], [p]) for p in ("none", *GRID_POLICIES)]
    for depth in (2, 3):
        for inner in itertools.product(ladder, repeat=depth - 1):
            if math.prod(inner) > seq_len // 2:
                continue
            lengths = [math.ceil(seq_len / math.prod(inner)), *inner]
            for policies in itertools.product(GRID_POLICIES, repeat=depth):
                out.append(Schedule.nested(lengths, list(policies)))
    return out


def row(label: str, m: Measurement | None, ref: float | None) -> str:
    if m is None:
        return f"| {label} | - | - | - |"
    step = m.step_seconds
    ratio = f"{step / ref:.2f}" if step and ref else "-"
    shown = f"{step:.3f} s" if step else "not run"
    return f"| {label} | {format_bytes(m.total_bytes)} | {shown} | {ratio} |"


def run_tune(problem: Problem, budget: int, trials: int, time_budget: float,
             case: str) -> tuple[str, Measurement | None, int, float]:
    """``tune`` on runs/bench.db: (row label, the chosen figures, schedules measured, wall s).

    The only code here that reads a ``TuneResult``.
    """
    t0 = time.perf_counter()
    result = tune(problem, budget, n_trials=trials, time_budget=time_budget,
                  storage="sqlite:///runs/bench.db", study_name=f"bench-{case}-{int(time.time())}")
    wall = time.perf_counter() - t0
    label = f"tuned ({result.best.describe()})" if result.best else "tuned (none fits)"
    chosen = result.best_trial.measurement if result.best_trial else None
    return label, chosen, result.measured, wall


def case_a(trials: int, ladder: list[int], time_budget: float, seq_len: int) -> None:
    problem = seed_lstm(seq_len=seq_len)
    plain = measure(problem, Schedule.plain(seq_len), time_budget=time_budget)
    assert plain.total_bytes is not None, plain.reason
    budget = int(0.25 * plain.total_bytes)
    print(f"case a: {problem.name}, plain total {format_bytes(plain.total_bytes)}, "
          f"budget 25% = {format_bytes(budget)}")
    label, chosen, tuned_count, tune_wall = run_tune(problem, budget, trials, time_budget, "a")
    schedules = grid(seq_len, ladder)
    print(f"grid: {len(schedules)} schedules (ladder {ladder}, policies {GRID_POLICIES})")
    t0 = time.perf_counter()
    measured = [(s, measure(problem, s, budget_bytes=budget, time_budget=time_budget))
                for s in schedules]
    grid_wall = time.perf_counter() - t0
    fits = [(s, m) for s, m in measured if m.feasible and m.step_seconds is not None]
    best_s, best_m = min(fits, key=lambda sm: sm[1].step_seconds or 0.0)
    print("\n| schedule | total | step | step / plain |\n|---|---|---|---|")
    print(row(f"plain ({Schedule.plain(seq_len).describe()})", plain, plain.step_seconds))
    print(row(label, chosen, plain.step_seconds))
    print(row(f"grid best ({best_s.describe()})", best_m, plain.step_seconds))
    if chosen and chosen.step_seconds and best_m.step_seconds:
        print(f"\nchosen / grid best step time: {chosen.step_seconds / best_m.step_seconds:.2f}")
    print(f"tuner wall {tune_wall:.0f} s ({tuned_count} schedules) / grid wall "
          f"{grid_wall:.0f} s ({len(schedules)} schedules) = {tune_wall / grid_wall:.2f}")


def case_b(trials: int, time_budget: float, seq_len: int, budget_text: str) -> None:
    problem: Problem = seed_lstm(seq_len=seq_len)
    budget = parse_bytes(budget_text)
    label, chosen, tuned_count, tune_wall = run_tune(problem, budget, trials, time_budget, "b")
    refs = [("plain scan", Schedule.plain(seq_len)),
            ("per-cell remat", Schedule.nested([seq_len], "nothing_saveable")),
            ("sqrt(T) 2-level", Schedule.root(seq_len, 2, ["nothing_saveable", "everything_saveable"])),
            ("cube-root 3-level", Schedule.root(seq_len, 3, ["nothing_saveable", "nothing_saveable",
                                                             "everything_saveable"]))]
    measured = [(name, s, measure(problem, s, time_budget=time_budget)) for name, s in refs]
    plain = measured[0][2]
    print(f"case b: {problem.name}, budget {format_bytes(budget)}; tuner wall {tune_wall:.0f} s "
          f"({tuned_count} schedules)")
    print("\n| schedule | total | step | step / plain |\n|---|---|---|---|")
    for name, s, m in measured:
        over = " (over budget)" if m.total_bytes and m.total_bytes > budget else ""
        print(row(f"{name}{over} ({s.describe()})", m, plain.step_seconds))
    print(row(label, chosen, plain.step_seconds))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", choices=["a", "b"])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--time-budget", type=float, default=3.0)
    p.add_argument("--ladder", default="25,100,400")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--budget", default="4GB", help="case b only")
    a = p.parse_args()
    if a.case == "a":
        case_a(a.trials, [int(x) for x in a.ladder.split(",")], a.time_budget,
               a.seq_len or 10_000)
    else:
        case_b(a.trials, a.time_budget, a.seq_len or 100_000, a.budget)


if __name__ == "__main__":
    main()
