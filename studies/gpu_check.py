"""The GPU check (issue 30 item 4): one command, at most ~8 minutes on a GPU machine.

On the seed LSTM train step (``autoremat.seed_lstm``: hidden 128, batch 10, T=10^4), in
this order, each stage independent (a stage that fails or times out is written down
and the next one runs) and every result written to ``--out/gpu.md`` as it comes
(with ``gpu.json``, the raw figures):

1. the table: seq2seq plain / remat of each step / 100x100 / binomial s=11; fused
   readout plain / 100x100 / binomial s=11; last state 100x100 -- each row in a fresh
   process (``--row``), with the estimate (compiled total), the measured runtime peak
   and the compile scratch (``autoremat._measure.device_memory``), the process's peak
   (``peak_bytes_in_use``), the step time (median of 3 after a warm-up) and the time
   per step evaluation against 100x100's;
2. PyTorch's cuDNN ``nn.LSTM`` on the same shapes (seq2seq and last state), when
   torch is importable: step time and ``torch.cuda.max_memory_allocated``;
3. ``autoremat tune`` under 4 GB and under 150 MB (``--time-limit``, default 60 s
   each), then ``autoremat pareto`` of each study;
4. more rows of the table (``VARIANTS``): fused readout binomial s=11 with its
   backward static (``BinomialSchedule.backward``: no loop of dynamic length), with
   the search's ``graph_loops`` (command buffers that capture loops and
   conditionals), and both -- last, as the time left allows.

A deadline inside the script (``--deadline``, default 450 s from the start) bounds the
whole run: a stage starts only with time left, and its subprocess is stopped at the
deadline. Without a GPU it says so and exits 0 (``--allow-cpu`` runs the stages
anyway, to try the plumbing with a small ``--seq-len``). On the GPU machine (no
optuna, no package index; ``shared/reference/gpu.md``)::

    XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 \\
        PYTHONPATH=$PWD:/tmp/site python3 studies/gpu_check.py --out "$OUT"

(``/tmp/site``: optuna and its dependencies installed from carried wheels.)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MB = 10**6

#: The rows of the table: (loss, schedule label, schedule as data for from_data).
ROWS: list[tuple[str, str, str]] = [
    ("seq2seq", "plain", "plain"),
    ("seq2seq", "remat of each step", "per_step"),
    ("seq2seq", "100x100", "100x100"),
    ("seq2seq", "binomial s=11", "binomial11"),
    ("fused readout", "plain", "plain"),
    ("fused readout", "100x100", "100x100"),
    ("fused readout", "binomial s=11", "binomial11"),
    ("last state", "100x100", "100x100"),
]
#: The last stage's rows (``variants``): the binomial backward's loop forms on the device.
VARIANTS: list[tuple[str, str, str]] = [
    ("fused readout", "binomial s=11, static backward", "binomial11_static"),
    ("fused readout", "binomial s=11, graph_loops", "binomial11_graphs"),
    ("fused readout", "binomial s=11, static backward, graph_loops", "binomial11_static_graphs"),
]
BUDGETS = ("4GB", "150MB")


def schedule_of(name: str, seq_len: int) -> Any:
    """A row's schedule at ``seq_len`` (100x100 scales as sqrt(T) x sqrt(T))."""
    from autoremat import Schedule

    if name == "plain":
        return Schedule.plain(seq_len)
    if name == "per_step":
        return Schedule.nested([seq_len], "nothing_saveable")
    if name == "100x100":
        return Schedule.root(seq_len, 2, "nothing_saveable")
    if name.startswith("binomial11"):  # _static: backward: static; _graphs: graph_loops
        from autoremat._search.space import COMPILER_CHOICES

        binomial = Schedule.binomial(11, backward="static" if "_static" in name else "loops")
        return binomial.with_options(**COMPILER_CHOICES["graph_loops"] if "_graphs" in name
                                     else {})
    raise ValueError(f"schedule: no row schedule {name!r}; one of plain, per_step, 100x100, "
                     "binomial11[_static][_graphs]")


# --------------------------------------------------------------------------- child processes


