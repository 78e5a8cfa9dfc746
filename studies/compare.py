"""Side-by-side remat benchmarks on the seed LSTM train step (issue 6).

On the seed's LSTM train step (loss on the last state and on all steps), for
each sequence length T, the rows are: ``plain`` (``autoremat.plain(T)``);
``per-cell remat`` (``autoremat.nested([T], 'nothing_saveable')``); ``flax
nn.scan(nn.remat)`` (Flax's FAQ recipe); ``equinox checkpointed``
(``equinox.internal.scan(kind='checkpointed')``, default ``checkpoints``; the
optional ``bench`` extra, else skipped with a message); ``hand sqrt(T) nested``
(two ``lax.scan`` levels, ``jax.checkpoint`` on the chunk body, no autoremat);
``autoremat min-memory`` (the smallest compiled total of a few 2/3-level
``autoremat.root`` schedules and the binomial (Revolve) schedule with the fewest
snapshots the tuner tries); ``autoremat tuned <=25%`` (``autoremat.tune`` under
25% of the plain row's total, re-measured here); and any ``--extra-schedule
LABEL=FILE.yaml`` or ``SCHEDULE_ROWS`` entry (how new schedule kinds get a row).

With ``--fused-readout`` the loss-on-all-steps groups also get rows of the
same train step with the readout and loss inside the scanned step
(``seed_lstm(fused_readout=True)``, ``autoremat.fuse_loss``: nothing T-long is
stacked): ``plain (fused readout)`` (no remat), ``autoremat fused sqrt(T)
nested``, ``autoremat fused min-memory`` and ``autoremat fused tuned <=1%
temp`` (``autoremat.tune`` under the plain row's arguments + outputs + 1% of
its temp). Their loss and gradients are checked against the unfused plain row.

Every competitor is the seed's one train step (``SeedModel.train_step``) around
its own way of running the scan, measured by ``autoremat.measure_step``: compile,
``memory_analysis()`` (total = argument + output + temp - alias), one warm-up,
``--repeats`` timed runs (median). The warm-up's loss must equal the plain
scan's (rtol 1e-5), and so must its gradients (Adam's first moment after one
step is 0.1 x the gradient; max-norm relative error <= 1e-4).

``--gpu`` (automatic on a gpu backend) also records, per row and beside the
compiled estimate (total), the step's own runtime peak and compile scratch
(``Measurement.runtime_peak_bytes`` / ``compile_scratch_bytes``, isolated
from compiling and earlier work) and the device's ``peak_bytes_in_use`` (the
process peak, a process-wide high-water mark, so every row then runs in a
fresh subprocess, ``--isolate``); without memory stats (CPU) they are ``n/a``.
The min-memory and tuned schedules are chosen in the parent.

Writes, into ``--out``, after every (T, loss kind): ``compare.md``,
``compare.json`` and ``memory_vs_T.png`` (see ``compare_report.py``)::

    python studies/compare.py --seq-lens 1000,10000 [--with-1e5] [--gpu] [--out studies/results]

``--render studies/results/compare.json --readme`` re-renders a saved run without
measuring and replaces the generated tables of ``docs/benchmarks.md`` (with the
machine they were measured on).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import compare_report as report  # studies/compare_report.py: tables, slopes, plot, docs page

import autoremat
from autoremat import Measurement, Schedule, load_schedule, measure, measure_step, tune
from autoremat._measure.device import environment
from autoremat._measure.problem import Step
from autoremat._models.seed_lstm import SeedModel, seed_batch, seed_lstm, seed_model
from autoremat._schedules import from_data
from autoremat._schedules.binomial import snapshot_range
from autoremat._schedules.lengths import root_lengths

#: ``seed_lstm``'s defaults: the one home of the seed problem's sizes.
SEED = {k: v.default for k, v in inspect.signature(seed_lstm).parameters.items()}
EQUINOX = "equinox checkpointed"
TUNED = "autoremat tuned <=25%"

# Extra rows that are just an autoremat schedule: (method, factory(seq_len) -> Schedule, or None to
# skip that T), e.g. SCHEDULE_ROWS.append(("autoremat binomial s=32", lambda t: autoremat.binomial(32))).
# Methods starting with "autoremat" are compared against every competitor in the ratio table.
SCHEDULE_ROWS: list[tuple[str, Callable[[int], Any]]] = []


@dataclass(frozen=True)
class Group:
    """One (T, loss kind) of the seed problem: every row of it runs on the same arrays."""

    seq_len: int
    seq2seq: bool
    batch: int
    hidden: int

    def model(self, fused: bool = False) -> SeedModel:
        return seed_model(seq_len=self.seq_len, batch=self.batch, hidden=self.hidden,
                          input_dim=SEED["input_dim"], output_dim=SEED["output_dim"],
                          seq2seq=self.seq2seq, fused_readout=fused)


@dataclass(frozen=True)
class Spec:
    """What one row runs: a builder name (see ``BUILDERS``) and, for ``schedule``, its data."""

    method: str
    builder: str
    schedule: dict[str, Any] | None = None
    detail: str = ""
    fused: bool = False  # the seed model with the readout inside the step


# --------------------------------------------------------------------------- competitors


def flax_step(model: SeedModel) -> Step:
    """``nn.scan(nn.remat(OptimizedLSTMCell))`` over axis 1, same params as the seed."""
    import flax.linen as nn

    scanned = nn.scan(nn.remat(nn.OptimizedLSTMCell), variable_broadcast="params",
                      split_rngs={"params": False}, in_axes=1, out_axes=0)(model.cell.features)

    def run_scan(params: Any, x: Any) -> tuple[Any, Any]:
        carry, hs = scanned.apply({"params": params["cell"]}, model.carry0, x)
        return carry, (hs if model.seq2seq else None)

    return model.train_step(run_scan)


def hand_step(model: SeedModel) -> tuple[Step, str]:
    """Two ``lax.scan`` levels, ``jax.checkpoint`` on the chunk body (no autoremat).

    Chunks of ``root_lengths(T, 2)[-1]`` steps; a shorter last chunk runs any remainder.
    """
    import jax
    import jax.numpy as jnp

    n_inner = root_lengths(model.seq_len, 2)[-1]
    n_outer, tail = divmod(model.seq_len, n_inner)

    def run_scan(params: Any, x: Any) -> tuple[Any, Any]:
        chunk = jax.checkpoint(lambda c, xc: jax.lax.scan(model.cell_step(params), c, xc))
        b, _, d = x.shape
        xs, head = jnp.moveaxis(x, 1, 0), n_outer * n_inner
        carry, hs = jax.lax.scan(chunk, model.carry0, xs[:head].reshape(n_outer, n_inner, b, d))
        hs = None if hs is None else hs.reshape(head, b, -1)
        if tail:
            carry, hs_tail = chunk(carry, xs[head:])
            hs = None if hs is None else jnp.concatenate([hs, hs_tail])
        return carry, hs

    return model.train_step(run_scan), f"{n_outer}x{n_inner}" + (f"+{tail}" if tail else "")


def equinox_default_checkpoints(seq_len: int) -> int:
    """What ``eqxi.scan(kind='checkpointed')`` picks when ``checkpoints`` is not given."""
    if seq_len <= 1:
        return 1
    return math.floor(-1.5 + math.sqrt(2 * seq_len + 0.25)) + 1


def equinox_step(model: SeedModel) -> Step:
    """``equinox.internal.scan(f, init, xs, kind='checkpointed')`` (time-major xs)."""
    import equinox.internal as eqxi
    import jax.numpy as jnp

    def run_scan(params: Any, x: Any) -> tuple[Any, Any]:
        return eqxi.scan(model.cell_step(params), model.carry0, jnp.moveaxis(x, 1, 0),
                         kind="checkpointed")

    return model.train_step(run_scan)


def equinox_version() -> str | None:
    """The installed equinox version, or ``None`` (the row is then skipped)."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("equinox") is None:
        return None
    try:
        return importlib.metadata.version("equinox")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _build_schedule(model: SeedModel, spec: Spec) -> tuple[Step, str]:
    schedule = from_data(spec.schedule)
    return model.problem().build(schedule)[0], spec.detail or schedule.describe()


