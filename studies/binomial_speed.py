"""Binomial vs plain vs nested, timed interleaved in one process (issue 30, CPU target).

Compiles the seed LSTM train step (loss on the last state by default) under
the plain scan, a nested schedule and ``binomial s=17``, optionally also the
binomial builder of an earlier commit (``--baseline REV``: its
builder module from git, the rest of this checkout), then
times them round-robin (one warm-up each, then ``--rounds`` rounds) and prints
the medians, the ratios to plain, the step evaluations per step
(``autoremat.bounds.cost``) and the time per step evaluation against the
nested schedule's. Heavy at T=10^5 (each step ~30 s on 2 CPUs: ~10 minutes):

    python studies/binomial_speed.py --seq-len 100000 --baseline 1e727c1 \\
        --append studies/results/binomial.md
    python studies/binomial_speed.py --seq-len 2000 --rounds 2    # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import inspect
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import autoremat
from autoremat import Schedule, bounds
from autoremat._measure.device import environment
from autoremat._measure.measure import compile_schedule

ROOT = Path(__file__).resolve().parents[1]


#: Where the builder lived at a revision, newest first; and the flat modules it imported
#: before the stage packages, as they are named now.
_BUILDER_PATHS = ("autoremat/_schedules/binomial_scan.py", "autoremat/_binomial_scan.py")
_MOVED = {"autoremat._revolve": "autoremat._schedules.revolve",
          "autoremat._jax_internals": "autoremat._jax",
          "autoremat._scan.jax_internals": "autoremat._jax"}


def _baseline_builder(rev: str) -> Any:
    """``binomial_scan`` of the builder module at git revision ``rev``."""
    for where in _BUILDER_PATHS:
        shown = subprocess.run(["git", "show", f"{rev}:{where}"], cwd=ROOT, capture_output=True,
                               text=True)
        if shown.returncode == 0:
            break
    else:
        raise SystemExit(f"--baseline: no binomial builder at {rev} ({', '.join(_BUILDER_PATHS)})")
    source = shown.stdout
    for old, new in _MOVED.items():
        source = source.replace(old, new)
    path = Path(tempfile.mkdtemp()) / f"binomial_scan_{rev}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    old = module.binomial_scan
    if "static" in inspect.signature(old).parameters:
        return old

    def builder(*args: Any, static: bool = False, **kwargs: Any) -> Any:
        """An older builder: it has only the loops backward (``static`` must be off)."""
        assert not static, "the baseline builder has no static backward"
        return old(*args, **kwargs)

    return builder


@contextlib.contextmanager
def _builder(fn: Any) -> Iterator[None]:
    """Trace binomial schedules with ``fn`` (``None``: this checkout's builder)."""
    import autoremat._schedules.binomial_scan as current

    if fn is None:
        yield
        return
    saved = current.binomial_scan
    current.binomial_scan = fn
    try:
        yield
    finally:
        current.binomial_scan = saved


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=100_000)
    p.add_argument("--snapshots", type=int, default=17)
    p.add_argument("--seq2seq", action="store_true", help="loss on every step (default: last)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline", help="also time the binomial builder of this git revision")
    p.add_argument("--append", type=Path, help="append a dated section to this markdown file")
    args = p.parse_args(argv)
    T = args.seq_len
    problem = autoremat.seed_lstm(seq_len=T, seq2seq=args.seq2seq)
    remat, stored = "nothing_saveable", "everything_saveable"
    binomial = autoremat.binomial(args.snapshots)
    competitors: list[tuple[str, Schedule, Any]] = [
        ("plain", autoremat.plain(T), None),
        ("nested 3 levels", autoremat.root(T, 3, [remat, remat, stored]), None),
        (f"binomial s={args.snapshots} (this checkout)", binomial, None),
        (f"binomial s={args.snapshots}, static backward",
         autoremat.binomial(args.snapshots, backward="static"), None),
    ]
    if args.baseline:
        competitors.append((f"binomial s={args.snapshots} ({args.baseline})", binomial,
                            _baseline_builder(args.baseline)))
    compiled = []
    for label, schedule, fn in competitors:
        t0 = time.perf_counter()
        with _builder(fn):
            c = compile_schedule(problem, schedule)
        assert c.executable is not None, (label, c.measurement.reason)
        compiled.append(c)
        print(f"compiled {label}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    import jax

    losses = [float(jax.block_until_ready(c.executable(*c.args))[2]) for c in compiled]
    samples: list[list[float]] = [[] for _ in compiled]
    for r in range(args.rounds):
        for c, out in zip(compiled, samples, strict=True):
            t0 = time.perf_counter()
            jax.block_until_ready(c.executable(*c.args))
            out.append(time.perf_counter() - t0)
        print(f"round {r + 1}: " + ", ".join(f"{s[-1]:.2f}" for s in samples), file=sys.stderr,
              flush=True)
    medians = [statistics.median(s) for s in samples]
    evals = [bounds.cost(s, T).evaluations for _, s, _ in competitors]
    per_eval = [m / e for m, e in zip(medians, evals, strict=True)]
    env = environment()
    loss = "seq2seq" if args.seq2seq else "last state"
    lines = [
        f"## {datetime.date.today().isoformat()}: interleaved, T={T:,}, loss on the {loss}",
        "",
        f"`python studies/binomial_speed.py --seq-len {T} --rounds {args.rounds}"
        + (f" --baseline {args.baseline}" if args.baseline else "") + "` on "
        f"{env['device_kind']} (jax {env['jax_version']}): one process, one warm-up each, "
        f"then {args.rounds} rounds in turn; median step seconds. Evaluations: "
        "`autoremat.bounds.cost` (the binomial builder runs exactly these; "
        "`tests/test_binomial.py` counts them). Per evaluation: step time over evaluations, "
        "against the nested schedule's.",
        "",
        "| schedule | step s (runs) | vs plain | evaluations / step | s per evaluation "
        "| per evaluation vs nested | loss |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (label, schedule, _), s, m, e, pe, lo in zip(competitors, samples, medians, evals,
                                                     per_eval, losses, strict=True):
        lines.append(f"| {label}: `{schedule.describe()}` | {m:.3f} "
                     f"({', '.join(f'{x:.2f}' for x in s)}) | {m / medians[0]:.3f} | "
                     f"{e / T:.3f} | {pe * 1e6:.1f} us | {pe / per_eval[1]:.2f} | {lo:.6g} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.append:
        with args.append.open("a") as f:
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
