"""Benchmark (issue 12; not a test): ``tune`` against an exhaustive grid.

Per case, on the seed LSTM (``autoremat.seed_lstm``, hidden 128, batch 10):

1. the budget: a fraction of the plain scan's compiled total (sized only);
2. ``tune`` on a fresh study (its default time limit unless ``--tune-limit``);
3. the grid (``grid``, >= 100 schedules: depth 1 with every policy, depth 2
   over a ladder of inner lengths x 8 policy pairs, depth 3 and 4 over
   length triples/quads x policies, binomial over a ladder of snapshots),
   screened by compiled memory first and timed only where it fits;
4. the tuner's pick and the grid's best timed back to back, interleaved,
   in this process, so machine noise cancels;
5. the cost model (``autoremat._search.planning.predict.TimeModel``) calibrated on the
   tuner's timed trials, scored on every schedule the grid timed.

Every figure is measured in this run; the table goes to
``studies/results/bench_tune.md`` (rewritten after each case)::

    python studies/bench_tune.py --quick          # the T=10^4 cases
    python studies/bench_tune.py --cases c --grid-repeats 0 --rounds 3
    python studies/bench_tune.py --cases d,e --grid-repeats 0 --rounds 1   # ~1.5 h
    python studies/bench_tune.py --cases f --grid-repeats 0 --rounds 3     # T=2x10^5
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import autoremat
from autoremat._cli.printing import event_line
from autoremat._measure.measure import compile_schedule
from autoremat._measure.measurement import Measurement
from autoremat._measure.problem import Problem
from autoremat._measure.timing import time_compiled
from autoremat._models.seed_lstm import seed_lstm
from autoremat._schedules.base import Schedule
from autoremat._schedules.binomial import snapshot_range
from autoremat._search.planning.predict import Structure, TimeModel
from autoremat._search.short_runs import SHORT_SEQ_LEN, ShortRuns
from autoremat._search.study import load_study, measured_trials
from autoremat._search.tune import DEFAULT_TIME_LIMIT, tune
from autoremat._units import format_seconds

RESULTS = Path(__file__).parent / "results" / "bench_tune.md"
CASES = {  # name: (T, loss, budget: a fraction of plain's total, or bytes)
    "a": (10_000, "seq2seq", 0.25),
    "b": (10_000, "last", 0.05),
    # The issue asked for 2% here, but at T=10^5 the arguments alone (the input x,
    # 129.0 MB) are 2.01% of plain's 6.40 GB total, so nothing fits 2% (the tuner rightly
    # found nothing); 2.5% (160 MB) leaves 31 MB for the schedule's own temp.
    "c": (100_000, "last", 0.025),
    # The top of the range (issue 21): the grid is ``top_grid``, timed once each.
    "d": (1_000_000, "last", 2e9),
    "e": (1_000_000, "fused", 2e9),
    # A long recurrence at the default limit: its grid is ``mid_grid`` (15 points).
    "f": (200_000, "last", 0.025),
}
#: Cases whose full-length grid is ``top_grid`` (one step takes minutes).
TOP = ("d", "e")
#: Cases whose grid is ``mid_grid``.
MID = ("f",)
PAIRS = [(o, i) for o in ("nothing_saveable", "dots_saveable")
         for i in ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
                   "everything_saveable")]
DEEP = [("nothing_saveable", "nothing_saveable", "everything_saveable"),
        ("nothing_saveable", "dots_saveable", "everything_saveable"),
        ("dots_saveable", "dots_saveable", "everything_saveable"),
        ("nothing_saveable", "nothing_saveable", "nothing_saveable")]


def top_grid(seq_len: int) -> list[Schedule]:
    """Ten schedules at ``T = 10^6``: depths 2-4 with the tuner's policy families, and
    binomial -- what the full-length grid of a top-of-range case times once each."""
    ne, nde = ("nothing_saveable", "everything_saveable"), ("nothing_saveable", "dots_saveable")
    three = ("nothing_saveable", "nothing_saveable", "everything_saveable")
    three_dots = ("nothing_saveable", "dots_saveable", "everything_saveable")
    return [
        autoremat.nested([seq_len // 1000, 1000], list(ne)),
        autoremat.nested([seq_len // 1000, 1000], list(nde)),
        autoremat.nested([seq_len // 100, 10, 10], list(three)),
        autoremat.nested([seq_len // 100, 10, 10], list(three_dots)),
        autoremat.nested([seq_len // 1000, 100, 10], list(three)),
        autoremat.nested([100, 100, 100], list(three)),
        autoremat.nested([seq_len // 1000, 10, 10, 10], ["nothing_saveable"] * 3
                         + ["everything_saveable"]),
        autoremat.binomial(16),
        autoremat.binomial(64),
        autoremat.binomial(256),
    ]


def mid_grid(seq_len: int) -> list[Schedule]:
    """Fifteen schedules at ``T = 2 x 10^5`` (any ``T`` divisible by 4000): two and three
    levels over a ladder of inner lengths with the tuner's policy families, four levels,
    an unrolled innermost loop, and binomial."""
    ne, nde = ["nothing_saveable", "everything_saveable"], ["nothing_saveable", "dots_saveable"]
    three = ["nothing_saveable", "nothing_saveable", "everything_saveable"]
    three_dots = ["nothing_saveable", "dots_saveable", "everything_saveable"]
    return [
        autoremat.nested([seq_len // 500, 500], ne),
        autoremat.nested([seq_len // 1000, 1000], ne),
        autoremat.nested([seq_len // 1000, 1000], nde),
        autoremat.nested([seq_len // 2000, 2000], ne),
        autoremat.nested([seq_len // 1000, 1000], ne, unroll=2),
        autoremat.nested([seq_len // 100, 10, 10], three),
        autoremat.nested([seq_len // 100, 10, 10], three_dots),
        autoremat.nested([seq_len // 400, 20, 20], three),
        autoremat.nested([seq_len // 1000, 100, 10], three),
        autoremat.nested([seq_len // 4000, 40, 100], three),
        autoremat.nested([seq_len // 1000, 10, 10, 10], ["nothing_saveable"] * 3
                         + ["everything_saveable"]),
        autoremat.nested([seq_len // 4000, 20, 20, 10], ["nothing_saveable"] * 3
                         + ["everything_saveable"]),
        autoremat.binomial(16),
        autoremat.binomial(64),
        autoremat.binomial(256),
    ]


def grid_of(case: str) -> list[Schedule]:
    """The case's grid: ``top_grid``, ``mid_grid`` or the exhaustive ``grid``."""
    seq_len = CASES[case][0]
    return (top_grid if case in TOP else mid_grid if case in MID else grid)(seq_len)