# builder name -> build(model, spec) -> (un-jitted step, schedule column)
BUILDERS: dict[str, Callable[[SeedModel, Spec], tuple[Step, str]]] = {
    "schedule": _build_schedule,
    "flax": lambda model, spec: (flax_step(model), spec.detail),
    "equinox": lambda model, spec: (equinox_step(model), spec.detail),
    "hand": lambda model, spec: hand_step(model),
}


def schedule_spec(method: str, schedule: Schedule, fused: bool = False) -> Spec:
    """A row that runs the seed problem (``fused``: its fused-readout form) under a ``Schedule``."""
    data = schedule.to_data()
    data.pop("meta", None)
    return Spec(method, "schedule", data, schedule.describe(), fused)


def min_memory_candidates(seq_len: int, max_depth: int = 3) -> list[Schedule]:
    """2/3-level ``autoremat.root`` schedules (inner level remat or stored), and binomial."""
    cands = []
    for depth in range(2, max_depth + 1):
        if 2**depth <= seq_len:  # every level at least 2 long
            cands.append(autoremat.root(seq_len, depth, "nothing_saveable"))
            cands.append(autoremat.root(seq_len, depth, ["nothing_saveable"] * (depth - 1) + ["none"]))
    if seq_len >= 2:
        cands.append(autoremat.binomial(snapshot_range(seq_len)[0]))
    return cands or [autoremat.nested([seq_len], "nothing_saveable")]


