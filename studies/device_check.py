"""The device check (issue 35): autoremat's figures against the device's truth, in one
process and one command, at most ~8 minutes on a TPU or GPU machine.

Every stage runs in this one process (a TPU lets one process at a time hold the chip),
each guarded -- a stage that fails is written down and the next runs -- and the report
is rewritten after every result, to ``--out/<platform>.md`` (and ``.json``):

1. rows: the seed LSTM train step (``autoremat.seed_lstm``: hidden 128, batch 10) under
   plain / remat of each step / 100x100 / binomial s=11 (seq2seq), 100x100 with the
   readout in the step and on the last state, 100x100 measured while plain's program is
   still loaded (isolation), and 400x250 nothing/everything at T=10^5. For each: the
   estimate beyond the arguments (compiled temp + outputs), autoremat's measured need
   (``Measurement.runtime_peak_bytes`` less the arguments: what the tuner records, by
   the platform's method of ``autoremat._measure.device_memory``), the true need --
   the least free memory beyond the live arguments in which the freshly loaded step
   runs, bisected with a filler (``within.bisect_need`` of ``fresh_run``, 256 KB;
   each try a load from JAX's compilation cache) -- and the step time (median of 3
   after a warm-up);
2. ``autoremat tune --budget 4GB`` (T=10^4) and, under a budget that binds,
   ``--budget 1GB --seq-len 100000 --fused-readout``, each with ``--time-limit``
   (default 60 s) and its proof of fit; then the 4 GB pick as a row of the table.

The platform's method is checked here whether or not it is yet ``VALIDATED`` (that is
what this check is for): the check counts it validated while it runs. Without an
accelerator it says so and exits 0 (``--allow-cpu --seq-len 400`` runs the plumbing,
with no device figures). On the TPU machine (``docs/accelerators.md``)::

    source studies/device_setup.sh && python3 studies/device_check.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import io
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import autoremat

ROOT = Path(__file__).resolve().parent.parent
MB = 10**6
#: A row: (loss, label, schedule name for ``schedule_of``, T as a multiple of --seq-len).
ROWS: list[tuple[str, str, str, int]] = [
    ("seq2seq", "plain", "plain", 1),
    ("seq2seq", "remat of each step", "per_step", 1),
    ("seq2seq", "100x100", "100x100", 1),
    ("seq2seq", "binomial s=11", "binomial11", 1),
    ("fused readout", "100x100", "100x100", 1),
    ("last state", "100x100", "100x100", 1),
    ("seq2seq", "100x100, plain still loaded", "100x100_beside_plain", 1),
    ("seq2seq", "sqrt(T) x sqrt(T) nothing/everything", "root_ne", 10),
]
#: The tunes: (label, CLI arguments after ``tune``, T as a multiple of --seq-len).
TUNES: list[tuple[str, list[str], int]] = [
    ("4GB", ["--budget", "4GB"], 1),
    ("1GB at 10 T, fused", ["--budget", "1GB", "--fused-readout"], 10),
]


def schedule_of(name: str, seq_len: int) -> Any:
    """A row's schedule at ``seq_len`` (100x100 scales as sqrt(T) x sqrt(T))."""

    if name == "plain":
        return autoremat.plain(seq_len)
    if name == "per_step":
        return autoremat.nested([seq_len], "nothing_saveable")
    if name.startswith("100x100"):
        return autoremat.root(seq_len, 2, "nothing_saveable")
    if name == "root_ne":
        return autoremat.root(seq_len, 2, ["nothing_saveable", "everything_saveable"])
    if name == "binomial11":
        return autoremat.binomial(11)
    raise ValueError(f"schedule: no row schedule {name!r}; one of plain, per_step, 100x100, "
                     "root_ne, binomial11")