def grid(seq_len: int) -> list[Schedule]:
    """The exhaustive grid (see the module doc); lengths scale with ``T``."""
    scale = seq_len / 10_000
    out = [autoremat.nested([seq_len], [p]) for p in
           ("none", "nothing_saveable", "dots_saveable", "everything_saveable")]
    out.append(autoremat.nested([seq_len], ["none"], unroll=2))
    for inner in (10, 25, 50, 100, 200, 400, 1000):
        n = max(2, round(inner * math.sqrt(scale)))
        for pair in PAIRS:
            out.append(autoremat.nested([math.ceil(seq_len / n), n], list(pair)))
    for mid, inner in ((10, 10), (20, 20), (25, 40), (50, 20), (10, 100), (100, 10)):
        lengths = [max(2, round(x * scale ** (1 / 3))) for x in (mid, inner)]
        for pols in DEEP:
            out.append(autoremat.nested([math.ceil(seq_len / math.prod(lengths)), *lengths],
                                        list(pols)))
    for quad in ((10, 10, 10), (5, 10, 20), (20, 10, 5)):
        lengths = [max(2, round(x * scale ** 0.25)) for x in quad]
        for pols in (("nothing_saveable",) * 3 + ("everything_saveable",),
                     ("nothing_saveable",) * 2 + ("dots_saveable", "everything_saveable")):
            out.append(autoremat.nested([math.ceil(seq_len / math.prod(lengths)), *lengths],
                                        list(pols)))
    low, high = snapshot_range(seq_len)
    ladder = sorted({round(low * (high / low) ** (i / 9)) for i in range(10)})
    out += [autoremat.binomial(s) for s in ladder]
    return out


@dataclass
class Outcome:
    case: str
    label: str
    budget: int
    grid_size: int
    grid_timed: int
    grid_wall: float
    tune_timed: int
    tune_cut: int
    tune_wall: float
    pick: str
    grid_best: str
    pick_step: float
    best_step: float
    model_median_err: float
    model_max_err: float
    model_rank: float
    short: str  # short-run prediction errors over the grid (autoremat._search.short_runs)
    confirmed: str  # the tuner's full-length confirmations: predicted / measured

    def row(self) -> str:
        return (f"| {self.case} | {self.label} | {self.budget / 1e6:.0f} MB | "
                f"{self.pick} | {self.grid_best} | {self.pick_step:.3f} / {self.best_step:.3f}"
                f" = **{self.pick_step / self.best_step:.2f}** | {self.tune_wall:.0f} / "
                f"{self.grid_wall:.0f} = **{self.tune_wall / self.grid_wall:.2f}** | "
                f"{self.tune_timed} (+{self.tune_cut} cut) | {self.grid_timed} of "
                f"{self.grid_size} | {self.model_median_err:.0%} / {self.model_max_err:.0%} / "
                f"{self.model_rank:.2f} | {self.short} | {self.confirmed} |")