# --------------------------------------------------------------------------- one (T, seq2seq)


def fixed_specs(group: Group, extra: Sequence[tuple[str, Any]], wanted: Callable[[str], bool],
                log: Callable[[str], None]) -> list[Spec]:
    """The rows chosen before measuring anything (all but min-memory and tuned)."""
    t = group.seq_len
    specs = [schedule_spec(report.PLAIN, autoremat.plain(t)),
             schedule_spec("per-cell remat", autoremat.nested([t], "nothing_saveable")),
             Spec("flax nn.scan(nn.remat)", "flax", None, "remat each cell")]
    version = equinox_version() if wanted(EQUINOX) else None
    if wanted(EQUINOX) and version is None:
        log("  equinox: not installed (pip install -e '.[bench]'); skipping "
            "eqxi.scan(kind='checkpointed')")
    elif version is not None:
        specs.append(Spec(EQUINOX, "equinox", None,
                          f"checkpoints={equinox_default_checkpoints(t)} (default), equinox {version}"))
    specs.append(Spec("hand sqrt(T) nested", "hand"))
    for method, factory in [*SCHEDULE_ROWS, *extra]:
        schedule = factory(t) if callable(factory) else factory
        if schedule is not None:
            specs.append(schedule_spec(method, schedule))
    return [s for s in specs if wanted(s.method)]


def min_memory_spec(model: SeedModel, max_depth: int, log: Callable[[str], None],
                    method: str = report.MIN_MEMORY) -> Spec:
    """The candidate with the smallest compiled total (compiled and sized, not run)."""
    sized = [(measure(model.problem(), c, run=False), c)
             for c in min_memory_candidates(model.seq_len, max_depth)]
    for m, c in sized:
        if not m.feasible:
            log(f"  min-memory candidate {c.describe()}: {m.reason}")
    fits = [(m.total_bytes, c) for m, c in sized if m.feasible and m.total_bytes is not None]
    chosen = min(fits, key=lambda tc: tc[0])[1] if fits else sized[0][1]
    log(f"  {method.removeprefix('autoremat ')}: {chosen.describe()}")
    return schedule_spec(method, chosen, model.fused_readout)


def tuned_schedule(model: SeedModel, budget: int, trials: int) -> Schedule | None:
    """``autoremat.tune`` on a throw-away study; the only code here that reads a ``TuneResult``."""
    with tempfile.TemporaryDirectory() as tmp:
        result = tune(model.problem(), budget, n_trials=trials, storage=f"sqlite:///{tmp}/c.db",
                      study_name="compare", time_budget=0.5)
    return result.best


def run_spec(group: Group, spec: Spec, *, repeats: int, gpu: bool,
             model: SeedModel | None = None) -> report.Outcome:
    """Build one row's step and measure it with ``measure_step``, in this process."""
    row = report.Row(seq_len=group.seq_len, seq2seq=group.seq2seq, method=spec.method,
                     detail=spec.detail)
    if spec.builder == "none":  # nothing to run (e.g. nothing fits the tuner's budget)
        return report.Outcome(row)
    try:
        model = model or group.model(spec.fused)
        step, row.detail = BUILDERS[spec.builder](model, spec)
    except Exception as e:
        row.error = f"build: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
        return report.Outcome(row)
    grads: list[Any] = []
    n = max(1, repeats)
    m = measure_step(step, model.args, time_budget=0.0, min_repeats=n, max_repeats=n,
                     label=spec.method, on_output=lambda out: grads.extend(_grads(out)))
    return report.Outcome(_fill(row, m, gpu), grads)