def row_main(loss: str, schedule: str, seq_len: int, result: Path) -> None:
    """One row, in this (fresh) process: build, measure, write ``result`` (JSON)."""
    from autoremat import bounds, measure, seed_lstm
    from autoremat._measure.device_memory import process_peak

    problem = seed_lstm(seq_len=seq_len, seq2seq=loss != "last state",
                        fused_readout=loss == "fused readout")
    sched = schedule_of(schedule, seq_len)
    m = measure(problem, sched, time_budget=0.0, min_repeats=3, max_repeats=3)
    out = {**m.to_attrs(), "describe": sched.describe(), "process_peak_end": process_peak(),
           "evaluations": bounds.cost(sched, seq_len).evaluations}
    result.write_text(json.dumps(out))


def torch_main(seq_len: int, result: Path) -> None:
    """PyTorch's cuDNN ``nn.LSTM`` + Linear + L2 + Adam on the seed's shapes (seq2seq and
    last state): median of 3 steps after a warm-up, ``max_memory_allocated`` of them."""
    import torch

    found: dict[str, Any] = {"torch": torch.__version__,
                             "cudnn": str(torch.backends.cudnn.version())}
    for loss in ("seq2seq", "last state"):
        try:
            found[loss] = _torch_one(torch, seq_len, loss == "seq2seq")
        except Exception as e:  # e.g. CUDNN_STATUS_NOT_SUPPORTED at T >= 65,536
            found[loss] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        result.write_text(json.dumps(found))


def _torch_one(torch: Any, seq_len: int, seq2seq: bool) -> dict[str, Any]:
    import statistics

    dev = torch.device("cuda")
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(32, 128, batch_first=True).to(dev)
    head = torch.nn.Linear(128, 4).to(dev)
    opt = torch.optim.Adam([*lstm.parameters(), *head.parameters()], lr=1e-3)
    x = torch.randn(10, seq_len, 32, device=dev)
    y = torch.randn((10, seq_len, 4) if seq2seq else (10, 4), device=dev)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out, _ = lstm(x)
        pred = head(out if seq2seq else out[:, -1])
        ((pred - y) ** 2).mean().backward()
        opt.step()

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()  # the warm-up (cuDNN's plan), in the peak too
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {"step_seconds": statistics.median(times),
            "max_memory_allocated": int(torch.cuda.max_memory_allocated())}


# --------------------------------------------------------------------------- the parent


@dataclass
class Report:
    """What ``gpu.md`` shows; rewritten whole after every stage's result."""

    out: Path
    header: list[str]
    seq_len: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu.md").write_text("\n".join(self.lines()) + "\n")
        (self.out / "gpu.json").write_text(json.dumps(
            {"header": self.header, "rows": self.rows,
             "sections": [{"title": t, "text": x} for t, x in self.sections]}, indent=1))

    def lines(self) -> list[str]:
        lines = ["# GPU check (`studies/gpu_check.py`)", "", *self.header, "",
                 f"## Seed LSTM train step, T={self.seq_len}, batch 10, hidden 128 "
                 "(each row a fresh process)", "",
                 "estimate: the compiled total (memory_analysis); runtime peak: measured, this "
                 "step alone (memory_stats, the gap to the old mark filled); compile scratch: "
                 "transient, while compiling; process peak: peak_bytes_in_use of the row's "
                 "process at its end. Per evaluation: step seconds over step evaluations "
                 "(`autoremat.bounds.cost`), against the 100x100 row of the same loss.", "",
                 "| loss | schedule | estimate | runtime peak | vs estimate | compile scratch "
                 "| process peak | step s | vs plain | evaluations / step "
                 "| per evaluation vs 100x100 |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
        plain = {r["kind"]: r.get("step_seconds") for r in self.rows if r["label"] == "plain"}
        nested = {r["kind"]: _per_eval(r) for r in self.rows if r["label"] == "100x100"}
        for r in self.rows:
            if r.get("error"):
                lines.append(f"| {r['kind']} | {r['label']} | failed: {r['error']} |||||||||")
                continue
            est, run = r.get("total_bytes"), r.get("runtime_peak_bytes")
            vs = f"{100 * (run - est) / est:+.1f}%" if est and run is not None else "-"
            step, base = r.get("step_seconds"), plain.get(r["kind"])
            ratio = f"{step / base:.2f}" if step and base else "-"
            peak = r.get("process_peak_end") or r.get("peak_bytes")
            shown = r.get("describe", r["label"])
            evals, per, base_per = r.get("evaluations"), _per_eval(r), nested.get(r["kind"])
            lines.append(f"| {r['kind']} | {shown} | {_mb(est)} | {_mb(run)} | {vs} | "
                         f"{_mb(r.get('compile_scratch_bytes'))} | {_mb(peak)} | "
                         f"{'-' if step is None else f'{step:.3f}'} | {ratio} | "
                         f"{f'{evals / self.seq_len:.2f}' if evals else '-'} | "
                         f"{f'{per / base_per:.2f}' if per and base_per else '-'} |")
        for title, text in self.sections:
            lines += ["", f"## {title}", "", "```text", text.rstrip(), "```"]
        return lines


def _per_eval(row: dict[str, Any]) -> float | None:
    """Step seconds per step evaluation, or ``None``."""
    step, evals = row.get("step_seconds"), row.get("evaluations")
    return step / evals if step and evals else None


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / MB:,.1f} MB"


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def run_child(args: list[str], deadline: Deadline, cap: float, env: dict[str, str],
              cwd: Path | None = None, log: Path | None = None) -> tuple[str, str]:
    """A subprocess with a timeout of ``min(cap, time left)``; ``(error, output)``, the
    error empty when it exited 0. ``log``: its whole stdout and stderr appended there."""
    timeout = min(cap, deadline.left())
    if timeout < 5:
        return "skipped: the script's deadline", ""
    try:
        proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        text = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
        _log(log, args, text, f"stopped after {timeout:.0f} s")
        return f"stopped after {timeout:.0f} s", text
    _log(log, args, proc.stdout + proc.stderr, f"exit {proc.returncode}")
    output = proc.stdout + (proc.stderr if proc.returncode else "")
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"exit {proc.returncode}: {last[:300]}", output
    return "", output


