"""Study (not a test): N fresh default tunes, as a new user runs them, tabulated.

Each run is ``autoremat tune --budget 4GB`` (the built-in seed LSTM, T=10^4, its readout
fused or not: a choice) in a fresh temporary folder (a fresh study, a fresh probe cache),
in its own process, one after another. From each run's printed table: the pick, its
``vs plain`` (the tuner's own figures: the pick's and the plain scan's step), its step,
the trials measured and the run's wall time; from its study, how many trials the search
re-timed beside its leader (``autoremat._search.retime``). Then, unless ``--no-check``,
this script runs the pick and the plain scan in turn itself (``--rounds`` runs each after
a warm-up, in one process) for an independent ratio.

Run it alone on the machine (it times steps)::

    flock /tmp/autoremat-heavy.lock python studies/fresh_tunes.py --runs 5

It writes ``studies/results/fresh_tunes.md`` and ``.json`` (after each run), and each
run's output to ``studies/results/fresh_tunes/runN.txt``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autoremat._atomic import atomic_write_text
from autoremat._units import parse_bytes

RESULTS = Path(__file__).parent / "results"
#: Each run's printed output (its trials, one line each).
LOGS = RESULTS / "fresh_tunes"
COMMAND = ["tune", "--budget", "4GB"]
#: ``  best (trial 9)   27.1 MB   10.7 MB   1.24 s   0.95x  834x3x4 ...``
ROW = re.compile(r"^\s+(best|plain) \(trial (\d+)\)\s+(\S+ \S+)\s+(\S+ \S+)\s+(\S+) (m?s)\s+"
                 r"(?:([\d.]+)x)?\s+(.*)$")
MEASURED = re.compile(r"\((\d+) schedules measured in the study")
#: ``  within noise of the plain scan (trial 0: 2.15 s; +0.1%, runs spread 2.3%), 28.2x less
#: memory``: the pick won a tie on memory (``autoremat._search.trials.tie_break``).
TIE = re.compile(r"^\s+within noise of (.*)$")
#: ``compile cache: 3 of 40 schedule compiles read back (8%)`` (before: ``compiles``)
CACHE = re.compile(r"compile cache(?: \(yours\))?: (\d+) of (\d+) (?:schedule )?compiles read back")


@dataclass
class Run:
    """One fresh tune: what it printed and how long it took."""

    run: int
    pick: str
    pick_trial: int
    pick_seconds: float
    vs_plain: float | None
    plain_seconds: float | None
    trials: int
    retimed: int
    wall_seconds: float
    memory_vs_plain: float | None = None
    tie: str = ""
    cache_hits: int | None = None
    cache_looked: int | None = None
    check_pick_seconds: float | None = None
    check_plain_seconds: float | None = None

    @property
    def check_ratio(self) -> float | None:
        if self.check_pick_seconds is None or not self.check_plain_seconds:
            return None
        return self.check_pick_seconds / self.check_plain_seconds


def _seconds(value: str, unit: str) -> float:
    return float(value) / (1000.0 if unit == "ms" else 1.0)


def parse(out: str) -> dict[str, Any]:
    """The pick's and the plain scan's rows and the trial count of a tune's output."""
    rows = {}
    for line in out.splitlines():
        m = ROW.match(line)
        if m and m.group(1) not in rows:
            rows[m.group(1)] = m
    best, plain = rows.get("best"), rows.get("plain")
    if best is None:
        raise SystemExit(f"no pick in the tune's output:\n{out}")
    trials = MEASURED.search(out)
    tie = next((m.group(1) for m in map(TIE.match, out.splitlines()) if m), "")
    cache = CACHE.search(out)
    pick_bytes = _bytes(best.group(3))
    plain_bytes = _bytes(plain.group(3)) if plain else None
    return {"pick": best.group(8).strip(), "pick_trial": int(best.group(2)),
            "pick_seconds": _seconds(best.group(5), best.group(6)),
            "vs_plain": float(best.group(7)) if best.group(7) else None,
            "plain_seconds": _seconds(plain.group(5), plain.group(6)) if plain else None,
            "trials": int(trials.group(1)) if trials else -1,
            "memory_vs_plain": (pick_bytes / plain_bytes if pick_bytes is not None
                                and plain_bytes else None),
            "tie": tie, "cache_hits": int(cache.group(1)) if cache else None,
            "cache_looked": int(cache.group(2)) if cache else None}


def _bytes(text: str) -> int | None:
    """A table's ``27.1 MB`` as bytes (``None``: not a size)."""
    try:
        return parse_bytes(text.replace(" ", ""), "total")
    except Exception:
        return None