def _fill(row: report.Row, m: Measurement, gpu: bool) -> report.Row:
    row.total_bytes, row.temp_bytes, row.step_seconds = m.total_bytes, m.temp_bytes, m.step_seconds
    row.compile_seconds, row.loss, row.error = m.compile_seconds, m.loss, m.reason
    if gpu:  # device figures (None on a CPU: no memory stats)
        row.peak_bytes, row.runtime_peak_bytes = m.peak_bytes, m.runtime_peak_bytes
        row.compile_scratch_bytes = m.compile_scratch_bytes
    return row


def _grads(out: Any) -> list[Any]:
    """Adam's first moment after one step (0.1 x the gradient), as numpy arrays."""
    import jax
    import numpy as np

    leaves = [(jax.tree_util.keystr(p), np.asarray(leaf))
              for p, leaf in jax.tree_util.tree_leaves_with_path(out[1])]
    floats = [(k, a) for k, a in leaves if np.issubdtype(a.dtype, np.floating)]
    return [a for k, a in floats if ".mu" in k] or [a for _, a in floats]


def run_isolated(group: Group, spec: Spec, *, repeats: int, gpu: bool, timeout: float) -> report.Outcome:
    """``run_spec`` in a fresh Python process (so ``peak_bytes_in_use`` is this row's alone)."""
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"group": asdict(group), "spec": asdict(spec), "repeats": repeats,
                                   "gpu": gpu}))
        env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(job)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            failed = proc.returncode != 0 and f"worker exit {proc.returncode}: " + (
                (proc.stderr.strip().splitlines() or [""])[-1][:200])
        except subprocess.TimeoutExpired:
            failed = f"worker timed out after {timeout:.0f} s"
        result = job.with_suffix(".out.json")
        if failed or not result.is_file():
            row = report.Row(seq_len=group.seq_len, seq2seq=group.seq2seq, method=spec.method,
                             detail=spec.detail, error=failed or "worker wrote no result")
            return report.Outcome(row)
        with np.load(job.with_suffix(".grads.npz")) as data:
            grads = [data[f"g{i}"] for i in range(len(data.files))]
        return report.Outcome(report.Row(**json.loads(result.read_text())), grads)


def _worker(job_path: str) -> None:
    """Child side of ``run_isolated``: run one job file, write ``.out.json`` and ``.grads.npz``."""
    import numpy as np

    job = json.loads(Path(job_path).read_text())
    outcome = run_spec(Group(**job["group"]), Spec(**job["spec"]), repeats=job["repeats"],
                       gpu=job["gpu"])
    base = Path(job_path)
    np.savez(base.with_suffix(".grads.npz"), **{f"g{i}": g for i, g in enumerate(outcome.grads)})
    base.with_suffix(".out.json").write_text(json.dumps(asdict(outcome.row)))