@dataclass
class Report:
    """What ``<platform>.md`` shows; rewritten whole after every result."""

    path: Path
    header: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(self.lines()) + "\n")
        self.path.with_suffix(".json").write_text(json.dumps(
            {"header": self.header, "rows": self.rows,
             "sections": [{"title": t, "text": x} for t, x in self.sections]}, indent=1))

    def lines(self) -> list[str]:
        lines = ["# Device check (`studies/device_check.py`)", "", *self.header, "",
                 "## The seed LSTM train step (hidden 128, batch 10)", "",
                 "Beyond the live arguments, in MB (10^6 bytes): estimate = compiled temp + "
                 "outputs (memory_analysis); measured = what autoremat records "
                 "(runtime_peak_bytes less the arguments); true = the least free memory in "
                 "which the step runs (bisection with a filler, 256 KB). Step: median of 3 "
                 "after a warm-up.", "",
                 "| loss | T | schedule | estimate | measured | true | measured vs true "
                 "| estimate vs true | step ms | vs plain |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        plain = {(r["kind"], r["seq_len"]): r.get("step_seconds") for r in self.rows
                 if r["label"] == "plain"}
        for r in self.rows:
            if r.get("error"):
                lines.append(f"| {r['kind']} | {r['seq_len']} | {r['label']} | failed: "
                             f"{r['error']} |||||||")
                continue
            est, got, true = r.get("estimate"), r.get("measured"), r.get("true")
            step, base = r.get("step_seconds"), plain.get((r["kind"], r["seq_len"]))
            lines.append(
                f"| {r['kind']} | {r['seq_len']} | {r.get('describe', r['label'])} | {_mb(est)} "
                f"| {_mb(got)} | {_mb(true)} | {_pct(got, true)} | {_pct(est, true)} | "
                f"{'-' if step is None else f'{1e3 * step:.1f}'} | "
                f"{f'{step / base:.2f}' if step and base else '-'} |")
        for title, text in self.sections:
            lines += ["", f"## {title}", "", "```text", text.rstrip(), "```"]
        return lines


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / MB:,.2f}"