def interleaved(problem: Problem, a: Schedule, b: Schedule, rounds: int) -> tuple[float, float]:
    """Median step seconds of ``a`` and ``b``, run alternately (after one warm-up each)."""
    ca, cb = compile_schedule(problem, a), compile_schedule(problem, b)
    assert ca.executable is not None and cb.executable is not None
    import jax

    times: dict[int, list[float]] = {0: [], 1: []}
    for c in (ca, cb):
        jax.block_until_ready(c.executable(*c.args))
    for _ in range(rounds):
        for i, c in enumerate((ca, cb)):
            t0 = time.perf_counter()
            jax.block_until_ready(c.executable(*c.args))
            times[i].append(time.perf_counter() - t0)
    return statistics.median(times[0]), statistics.median(times[1])


def _rank_corr(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for rank, i in enumerate(order):
            r[i] = float(rank)
        return r
    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else 0.0


def _problem(case: str) -> tuple[Problem, int, str]:
    """The case's problem, budget in bytes and label."""
    seq_len, loss, budget = CASES[case]
    problem = seed_lstm(seq_len=seq_len, seq2seq=loss != "last", fused_readout=loss == "fused")
    if budget < 1:
        plain = compile_schedule(problem, autoremat.plain(seq_len)).measurement
        assert plain.total_bytes is not None, plain.reason
        return (problem, int(budget * plain.total_bytes),
                f"T={seq_len}, {loss}, {budget * 100:g}% of plain")
    return problem, int(budget), f"T={seq_len}, {loss}, {budget / 1e9:g} GB"


def _short_errors(pairs: list[tuple[float, float]]) -> str:
    """Median / max |predicted / measured - 1|, and whether the prediction orders the
    five fastest as measured (Spearman's rank correlation over them)."""
    if not pairs:
        return "-"
    errs = sorted(abs(p / r - 1.0) for p, r in pairs)
    top = sorted(pairs, key=lambda pr: pr[1])[:5]
    rank = _rank_corr([p for p, _ in top], [r for _, r in top]) if len(top) > 1 else 1.0
    return (f"{statistics.median(errs):.1%} / {errs[-1]:.1%} ({len(pairs)}), "
            f"top-5 rank {rank:.2f}")


def run_case(case: str, time_budget: float, tune_limit: str | None, rounds: int,
             log: list[str], grid_repeats: int = 3) -> Outcome:
    seq_len = CASES[case][0]
    problem, budget, label = _problem(case)
    print(f"case {case}: {label}: budget {budget} bytes", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{tmp}/bench.db"
        t0 = time.perf_counter()
        result = tune(problem, budget, storage=storage, study_name=case, time_budget=time_budget,
                      on_confirm=lambda event: print(f"  {event_line(event)}", flush=True),
                      time_limit=tune_limit if tune_limit else DEFAULT_TIME_LIMIT)
        tune_wall = time.perf_counter() - t0
        trials = measured_trials(load_study(case, storage))
    tuned = [t for t in trials if t.measurement.step_seconds is not None]
    cut = [t for t in trials if t.measurement.cut]
    assert result.best_trial is not None, "the tuner found nothing that fits"
    confirmed = "; ".join(f"{format_seconds(t.measurement.extrapolated_seconds)} / "
                          f"{format_seconds(t.measurement.step_seconds)}"
                          for t in result.confirmed) or (result.unconfirmed or "-")
    print(f"  tuner: {tune_wall:.0f} s, {len(tuned)} timed + {len(cut)} cut, pick "
          f"{result.best_trial.schedule.describe()} {result.best_trial.measurement.step_seconds}"
          f"; confirmed (predicted / measured): {confirmed}", flush=True)

    schedules = grid_of(case)
    short_runs = ShortRuns(problem)
    t0 = time.perf_counter()
    timed: list[tuple[Schedule, Measurement]] = []
    predicted: list[tuple[float, float]] = []  # (short-run prediction, full-length time)
    short_wall = 0.0
    for s in schedules:
        compiled = compile_schedule(problem, s, budget_bytes=budget)
        if compiled.executable is not None:
            m = time_compiled(compiled, budget_bytes=budget, time_budget=time_budget,
                              min_repeats=grid_repeats or None)
            if m.step_seconds is not None:
                timed.append((s, m))
                print(f"  grid {len(timed)}: {s.describe()} {m.step_seconds:.3f}", end="",
                      flush=True)
                t1 = time.perf_counter()
                p = short_runs.time(s, compiled, budget_bytes=budget, time_budget=time_budget,
                                    best=None)
                short_wall += time.perf_counter() - t1
                if p.step_seconds is not None and p.predicted(seq_len):
                    predicted.append((p.step_seconds, m.step_seconds))
                    print(f"  predicted from T'={p.timed_seq_len}: {p.step_seconds:.3f}",
                          end="")
                print(flush=True)
            compiled.release()
    grid_wall = time.perf_counter() - t0 - short_wall
    best_s, _ = min(timed, key=lambda sm: sm[1].step_seconds or math.inf)

    model = TimeModel()
    model.fit([(Structure.of(t.schedule, seq_len), float(t.measurement.total_bytes or 0),
                t.measurement.step_seconds or t.measurement.cut_seconds or 0.0)
               for t in tuned + cut])
    pred = [model.predict(Structure.of(s, seq_len), float(m.total_bytes or 0)) or 0.0
            for s, m in timed]
    real = [m.step_seconds or 0.0 for _, m in timed]
    errs = [abs(p - r) / r for p, r in zip(pred, real, strict=True)]

    pick = result.best_trial.schedule
    pick_step, best_step = interleaved(problem, pick, best_s, rounds)
    out = Outcome(case, label, budget, len(schedules), len(timed), grid_wall, len(tuned), len(cut),
                  tune_wall, pick.describe(), best_s.describe(), pick_step, best_step,
                  statistics.median(errs), max(errs), _rank_corr(pred, real),
                  _short_errors(predicted), confirmed)
    log[:] = [line for line in log if not line.startswith(f"| {case} |")]
    log.append(out.row())
    log.sort()
    write(log)
    print(out.row(), flush=True)
    return out


def _prose() -> list[str]:
    """The notes below the table in the results file (kept when it is rewritten)."""
    lines = RESULTS.read_text().splitlines() if RESULTS.exists() else []
    last_row = max((i for i, line in enumerate(lines) if line.startswith("| ")), default=-1)
    return lines[last_row + 1:] if last_row >= 0 else []


def write(rows: list[str]) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    prose = _prose()
    RESULTS.write_text("\n".join([
        "# `autoremat tune` against an exhaustive grid (`studies/bench_tune.py`)",
        "",
        "Seed LSTM (hidden 128, batch 10, Adam), CPU, 2 shared cores. Every number was "
        "measured in one run of the benchmark. *pick / grid best*: median step seconds of "
        "the tuner's pick and the grid's best, timed back to back, interleaved, in one "
        "process. *walls*: the tuner's whole `tune` call / the grid's screening + timing. "
        "*model*: the cost model calibrated on the tuner's timed trials, scored on every "
        "schedule the grid timed: median / max relative error of step time, Spearman rank "
        "correlation.",
        "",
        "*short runs*: every grid schedule also timed on a short run (`autoremat._search.short_runs`, "
        f"T' about {SHORT_SEQ_LEN}, whole chunks) and its full-length time predicted "
        "from it: median / max relative error (how many), and the rank correlation of "
        "prediction and measurement over the "
        "grid's five fastest (`-`: T too short for short runs). *confirmed*: the tuner's "
        "pick (and a close runner-up) predicted / measured at full length.",
        "",
        "| case | problem | budget | tuner's pick | grid's best | pick / grid best (s) | "
        "tuner wall / grid wall (s) | tuner timed | grid timed | model err med / max / rank | "
        "short runs | confirmed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows, *(prose or [""])]).rstrip("\n") + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="a,b,c", help="comma-separated: a to f (see CASES)")
    p.add_argument("--quick", action="store_true", help="the T=10^4 cases only (a, b)")
    p.add_argument("--time-budget", type=float, default=2.0, help="timing seconds per schedule")
    p.add_argument("--tune-limit", help="the tuner's --time-limit (default: its own)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved runs of pick and best")
    p.add_argument("--grid-repeats", type=int, default=3,
                   help="the grid's least timed runs per schedule (the tuner's: 3, or 1 "
                   "for a run longer than --time-budget); 0: the tuner's own rule (a step "
                   "longer than --time-budget: its one run)")
    a = p.parse_args()
    cases = ["a", "b"] if a.quick else a.cases.split(",")
    sizes = [len(grid_of(c)) for c in cases]
    print(f"grid sizes: {sizes}", flush=True)
    log = [line for line in (RESULTS.read_text().splitlines() if RESULTS.exists() else [])
           if line.startswith("| ") and not line.startswith("| case")]
    for case in cases:
        run_case(case, a.time_budget, a.tune_limit, a.rounds, log, a.grid_repeats)


if __name__ == "__main__":
    main()