def compare_one(seq_len: int, seq2seq: bool, *, batch: int, hidden: int, repeats: int, trials: int,
                gpu: bool, max_depth: int = 3, isolate: bool = False,
                extra: Sequence[tuple[str, Any]] = (), only: set[str] | None = None,
                row_timeout: float = 3600.0, fused: bool = False,
                log: Callable[[str], None] = print) -> list[report.Row]:
    """All rows for one sequence length and loss kind (each in a subprocess when ``isolate``).

    Rows run in order; the min-memory row is chosen after the fixed rows, the
    tuned one under 25% of the measured plain row's total; with ``fused`` (and
    ``seq2seq``) the fused-readout rows follow.
    """
    group = Group(seq_len, seq2seq, batch, hidden)
    models = {False: group.model()}
    model = models[False]
    outcomes: list[report.Outcome] = []

    def wanted(method: str) -> bool:
        return only is None or method in only or method == report.PLAIN

    def add(spec: Spec) -> None:
        t0 = time.perf_counter()
        outcome = (run_isolated(group, spec, repeats=repeats, gpu=gpu, timeout=row_timeout) if isolate
                   else run_spec(group, spec, repeats=repeats, gpu=gpu, model=models[spec.fused]))
        r = outcome.row
        device = "".join(f", {name} {report.megabytes(b)}" for name, b in (
            ("runtime peak", r.runtime_peak_bytes), ("compile scratch", r.compile_scratch_bytes),
            ("process peak", r.peak_bytes)) if b is not None)  # "" on a CPU
        log(f"  {r.method}: total {report.megabytes(r.total_bytes)}{device}, "
            f"temp {report.megabytes(r.temp_bytes)}, step {report.seconds(r.step_seconds)} "
            f"({time.perf_counter() - t0:.0f} s)" + (f", ERROR {r.error}" if r.error else ""))
        outcomes.append(outcome)

    for spec in fixed_specs(group, extra, wanted, log):
        add(spec)
    if wanted(report.MIN_MEMORY):
        add(min_memory_spec(model, max_depth, log))
    if wanted(TUNED) and trials > 0:
        plain_total = outcomes[0].row.total_bytes
        if plain_total is None:
            log("  tuned: no memory_analysis() for the plain scan; skipping")
        else:
            t0 = time.perf_counter()
            best = tuned_schedule(model, plain_total // 4, trials)
            if best is None:
                add(Spec(TUNED, "none", None, "nothing fits the budget"))
            else:
                log(f"  tuned ({trials} trials, {time.perf_counter() - t0:.0f} s): {best.describe()}")
                add(schedule_spec(TUNED, best))
    if fused and seq2seq:
        models[True] = group.model(fused=True)
        add_fused_rows(models[True], outcomes[0].row, add, wanted, max_depth, trials, log)
    return report.check_against_plain(outcomes)


def add_fused_rows(model: SeedModel, plain: report.Row, add: Callable[[Spec], None],
                   wanted: Callable[[str], bool], max_depth: int, trials: int,
                   log: Callable[[str], None]) -> None:
    """The fused-readout rows (see the module doc), after the unfused ones."""
    t = model.seq_len
    for spec in (schedule_spec(report.FUSED_PLAIN, autoremat.plain(t), True),
                 schedule_spec(f"{report.FUSED} sqrt(T) nested",
                               autoremat.root(t, 2, "nothing_saveable"), True)):
        if wanted(spec.method):
            add(spec)
    if wanted(report.FUSED_MIN_MEMORY):
        add(min_memory_spec(model, max_depth, log, report.FUSED_MIN_MEMORY))
    if not wanted(report.FUSED_TUNED) or trials <= 0:
        return
    if plain.total_bytes is None or plain.temp_bytes is None:
        log("  fused tuned: no memory_analysis() for the plain scan; skipping")
        return
    t0 = time.perf_counter()
    best = tuned_schedule(model, plain.total_bytes - plain.temp_bytes + plain.temp_bytes // 100,
                          trials)
    if best is None:
        add(Spec(report.FUSED_TUNED, "none", None, "nothing fits the budget", True))
        return
    log(f"  fused tuned ({trials} trials, {time.perf_counter() - t0:.0f} s): {best.describe()}")
    add(schedule_spec(report.FUSED_TUNED, best, True))


# --------------------------------------------------------------------------- main


def machine() -> str:
    """Device, CPU, cores, OS and library versions, in one line."""
    import jax

    env = environment()
    cpu = platform.processor() or platform.machine()
    try:
        models = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")]
        cpu = models[0].split(":", 1)[1].strip() if models else cpu
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{env['device_kind']} ({env['platform']}, {jax.device_count()} device(s)); CPU {cpu}, "
            f"{cores} cores; {platform.system()} {platform.release()}; python {platform.python_version()}, "
            f"jax {env['jax_version']}, flax {env['flax_version']}, "
            f"equinox {equinox_version() or 'not installed'}")