def _log(log: Path | None, args: list[str], text: str, how: str) -> None:
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(f"$ {' '.join(args[1:])}  [{how}]\n{text}\n")


def environment_lines(seq_len: int) -> list[str]:
    import jax

    versions = {"jax": jax.__version__}
    for name in ("jaxlib", "flax", "optax", "optuna", "torch"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:
            versions[name] = "not importable"
    device = jax.devices()[0]
    return [f"Run {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')} on "
            f"{device.device_kind} ({device.platform}, {len(jax.devices())} device(s)); "
            + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
            f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, XLA_PYTHON_CLIENT_PREALLOCATE="
            f"{os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE', '')!r}; T={seq_len}."]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--out", type=Path, default=ROOT / "studies" / "results",
                   help="folder for gpu.md and gpu.json (default studies/results)")
    p.add_argument("--deadline", type=float, default=450.0,
                   help="seconds the whole check may take (default 450)")
    p.add_argument("--seq-len", type=int, default=10_000)
    p.add_argument("--time-limit", default="60s", help="each tune's --time-limit (60s)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="run without a GPU too (to try the plumbing; no device memory figures)")
    p.add_argument("--stages", default="rows,torch,tune,variants",
                   help="comma-separated subset of rows,torch,tune,variants")
    p.add_argument("--row", nargs=2, metavar=("LOSS", "SCHEDULE"), help=argparse.SUPPRESS)
    p.add_argument("--torch", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.row:
        row_main(args.row[0], args.row[1], args.seq_len, args.result)
        return 0
    if args.torch:
        torch_main(args.seq_len, args.result)
        return 0

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    deadline = Deadline(args.deadline)
    import jax

    platform = jax.devices()[0].platform
    if platform != "gpu" and not args.allow_cpu:
        print(f"gpu_check: no GPU here (jax's default backend is {platform}); nothing "
              "measured, nothing written. Run it on a GPU machine.", flush=True)
        return 0
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(
               [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    report = Report(args.out, environment_lines(args.seq_len), args.seq_len)
    report.write()
    (args.out / "gpu_check.log").unlink(missing_ok=True)  # this run's children only
    stages = set(args.stages.split(","))
    me = [sys.executable, str(Path(__file__).resolve()), "--seq-len", str(args.seq_len)]
    with tempfile.TemporaryDirectory() as tmp:
        if "rows" in stages:
            rows_stage(ROWS, report, me, Path(tmp), deadline, env)
        if "torch" in stages:
            report.sections.append(("PyTorch cuDNN nn.LSTM, same shapes",
                                    torch_stage(me, tmp, deadline, env,
                                                args.out / "gpu_check.log")))
            report.write()
            print(f"gpu_check: torch: {report.sections[-1][1]}", flush=True)
        if "tune" in stages:
            for budget in BUDGETS:
                text = tune_stage(budget, args, Path(tmp), deadline, env)
                report.sections.append((f"autoremat tune --budget {budget} --time-limit "
                                        f"{args.time_limit}", text))
                report.write()
                print(f"gpu_check: tune {budget}:\n{text}", flush=True)
        if "variants" in stages:
            rows_stage(VARIANTS, report, me, Path(tmp), deadline, env)
    print(f"gpu_check: wrote {args.out / 'gpu.md'} ({args.deadline - deadline.left():.0f} s)",
          flush=True)
    return 0


def rows_stage(rows: list[tuple[str, str, str]], report: Report, me: list[str], tmp: Path,
               deadline: Deadline, env: dict[str, str]) -> None:
    """Each row in a fresh process (``--row``), into ``report`` as it comes."""
    for loss, label, name in rows:
        result = tmp / f"row{len(report.rows)}.json"
        error = run_child([*me, "--row", loss, name, "--result", str(result)],
                          deadline, 90.0, env, log=report.out / "gpu_check.log")[0]
        row: dict[str, Any] = {}
        if result.is_file():  # the Measurement's attrs (its "loss" is the loss value)
            row.update(json.loads(result.read_text()))
        row.update(kind=loss, label=label)
        if result.is_file():
            if row.get("status") == "error":
                row["error"] = row.get("reason", "")[:300]
        else:
            row["error"] = error or "no result written"
        report.rows.append(row)
        report.write()
        print(f"gpu_check: {loss} {label}: "
              + (row.get("error") or f"estimate {_mb(row.get('total_bytes'))}, runtime "
                 f"peak {_mb(row.get('runtime_peak_bytes'))}, compile scratch "
                 f"{_mb(row.get('compile_scratch_bytes'))}, step "
                 f"{row.get('step_seconds')}"), flush=True)


def torch_stage(me: list[str], tmp: str, deadline: Deadline, env: dict[str, str],
                log: Path) -> str:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "torch is not importable here: skipped"
    result = Path(tmp) / "torch.json"
    error = run_child([*me, "--torch", "--result", str(result)], deadline, 90.0, env,
                      log=log)[0]
    found = json.loads(result.read_text()) if result.is_file() else {}
    lines = [f"torch {found.get('torch', '?')}, cuDNN {found.get('cudnn', '?')}"] if found else []
    for loss in ("seq2seq", "last state"):
        r = found.get(loss)
        if r is None:
            continue
        lines.append(f"{loss}: " + (r["error"] if "error" in r else
                                    f"step {r['step_seconds']:.4f} s, max_memory_allocated "
                                    f"{_mb(r['max_memory_allocated'])}"))
    if error:
        lines.append(f"failed: {error}")
    return "\n".join(lines)


def tune_stage(budget: str, args: argparse.Namespace, tmp: Path, deadline: Deadline,
               env: dict[str, str]) -> str:
    """``autoremat tune`` then ``autoremat pareto`` (with a plot into ``--out``)."""
    cli = [sys.executable, "-m", "autoremat.cli"]
    storage = f"sqlite:///{tmp}/gpu_{budget}.db"
    name = f"gpu_check_{budget}"
    error, tuned = run_child([*cli, "tune", "--budget", budget, "--seq-len", str(args.seq_len),
                              "--time-limit", args.time_limit, "--storage", storage,
                              "--study-name", name, "--no-progress"],
                             deadline, _seconds(args.time_limit) + 120.0, env, cwd=tmp,
                             log=args.out / "gpu_check.log")
    text = tuned.strip() + (f"\ntune: {error}" if error else "")
    plot = args.out / f"gpu_tune_{budget}.png"
    error, front = run_child([*cli, "pareto", "--storage", storage, "--study-name", name,
                              "--plot", str(plot)], deadline, 60.0, env, cwd=tmp,
                             log=args.out / "gpu_check.log")
    return text + "\n\n" + front.strip() + (f"\npareto: {error}" if error else "")


def _seconds(text: str) -> float:
    from autoremat._units import parse_duration

    return parse_duration(text, "time_limit")


if __name__ == "__main__":
    sys.exit(main())