def _pct(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{100 * (a - b) / b:+.1f}%"


def measure_row(loss: str, schedule: Any, seq_len: int, *,
                beside_plain: bool = False) -> dict[str, Any]:
    """One row: compile, time (the tuner's own measurement), then bisect the true need.
    ``beside_plain``: plain's program is loaded (and has run) while this one is measured."""
    from autoremat import bounds, seed_lstm
    from autoremat._measure import device_memory, within
    from autoremat._measure.measure import compile_schedule
    from autoremat._measure.timing import time_compiled

    problem = seed_lstm(seq_len=seq_len, seq2seq=loss != "last state",
                        fused_readout=loss == "fused readout")
    keep: list[Any] = []
    if beside_plain:
        other = compile_schedule(problem, schedule_of("plain", seq_len))
        within.free_outputs(other.executable(*other.args))
        keep.append(other.executable)
    step, args = problem.build(schedule)
    compiled = compile_schedule(problem, schedule, built=(step, args))
    m = time_compiled(compiled, time_budget=0.0, min_repeats=3, max_repeats=3)
    compiled.release()  # the bisection loads the program afresh each try
    row: dict[str, Any] = {**m.to_attrs(), "describe": schedule.describe(),
                           "evaluations": bounds.cost(schedule, seq_len).evaluations}
    arguments = m.argument_bytes or 0
    if m.total_bytes is not None:
        row["estimate"] = m.total_bytes - arguments
    if m.runtime_peak_bytes is not None:
        row["measured"] = m.runtime_peak_bytes - arguments
    if m.status == "error":
        row["error"] = m.reason[:300]
    elif device_memory.meters():
        gc.collect()
        limit = device_memory.meters()[0].stats()
        room = (limit.limit or 0) - limit.in_use if limit else 0
        high = min(room - (64 << 20), 2 * (row.get("estimate") or 0) + (256 << 20))
        started = time.monotonic()
        row["true"] = within.bisect_need(within.fresh_run(step, args), high)
        row["bisect_seconds"] = time.monotonic() - started
    keep.clear()  # plain's program, when it was loaded beside this one
    gc.collect()
    return row



def tune_section(cli_args: list[str], seq_len: int, time_limit: str, out: Path,
                 tmp: Path) -> tuple[str, Path]:
    """``autoremat tune`` in this process (its stdout), then ``autoremat pareto`` of it."""
    from autoremat.cli import main

    args = ["--seq-len", str(seq_len), *cli_args]
    storage = f"sqlite:///{tmp}/check.db"
    name = f"check_T{seq_len}_" + "_".join(a.strip("-") for a in cli_args)
    yaml = tmp / f"{name}.yaml"
    started = time.monotonic()
    text = _captured(main, ["tune", *args, "--time-limit", time_limit, "--storage", storage,
                            "--study-name", name, "--out", str(yaml), "--no-progress"])
    text += f"\n(tune: {time.monotonic() - started:.0f} s in all)\n\n"
    text += _captured(main, ["pareto", "--storage", storage, "--study-name", name,
                             "--plot", str(out / f"{name}.png")])
    return text, yaml


def _captured(fn: Callable[[list[str]], int], argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            rc = fn(argv)
        except SystemExit as e:
            rc = int(e.code or 0)
    return buf.getvalue() + (f"(exit {rc})\n" if rc else "")


def environment_lines(seq_len: int) -> list[str]:
    import jax

    from autoremat._measure.allocator import limit_bytes

    versions = {"jax": jax.__version__}
    for name in ("jaxlib", "flax", "optax", "optuna"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:
            versions[name] = "not importable"
    device = jax.devices()[0]
    limit = limit_bytes()
    return [f"Run {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')} on "
            f"{device.device_kind} ({device.platform}, {len(jax.devices())} device(s), "
            f"bytes_limit {'-' if limit is None else limit}); "
            + ", ".join(f"{k} {v}" for k, v in versions.items()) + f"; T={seq_len}."]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "studies" / "results",
                   help="folder for <platform>.md and .json (default studies/results)")
    p.add_argument("--seq-len", type=int, default=10_000, help="T of the rows (10000)")
    p.add_argument("--time-limit", default="60s", help="each tune's --time-limit (60s)")
    p.add_argument("--stages", default="rows,tune", help="a subset of rows,tune")
    p.add_argument("--allow-cpu", action="store_true",
                   help="run without an accelerator too (the plumbing; no device figures)")
    args = p.parse_args(argv)
    import jax

    from autoremat._measure import device_memory

    platform = jax.devices()[0].platform
    if platform == "cpu" and not args.allow_cpu:
        print("device_check: no accelerator here (jax's default backend is cpu); nothing "
              "measured, nothing written. Run it on a TPU or GPU machine.", flush=True)
        return 0
    # each bisection try compiles afresh: from this cache, a load
    jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="device-check-xla-"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    if platform != "cpu" and platform not in device_memory.VALIDATED:  # what is checked here
        device_memory.VALIDATED[platform] = "being checked by studies/device_check.py"  # type: ignore[index]
    started = time.monotonic()
    report = Report(args.out / f"{platform}.md", environment_lines(args.seq_len))
    report.write()
    stages = set(args.stages.split(","))
    if "rows" in stages:
        for loss, label, name, times in ROWS:
            seq_len = args.seq_len * times
            row: dict[str, Any] = {"kind": loss, "label": label, "seq_len": seq_len}
            try:
                row.update(measure_row(loss, schedule_of(name, seq_len), seq_len,
                                       beside_plain=name.endswith("_beside_plain")))
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
                traceback.print_exc()
            row["kind"] = loss  # the Measurement's "loss" is the loss's value
            report.rows.append(row)
            report.write()
            print(f"device_check: {loss} T={seq_len} {label}: " + (row.get("error") or (
                f"estimate {_mb(row.get('estimate'))}, measured {_mb(row.get('measured'))}, "
                f"true {_mb(row.get('true'))} MB, step {row.get('step_seconds')}")), flush=True)
    if "tune" in stages:
        with tempfile.TemporaryDirectory() as tmp:
            for label, cli_args, times in TUNES:
                try:
                    text, yaml = tune_section(cli_args, args.seq_len * times, args.time_limit,
                                              args.out, Path(tmp))
                except Exception:
                    text, yaml = traceback.format_exc(), Path(tmp) / "none"
                report.sections.append((f"autoremat tune --seq-len {args.seq_len * times} "
                                        f"{' '.join(cli_args)} --time-limit {args.time_limit}",
                                        text))
                report.write()
                print(f"device_check: tune {label}:\n{text}", flush=True)
                if label == "4GB" and yaml.is_file():
                    report.rows.append(pick_row(yaml, args.seq_len))
                    report.write()
    report.sections.append(("Wall time", f"{time.monotonic() - started:.0f} s in all"))
    report.write()
    print(f"device_check: wrote {report.path} ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


def pick_row(yaml: Path, seq_len: int) -> dict[str, Any]:
    """The tuned pick as a row (its schedule from the written YAML)."""
    from autoremat import load_schedule

    row: dict[str, Any] = {"label": "tuned pick (4GB)", "seq_len": seq_len}
    try:
        row.update(measure_row("seq2seq", load_schedule(yaml), seq_len))
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return {**row, "kind": "seq2seq"}


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