def _extra_schedule(text: str) -> tuple[str, Schedule]:
    label, sep, path = text.rpartition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"expected LABEL=FILE.yaml, got {text!r}")
    ours = label if label.startswith(report.AUTOREMAT) else f"{report.AUTOREMAT} {label}"
    return ours, load_schedule(path)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seq-lens", default="1000,10000", help="comma-separated T values")
    p.add_argument("--with-1e5", action="store_true",
                   help="also run T=100,000 (on 2 CPU cores: plain ~6 GB and ~25 s a step)")
    p.add_argument("--gpu", action="store_true",
                   help="record the runtime peak, compile scratch and memory_stats() process "
                        "peak per row, each row in its own process (automatic when jax's "
                        "default backend is gpu)")
    p.add_argument("--isolate", choices=["auto", "on", "off"], default="auto",
                   help="run each row in a fresh subprocess (auto: on with --gpu)")
    p.add_argument("--out", default="studies/results", help="folder for compare.md/.json and the PNG")
    p.add_argument("--batch", type=int, default=seed_batch(None, None))
    p.add_argument("--hidden", type=int, default=SEED["hidden"])
    p.add_argument("--repeats", type=int, default=3, help="timed runs per row (median)")
    p.add_argument("--trials", type=int, default=8, help="autoremat.tune trials per (T, loss kind)")
    p.add_argument("--max-depth", type=int, default=3, help="deepest min-memory candidate (2 or 3)")
    p.add_argument("--seq2seq", choices=["both", "last", "all"], default="both",
                   help="loss on the last state, on all steps, or both")
    p.add_argument("--only", default="", help="comma-separated methods to run (plain always runs)")
    p.add_argument("--extra-schedule", action="append", default=[], type=_extra_schedule,
                   metavar="LABEL=FILE.yaml", help="add a row running this autoremat schedule")
    p.add_argument("--row-timeout", type=float, default=3600.0, help="seconds per isolated row")
    p.add_argument("--fused-readout", action="store_true",
                   help="add the fused-readout rows to the loss-on-all-steps groups")
    p.add_argument("--merge", metavar="FILE.json",
                   help="keep a saved compare.json's rows of the T and loss kinds this run does not measure")
    p.add_argument("--render", metavar="FILE.json",
                   help="only rewrite the outputs in --out from a saved compare.json")
    p.add_argument("--readme", nargs="?", const=str(report.PAGE), metavar="PAGE.md",
                   help=f"with --render: also replace the generated tables of this page ({report.PAGE})")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[report.Row]:
    """Run the comparison; print and write the table and plot; return the rows."""
    args = parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return []
    if args.render:
        rows = report.render(Path(args.render), Path(args.out))
        if args.readme:
            report.update_page(Path(args.readme), Path(args.out) / "compare.json")
        return rows
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # rows in subprocesses share the GPU
    import jax

    backend = jax.default_backend()
    gpu = args.gpu or backend == "gpu"
    isolate = {"on": True, "off": False, "auto": gpu}[args.isolate]
    if gpu and backend == "cpu":
        print("note: backend is cpu, memory_stats() gives no peak there; recorded as n/a", flush=True)
    seq_lens = [int(s) for s in args.seq_lens.split(",") if s.strip()]
    if args.with_1e5 and 100_000 not in seq_lens:
        seq_lens.append(100_000)
    kinds = {"both": (False, True), "last": (False,), "all": (True,)}[args.seq2seq]
    only = {m.strip() for m in args.only.split(",") if m.strip()} or None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shown = argv if argv is not None else sys.argv[1:]
    command = ("python studies/compare.py " + shlex.join(shown)).strip()
    previous = json.loads(Path(args.merge).read_text()) if args.merge else None
    where = machine()
    rows: list[report.Row] = []
    walls: list[tuple[int, bool, float]] = []
    start = time.perf_counter()
    for seq_len in seq_lens:
        for seq2seq in kinds:
            print(f"T={seq_len} seq2seq={seq2seq}", flush=True)
            t0 = time.perf_counter()
            rows += compare_one(seq_len, seq2seq, batch=args.batch, hidden=args.hidden,
                                repeats=args.repeats, trials=args.trials, gpu=gpu,
                                max_depth=args.max_depth, isolate=isolate, extra=args.extra_schedule,
                                only=only, row_timeout=args.row_timeout,
                                fused=args.fused_readout, log=lambda m: print(m, flush=True))
            walls.append((seq_len, seq2seq, time.perf_counter() - t0))
            print(f"  done in {walls[-1][2]:.0f} s", flush=True)
            shown_rows, shown_walls, commands = (rows, walls, [command]) if previous is None else \
                report.merged(previous, rows, walls, command)
            fitted = report.write_outputs(out, shown_rows, gpu, commands, shown_walls, isolate, args.batch,
                                   args.hidden, where)
    if not rows:
        return rows
    print(report.table(shown_rows, gpu))
    print(report.slope_table(fitted))
    print(report.ratio_table(report.competitor_ratios(shown_rows)))
    print("\n".join(report.fused_check(shown_rows)))
    print(f"total {time.perf_counter() - start:.0f} s; wrote {out / 'compare.md'}, "
          f"{out / 'compare.json'}, {out / 'memory_vs_T.png'}")
    return rows


if __name__ == "__main__":
    main()