def retimed_count(folder: Path) -> int:
    """How many trials of the run's study carry a re-timing (``retimed:N`` study attrs)."""
    import optuna

    storage = f"sqlite:///{folder / 'runs' / 'autoremat.db'}"
    summaries = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summaries[0].study_name, storage=storage)
    return sum(1 for k in study.user_attrs if k.startswith("retimed:"))


def check(folder: Path, rounds: int) -> tuple[float, float]:
    """The pick (``schedule.yaml``) and the plain scan, fused as the tune's plain trial,
    run in turn in this process: their median seconds."""
    import jax

    import autoremat
    from autoremat._measure.measure import compile_schedule
    from autoremat._models.seed_lstm import seed_lstm
    from autoremat._schedules import read_schedule

    problem = seed_lstm(fused_readout=None)
    pick = read_schedule(folder / "schedule.yaml")
    plain = autoremat.plain(problem.seq_len).with_fuse(True)
    compiled = [compile_schedule(problem, s) for s in (pick, plain)]
    times: list[list[float]] = [[], []]
    for c in compiled:
        jax.block_until_ready(c.executable(*c.args))
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled[i].executable(*compiled[i].args))
            times[i].append(time.perf_counter() - t0)
    for c in compiled:
        c.release()
    return statistics.median(times[0]), statistics.median(times[1])


def one(number: int, rounds: int) -> Run:
    with tempfile.TemporaryDirectory(prefix="fresh_tune_") as tmp:
        folder = Path(tmp)
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "autoremat.cli", *COMMAND], cwd=folder,
                              capture_output=True, text=True)
        wall = time.monotonic() - start
        if done.returncode != 0:
            raise SystemExit(f"run {number}: tune exited {done.returncode}:\n{done.stderr}")
        atomic_write_text(LOGS / f"run{number}.txt", done.stdout)  # every trial's line
        run = Run(run=number, **parse(done.stdout), retimed=retimed_count(folder),
                  wall_seconds=round(wall, 1))
        if rounds:
            run.check_pick_seconds, run.check_plain_seconds = check(folder, rounds)
    return run


def table(runs: list[Run], rounds: int) -> str:
    lines = [
        "# Fresh default tunes (`studies/fresh_tunes.py`)",
        "",
        f"`autoremat {' '.join(COMMAND)}` (the built-in seed LSTM, T=10^4, its readout fused "
        "or not: a choice), each run in a fresh folder (a fresh study and probe cache), one "
        "after another, on this machine's CPU. *vs plain*: the tune's own figures (its "
        "table). *re-timed*: trials the search ran in turn beside its leader before it "
        "stopped (`autoremat._search.retime`). *in turn*: the pick and the plain scan run "
        f"in turn by this script afterwards, {rounds} runs each after a warm-up (the ratio of "
        "their medians).",
        "",
        "*memory*: the pick's total over the plain scan's. *tie*: the pick won a tie on "
        "memory with the fastest, within the measured noise (the tune's line). *cache*: "
        "schedule compiles read back from the compile cache, of those that looked.",
        "",
        "| run | pick | step | vs plain | in turn | memory | tie | trials | re-timed | cache "
        "| wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        ratio = r.check_ratio
        cache = "-" if r.cache_looked is None else f"{r.cache_hits} of {r.cache_looked}"
        lines.append(
            f"| {r.run} | {r.pick} (trial {r.pick_trial}) | {r.pick_seconds:.3g} s | "
            f"{'-' if r.vs_plain is None else f'{r.vs_plain:.2f}x'} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x'} | "
            f"{'-' if r.memory_vs_plain is None else f'{r.memory_vs_plain:.3f}x'} | "
            f"{r.tie or '-'} | {r.trials} | {r.retimed} | {cache} | {r.wall_seconds:.0f} s |")
    good = [r for r in runs if r.vs_plain is not None and r.vs_plain <= 0.95]
    small = [r for r in runs if r not in good and r.memory_vs_plain is not None
             and r.memory_vs_plain <= 0.1]
    lines += ["", f"Picks at or under 0.95x plain (the tune's figures): {len(good)} of "
              f"{len(runs)}; of the others, at or under 1/10 of plain's memory: {len(small)} "
              f"(the target: {len(runs)} of {len(runs)} in all)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5,
                        help="runs in turn of the pick and the plain scan (0: no check)")
    parser.add_argument("--no-check", action="store_true")
    args = parser.parse_args()
    rounds = 0 if args.no_check else args.rounds
    runs: list[Run] = []
    for n in range(1, args.runs + 1):
        runs.append(one(n, rounds))
        print(runs[-1], flush=True)
        atomic_write_text(RESULTS / "fresh_tunes.json", json.dumps(
            [{**asdict(r), "check_ratio": r.check_ratio} for r in runs], indent=1) + "\n")
        atomic_write_text(RESULTS / "fresh_tunes.md", table(runs, rounds))


if __name__ == "__main__":
    main()
