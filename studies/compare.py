"""Side-by-side remat benchmarks on the seed LSTM train step (issue 6).

On the seed's LSTM train step (``autoremat.seed_lstm``, loss on the last
state and on all steps), for each sequence length T, the rows are:

* ``plain``: ``Schedule.plain(T)`` (a plain scan, no remat);
* ``per-cell remat``: ``Schedule.nested([T], 'nothing_saveable')``;
* ``flax nn.scan(nn.remat)``: Flax's FAQ recipe, written here directly;
* ``equinox checkpointed``: ``equinox.internal.scan(kind='checkpointed')``
  with its default ``checkpoints`` (the optional ``bench`` extra; without
  equinox the row is skipped with a message);
* ``hand sqrt(T) nested``: two ``lax.scan`` levels with ``jax.checkpoint``
  on the chunk body, written directly (no autoremat);
* ``autoremat min-memory``: the smallest compiled total of a few 2/3-level
  nested schedules and the binomial (Revolve) schedule with the fewest
  snapshots the tuner would try (at most 6 re-runs of a step);
* ``autoremat tuned <=25%``: ``autoremat.tune`` under 25% of the plain
  scan's total, re-measured here next to the others;
* any ``--extra-schedule LABEL=FILE.yaml`` and the rows of ``SCHEDULE_ROWS``
  (an autoremat schedule per T; how new schedule kinds get a row).

Every row gets the same measurement: compile with
``jax.jit(step).lower(*args).compile()``, read ``memory_analysis()``
(total = argument + output + temp - alias), one warm-up run, then
``--repeats`` timed runs (median). The warm-up's loss is compared with the
plain scan's (rtol 1e-5) and so are its gradients (Adam's first moment after
one step is 0.1 x the gradient; max-norm relative error <= 1e-4).

``--gpu`` (automatic when ``jax.default_backend() == 'gpu'``) also records
``device.memory_stats()['peak_bytes_in_use']`` per row. That is a
process-wide high-water mark, so then every row runs in a fresh subprocess
(``--isolate``); where the backend gives no memory stats (CPU) the peak is
``n/a``. Choosing the min-memory and tuned schedules happens in the parent.

Writes, into ``--out``, after every (T, loss kind): ``compare.md`` (table,
slopes, per-competitor ratios, wall times), ``compare.json`` (the rows) and
``memory_vs_T.png`` (log-log total and temp bytes vs T for the plain scan
and min-memory autoremat, with fitted slopes).

Usage::

    python studies/compare.py --seq-lens 1000,10000 [--with-1e5] [--gpu] [--out studies/results]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RTOL = 1e-5  # loss vs the plain scan's
GRAD_RTOL = 1e-4  # max |g - g_plain| / max |g_plain|, per leaf
AUTOREMAT = "autoremat"  # rows whose method starts with this are ours (ratio tables)
PLAIN = "plain"
MIN_MEMORY = "autoremat min-memory"
TUNED = "autoremat tuned <=25%"

# Extra rows that are just an autoremat schedule: (method, factory(seq_len) -> Schedule, or None to
# skip that T). A new schedule kind gets its row with one entry, e.g. once Schedule.binomial exists:
#   SCHEDULE_ROWS.append(("autoremat binomial s=32", lambda t: Schedule.binomial(32)))
# Methods starting with "autoremat" are compared against every competitor in the ratio table.
SCHEDULE_ROWS: list[tuple[str, Callable[[int], Any]]] = []


@dataclass
class Row:
    """One measured method at one (T, seq2seq)."""

    seq_len: int
    seq2seq: bool
    method: str
    detail: str = ""
    total_bytes: int | None = None
    temp_bytes: int | None = None
    step_seconds: float | None = None
    ratio: float | None = None
    compile_seconds: float | None = None
    loss: float | None = None
    loss_matches: bool | None = None
    grad_error: float | None = None
    grads_match: bool | None = None
    peak_bytes: int | None = None
    error: str = ""


@dataclass(frozen=True)
class Group:
    """One (T, loss kind) of the seed problem: every row of it runs on the same arrays."""

    seq_len: int
    seq2seq: bool
    batch: int = 10
    hidden: int = 128


@dataclass(frozen=True)
class Spec:
    """What one row runs: a builder name (see ``BUILDERS``) and, for ``schedule``, its data."""

    method: str
    builder: str
    schedule: dict[str, Any] | None = None
    detail: str = ""


@dataclass
class Outcome:
    """A measured row and its gradients (for the check against the plain scan)."""

    row: Row
    grads: list[Any] = field(default_factory=list)


# --------------------------------------------------------------------------- measuring


def _memory(compiled: Any) -> tuple[int | None, int | None]:
    """(total, temp) bytes from ``compiled.memory_analysis()``; ``None`` where missing."""
    try:
        a = compiled.memory_analysis()
    except Exception:
        return None, None
    if isinstance(a, (list, tuple)):
        a = a[0] if a else None
    if a is None:
        return None, None
    parts = [getattr(a, f"{k}_size_in_bytes", None) for k in ("argument", "output", "temp", "alias")]
    if any(not isinstance(p, int) or p < 0 for p in parts[:3]):
        return None, parts[2] if isinstance(parts[2], int) and parts[2] >= 0 else None
    arg, out, temp, alias = (int(p) if isinstance(p, int) and p >= 0 else 0 for p in parts)
    return arg + out + temp - alias, temp


def _peak_bytes() -> int | None:
    """The default device's ``peak_bytes_in_use``; ``None`` where there are no stats (CPU)."""
    import jax

    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:
        return None
    peak = stats.get("peak_bytes_in_use") if isinstance(stats, dict) else None
    return int(peak) if isinstance(peak, int) else None


def _grads(out: Any) -> list[Any]:
    """Adam's first moment after one step (0.1 x the gradient), as numpy arrays."""
    import jax
    import numpy as np

    leaves = [(jax.tree_util.keystr(p), np.asarray(leaf))
              for p, leaf in jax.tree_util.tree_leaves_with_path(out[1])]
    floats = [(k, a) for k, a in leaves if np.issubdtype(a.dtype, np.floating)]
    mu = [a for k, a in floats if ".mu" in k]
    return mu or [a for _, a in floats]


def grad_error(grads: Sequence[Any], reference: Sequence[Any]) -> float:
    """Largest per-leaf max-norm relative difference; ``inf`` if the trees differ."""
    import numpy as np

    if len(grads) != len(reference) or not reference:
        return math.inf
    worst = 0.0
    for a, b in zip(grads, reference, strict=True):
        if a.shape != b.shape:
            return math.inf
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        diff = float(np.max(np.abs(a - b))) if b.size else 0.0
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def compile_step(step: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, float]:
    """The compiled step and its compile wall time (lower + compile)."""
    import jax

    t0 = time.perf_counter()
    compiled = jax.jit(step).lower(*args).compile()
    return compiled, time.perf_counter() - t0


def measure_row(row: Row, step: Callable[..., Any], args: tuple[Any, ...], repeats: int,
                gpu: bool, compiled: tuple[Any, float] | None = None) -> Outcome:
    """Fill ``row`` by compiling, sizing and timing ``step(*args)``; errors are recorded.

    ``compiled``: an already compiled ``(executable, compile_seconds)`` of that step.
    """
    import jax
    import numpy as np

    grads: list[Any] = []
    try:
        compiled_step, row.compile_seconds = compiled or compile_step(step, args)
        row.total_bytes, row.temp_bytes = _memory(compiled_step)
        out = jax.block_until_ready(compiled_step(*args))
        row.loss = float(np.asarray(out[-1]))
        grads = _grads(out)
        del out
        samples = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled_step(*args))
            samples.append(time.perf_counter() - t0)
        row.step_seconds = statistics.median(samples)
        del compiled_step
    except Exception as e:
        row.error = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    if gpu:
        row.peak_bytes = _peak_bytes()
    return Outcome(row, grads)


# --------------------------------------------------------------------------- competitors


def _chunk(seq_len: int, depth: int) -> list[int]:
    """Level lengths (outermost first) with product ``seq_len``, each near ``seq_len**(1/depth)``."""
    inner: list[int] = []
    rest = seq_len
    for d in range(depth, 1, -1):
        target = rest ** (1 / d)
        divisors = [c for c in range(1, rest + 1) if rest % c == 0]
        c = min(divisors, key=lambda c: (abs(math.log(c / target)), -c))
        inner.insert(0, c)
        rest //= c
    return [rest, *inner]


def _lstm_setup(seq_len: int, batch: int, hidden: int, seq2seq: bool) -> dict[str, Any]:
    """The seed problem, its plain step and args, and the pieces to write other steps with."""
    import flax.linen as nn
    import jax.numpy as jnp
    import optax

    from autoremat import Schedule, seed_lstm

    problem = seed_lstm(seq_len=seq_len, batch=batch, hidden=hidden, seq2seq=seq2seq)
    _, args = problem.build(Schedule.plain(seq_len))
    carry0 = (jnp.zeros((batch, hidden)), jnp.zeros((batch, hidden)))
    return {
        "problem": problem, "args": args, "cell": nn.OptimizedLSTMCell(hidden),
        "readout": nn.Dense(args[3].shape[-1]), "tx": optax.adam(1e-3), "carry0": carry0,
    }


def _train_step(setup: dict[str, Any], seq2seq: bool,
                run_scan: Callable[[Any, Any], tuple[Any, Any]]) -> Callable[..., Any]:
    """The seed's train step (Dense readout, L2, Adam) around ``run_scan(params, x)``.

    ``run_scan`` returns ``(h_last, hs)`` with ``hs`` time-major ``(T, B, H)``
    (or ``None`` when not seq2seq).
    """
    import jax
    import jax.numpy as jnp
    import optax

    readout, tx = setup["readout"], setup["tx"]

    def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        h_last, hs = run_scan(params, x)
        if seq2seq:
            preds = jnp.moveaxis(readout.apply({"params": params["readout"]}, hs), 0, 1)
        else:
            preds = readout.apply({"params": params["readout"]}, h_last)
        return optax.l2_loss(preds, y).mean()

    def train_step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def flax_scan_remat_step(setup: dict[str, Any], seq2seq: bool) -> Callable[..., Any]:
    """``nn.scan(nn.remat(OptimizedLSTMCell))`` over axis 1, same params as the seed."""
    import flax.linen as nn

    hidden = setup["cell"].features
    scanned = nn.scan(
        nn.remat(nn.OptimizedLSTMCell), variable_broadcast="params", split_rngs={"params": False},
        in_axes=1, out_axes=0,
    )(hidden)

    def run_scan(params: Any, x: Any) -> tuple[Any, Any]:
        (_, h_last), hs = scanned.apply({"params": params["cell"]}, setup["carry0"], x)
        return h_last, (hs if seq2seq else None)

    return _train_step(setup, seq2seq, run_scan)


def hand_nested_step(setup: dict[str, Any], seq2seq: bool, seq_len: int) -> tuple[Callable[..., Any], str]:
    """Two ``lax.scan`` levels, ``jax.checkpoint`` on the chunk body (no autoremat)."""
    import jax
    import jax.numpy as jnp

    n_outer, n_inner = _chunk(seq_len, 2)
    cell = setup["cell"]

    def run_scan(params: Any, x: Any) -> tuple[Any, Any]:
        def cell_step(carry: Any, xt: Any) -> tuple[Any, Any]:
            carry, h = cell.apply({"params": params["cell"]}, carry, xt)
            return carry, (h if seq2seq else None)

        @jax.checkpoint
        def chunk(carry: Any, xc: Any) -> tuple[Any, Any]:
            return jax.lax.scan(cell_step, carry, xc)

        b, t, d = x.shape
        xs = jnp.moveaxis(x, 1, 0).reshape(n_outer, n_inner, b, d)
        (_, h_last), hs = jax.lax.scan(chunk, setup["carry0"], xs)
        return h_last, (hs.reshape(t, b, -1) if seq2seq else None)

    return _train_step(setup, seq2seq, run_scan), f"{n_outer}x{n_inner}"


def equinox_default_checkpoints(seq_len: int) -> int:
    """What ``eqxi.scan(kind='checkpointed')`` picks when ``checkpoints`` is not given."""
    if seq_len <= 1:
        return 1
    return math.floor(-1.5 + math.sqrt(2 * seq_len + 0.25)) + 1


def equinox_step(setup: dict[str, Any], seq2seq: bool,
                 checkpoints: int | None = None) -> Callable[..., Any]:
    """``equinox.internal.scan(f, init, xs, kind='checkpointed', checkpoints=...)`` (time-major xs)."""
    import equinox.internal as eqxi
    import jax.numpy as jnp

    cell = setup["cell"]

    def run_scan(params: Any, x: Any) -> tuple[Any, Any]:
        def cell_step(carry: Any, xt: Any) -> tuple[Any, Any]:
            carry, h = cell.apply({"params": params["cell"]}, carry, xt)
            return carry, (h if seq2seq else None)

        (_, h_last), hs = eqxi.scan(cell_step, setup["carry0"], jnp.moveaxis(x, 1, 0),
                                    kind="checkpointed", checkpoints=checkpoints)
        return h_last, hs

    return _train_step(setup, seq2seq, run_scan)


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


def min_memory_candidates(seq_len: int, max_depth: int = 3) -> list[Any]:
    """A few 2/3-level nested schedules with ``nothing_saveable`` outer levels, and binomial."""
    from autoremat import Schedule
    from autoremat._space import snapshot_range

    cands = []
    for depth in range(2, max_depth + 1):
        lengths = _chunk(seq_len, depth)
        if min(lengths) < 2:
            continue
        cands.append(Schedule.nested(lengths, "nothing_saveable"))
        cands.append(Schedule.nested(lengths, ["nothing_saveable"] * (depth - 1) + ["none"]))
    if seq_len >= 2:
        cands.append(Schedule.binomial(snapshot_range(seq_len)[0]))
    return cands or [Schedule.nested([seq_len], "nothing_saveable")]


def _build_schedule(setup: dict[str, Any], group: Group, spec: Spec) -> tuple[Any, Any, str]:
    from autoremat import Schedule

    schedule = Schedule.from_data(spec.schedule)
    step, args = setup["problem"].build(schedule)
    return step, args, spec.detail or schedule.describe()


def _build_flax(setup: dict[str, Any], group: Group, spec: Spec) -> tuple[Any, Any, str]:
    return flax_scan_remat_step(setup, group.seq2seq), setup["args"], spec.detail


def _build_equinox(setup: dict[str, Any], group: Group, spec: Spec) -> tuple[Any, Any, str]:
    return equinox_step(setup, group.seq2seq), setup["args"], spec.detail


def _build_hand(setup: dict[str, Any], group: Group, spec: Spec) -> tuple[Any, Any, str]:
    step, detail = hand_nested_step(setup, group.seq2seq, group.seq_len)
    return step, setup["args"], detail


# builder name -> build(setup, group, spec) -> (un-jitted step, args, schedule column)
BUILDERS: dict[str, Callable[[dict[str, Any], Group, Spec], tuple[Any, Any, str]]] = {
    "schedule": _build_schedule, "flax": _build_flax, "equinox": _build_equinox, "hand": _build_hand,
}


def schedule_spec(method: str, schedule: Any) -> Spec:
    """A row that runs the seed problem under an autoremat ``Schedule``."""
    data = schedule.to_data()
    data.pop("meta", None)
    return Spec(method, "schedule", data, schedule.describe())


# --------------------------------------------------------------------------- one (T, seq2seq)


def plan_group(group: Group, setup: dict[str, Any], *, trials: int, max_depth: int,
               extra: Sequence[tuple[str, Any]] = (), only: set[str] | None = None,
               cache: dict[str, tuple[Any, float]] | None = None,
               log: Callable[[str], None] = print) -> list[Spec]:
    """The rows of one group, in order; picks the min-memory and tuned schedules.

    ``cache`` receives the executables compiled while choosing (by method), so an
    in-process run does not compile them again. ``only``: methods to keep (plain always).
    """
    from autoremat import Schedule, tune

    seq_len = group.seq_len
    cache = {} if cache is None else cache

    def wanted(method: str) -> bool:
        return only is None or method in only or method == PLAIN

    specs = [schedule_spec(PLAIN, Schedule.plain(seq_len)),
             schedule_spec("per-cell remat", Schedule.nested([seq_len], "nothing_saveable")),
             Spec("flax nn.scan(nn.remat)", "flax", None, "remat each cell")]
    if wanted("equinox checkpointed"):
        version = equinox_version()
        if version is None:
            log("  equinox: not installed (pip install -e '.[bench]'); skipping "
                "eqxi.scan(kind='checkpointed')")
        else:
            specs.append(Spec("equinox checkpointed", "equinox", None,
                              f"checkpoints={equinox_default_checkpoints(seq_len)} (default), "
                              f"equinox {version}"))
    specs.append(Spec("hand sqrt(T) nested", "hand"))
    for method, factory in [*SCHEDULE_ROWS, *extra]:
        schedule = factory(seq_len) if callable(factory) else factory
        if schedule is not None:
            specs.append(schedule_spec(method, schedule))
    specs = [s for s in specs if wanted(s.method)]

    # Minimum memory: compile a few candidates (no running), keep the smallest total.
    if wanted(MIN_MEMORY):
        best: tuple[int, Any, tuple[Any, float]] | None = None
        for cand in min_memory_candidates(seq_len, max_depth):
            step, sargs = setup["problem"].build(cand)
            try:
                done = compile_step(step, sargs)
            except Exception as e:
                log(f"  min-memory candidate {cand.describe()}: {type(e).__name__}")
                continue
            total, _ = _memory(done[0])
            if total is not None and (best is None or total < best[0]):
                best = (total, cand, done)
        chosen = best[1] if best else min_memory_candidates(seq_len, max_depth)[0]
        if best:
            cache[MIN_MEMORY] = best[2]
        specs.append(schedule_spec(MIN_MEMORY, chosen))
        log(f"  min-memory: {chosen.describe()}")
        del best

    # Tuned under 25% of plain's compiled total.
    if wanted(TUNED) and trials > 0:
        step, sargs = setup["problem"].build(Schedule.plain(seq_len))
        cache[PLAIN] = compile_step(step, sargs)
        plain_total, _ = _memory(cache[PLAIN][0])
        if plain_total is None:
            log("  tuned: no memory_analysis() for the plain scan; skipping")
        else:
            budget = plain_total // 4
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                result = tune(setup["problem"], budget, n_trials=trials, storage=f"sqlite:///{tmp}/c.db",
                              study_name="compare", time_budget=0.5)
            took = time.perf_counter() - t0
            if result.best is not None:
                specs.append(schedule_spec(TUNED, result.best))
                log(f"  tuned ({trials} trials, {took:.0f} s): {result.best.describe()}")
            else:
                specs.append(Spec(TUNED, "none", None, "nothing fits the budget"))
    return specs


def run_spec(group: Group, spec: Spec, *, repeats: int, gpu: bool, setup: dict[str, Any] | None = None,
             compiled: tuple[Any, float] | None = None) -> Outcome:
    """Build, compile, size and time one row in this process."""
    row = Row(seq_len=group.seq_len, seq2seq=group.seq2seq, method=spec.method, detail=spec.detail)
    if spec.builder == "none":  # nothing to run (e.g. nothing fits the tuner's budget)
        return Outcome(row)
    if spec.builder not in BUILDERS:
        row.error = f"unknown builder {spec.builder!r}"
        return Outcome(row)
    try:
        setup = setup or _lstm_setup(group.seq_len, group.batch, group.hidden, group.seq2seq)
        step, args, row.detail = BUILDERS[spec.builder](setup, group, spec)
    except Exception as e:
        row.error = f"build: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
        return Outcome(row)
    return measure_row(row, step, args, repeats, gpu, compiled=compiled)


def run_isolated(group: Group, spec: Spec, *, repeats: int, gpu: bool, timeout: float) -> Outcome:
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
            row = Row(seq_len=group.seq_len, seq2seq=group.seq2seq, method=spec.method,
                      detail=spec.detail, error=failed or "worker wrote no result")
            return Outcome(row)
        row = Row(**json.loads(result.read_text()))
        npz = job.with_suffix(".grads.npz")
        with np.load(npz) as data:
            grads = [data[f"g{i}"] for i in range(len(data.files))]
    return Outcome(row, grads)


def _worker(job_path: str) -> None:
    """Child side of ``run_isolated``: run one job file, write ``.out.json`` and ``.grads.npz``."""
    import numpy as np

    job = json.loads(Path(job_path).read_text())
    group, spec = Group(**job["group"]), Spec(**job["spec"])
    outcome = run_spec(group, spec, repeats=job["repeats"], gpu=job["gpu"])
    base = Path(job_path)
    np.savez(base.with_suffix(".grads.npz"), **{f"g{i}": g for i, g in enumerate(outcome.grads)})
    base.with_suffix(".out.json").write_text(json.dumps(asdict(outcome.row)))


def check_against_plain(outcomes: Sequence[Outcome]) -> list[Row]:
    """Step-time ratio, loss match and gradient match of every row against the group's plain row."""
    import numpy as np

    rows = [o.row for o in outcomes]
    plain = next((o for o in outcomes if o.row.method == PLAIN), None)
    if plain is None:
        return rows
    for o in outcomes:
        r = o.row
        if r.step_seconds is not None and plain.row.step_seconds:
            r.ratio = r.step_seconds / plain.row.step_seconds
        if r.loss is not None and plain.row.loss is not None:
            r.loss_matches = bool(np.isclose(r.loss, plain.row.loss, rtol=RTOL, atol=0.0))
        if o.grads and plain.grads:
            r.grad_error = grad_error(o.grads, plain.grads)
            r.grads_match = r.grad_error <= GRAD_RTOL
    if plain.row.step_seconds:
        plain.row.ratio = 1.0
    return rows


def compare_one(seq_len: int, seq2seq: bool, *, batch: int, hidden: int, repeats: int, trials: int,
                gpu: bool, max_depth: int = 3, isolate: bool = False,
                extra: Sequence[tuple[str, Any]] = (), only: set[str] | None = None,
                row_timeout: float = 3600.0, log: Callable[[str], None] = print) -> list[Row]:
    """All rows for one sequence length and loss kind (each in a subprocess when ``isolate``)."""
    group = Group(seq_len, seq2seq, batch, hidden)
    setup = _lstm_setup(seq_len, batch, hidden, seq2seq)
    cache: dict[str, tuple[Any, float]] = {}
    specs = plan_group(group, setup, trials=trials, max_depth=max_depth, extra=extra, only=only,
                       cache=cache, log=log)
    if isolate:
        cache.clear()
    outcomes = []
    for spec in specs:
        t0 = time.perf_counter()
        if isolate:
            outcome = run_isolated(group, spec, repeats=repeats, gpu=gpu, timeout=row_timeout)
        else:
            outcome = run_spec(group, spec, repeats=repeats, gpu=gpu, setup=setup,
                               compiled=cache.pop(spec.method, None))
        r = outcome.row
        log(f"  {r.method}: total {_mb(r.total_bytes)}, temp {_mb(r.temp_bytes)}, "
            f"step {_s(r.step_seconds)} ({time.perf_counter() - t0:.0f} s)"
            + (f", ERROR {r.error}" if r.error else ""))
        outcomes.append(outcome)
    return check_against_plain(outcomes)


# --------------------------------------------------------------------------- reporting


def _mb(b: int | None) -> str:
    return "-" if b is None else f"{b / 1e6:,.2f} MB"


def _s(s: float | None) -> str:
    return "-" if s is None else f"{s:.3f} s"


def _kind(seq2seq: bool) -> str:
    return "all steps" if seq2seq else "last"


def _ok(value: bool | None) -> str:
    return {True: "yes", False: "NO", None: "-"}[value]


def table(rows: Sequence[Row], gpu: bool = False) -> str:
    """A markdown table of ``rows``."""
    head = ["T", "loss on", "method", "schedule", "total", "temp", "step", "vs plain", "compile",
            "loss ok", "grads ok"]
    if gpu:
        head.append("device peak")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            f"{r.seq_len:,}", _kind(r.seq2seq), r.method,
            (r.detail or "") + (f" ERROR {r.error[:80]}" if r.error else ""),
            _mb(r.total_bytes), _mb(r.temp_bytes), _s(r.step_seconds),
            "-" if r.ratio is None else f"{r.ratio:.2f}", _s(r.compile_seconds),
            _ok(r.loss_matches), _ok(r.grads_match),
        ]
        if gpu:
            cells.append("n/a" if r.peak_bytes is None else _mb(r.peak_bytes))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Slope:
    """A fitted log-log slope of bytes vs T for one method and loss kind."""

    method: str
    seq2seq: bool
    measure: str  # "total" or "temp"
    seq_lens: tuple[int, ...]
    slope: float | None


def _fit(points: Sequence[tuple[int, float]]) -> float | None:
    import numpy as np

    pts = [(t, b) for t, b in points if b and b > 0]
    if len({t for t, _ in pts}) < 2:
        return None
    return float(np.polyfit(np.log10([p[0] for p in pts]), np.log10([p[1] for p in pts]), 1)[0])


def slopes(rows: Sequence[Row], methods: Sequence[str] | None = None) -> list[Slope]:
    """Log-log slopes of total and temp bytes vs T per (method, loss kind), over all measured T."""
    methods = list(methods) if methods is not None else list(dict.fromkeys(r.method for r in rows))
    out = []
    for method in methods:
        for seq2seq in (False, True):
            mine = sorted((r for r in rows if r.method == method and r.seq2seq == seq2seq),
                          key=lambda r: r.seq_len)
            if not mine:
                continue
            measures: list[tuple[str, Callable[[Row], float | None]]] = [
                ("total", lambda r: r.total_bytes), ("temp", lambda r: r.temp_bytes)]
            for name, get in measures:
                pts = [(r.seq_len, get(r)) for r in mine]
                pts = [(t, b) for t, b in pts if b is not None and b > 0]
                out.append(Slope(method, seq2seq, name, tuple(t for t, _ in pts), _fit(pts)))
    return out


def slope_table(fitted: Sequence[Slope]) -> str:
    """Markdown: one line per (method, loss kind), a column per measure."""
    measures = ["total", "temp"]
    head = "| method | loss on | T points | " + " | ".join(f"slope {m}" for m in measures) + " |"
    lines = [head, "|" + "---|" * (3 + len(measures))]
    for method, seq2seq in dict.fromkeys((s.method, s.seq2seq) for s in fitted):
        mine = {s.measure: s for s in fitted if (s.method, s.seq2seq) == (method, seq2seq)}
        points = mine["total"].seq_lens if "total" in mine else ()
        cells = [method, _kind(seq2seq), ", ".join(f"{t:,}" for t in points) or "-"]
        for m in measures:
            s = mine.get(m)
            cells.append("-" if s is None or s.slope is None else f"{s.slope:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def competitor_ratios(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """For each group and competitor, each autoremat row's memory and step-time ratio against it.

    A ratio below 1 means the autoremat row uses less memory / is faster.
    """
    out = []
    groups = list(dict.fromkeys((r.seq_len, r.seq2seq) for r in rows))
    for seq_len, seq2seq in groups:
        mine = [r for r in rows if (r.seq_len, r.seq2seq) == (seq_len, seq2seq)]
        ours = [r for r in mine if r.method.startswith(AUTOREMAT)]
        for comp in (r for r in mine if not r.method.startswith(AUTOREMAT)):
            for a in ours:
                out.append({
                    "seq_len": seq_len, "seq2seq": seq2seq, "competitor": comp.method, "ours": a.method,
                    "total_ratio": _ratio(a.total_bytes, comp.total_bytes),
                    "temp_ratio": _ratio(a.temp_bytes, comp.temp_bytes),
                    "time_ratio": _ratio(a.step_seconds, comp.step_seconds),
                })
    return out


def ratio_table(ratios: Sequence[dict[str, Any]]) -> str:
    """Markdown: one line per (T, loss kind, competitor), columns per autoremat row."""
    ours = list(dict.fromkeys(r["ours"] for r in ratios))
    head = ["T", "loss on", "competitor"]
    for name in ours:
        short = name.removeprefix(AUTOREMAT).strip()
        head += [f"{short}: memory total / temp", f"{short}: step time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = list(dict.fromkeys((r["seq_len"], r["seq2seq"], r["competitor"]) for r in ratios))

    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x" if v >= 0.1 else f"{v:.3f}x"

    for seq_len, seq2seq, comp in keys:
        cells = [f"{seq_len:,}", _kind(seq2seq), comp]
        for name in ours:
            r = next((r for r in ratios if (r["seq_len"], r["seq2seq"], r["competitor"], r["ours"])
                      == (seq_len, seq2seq, comp, name)), None)
            cells += ["-", "-"] if r is None else [f"{x(r['total_ratio'])} / {x(r['temp_ratio'])}",
                                                   x(r["time_ratio"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: Sequence[Row], fitted: Sequence[Slope], path: Path) -> None:
    """Log-log total and temp bytes vs T for plain and min-memory autoremat, slopes in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, measure in zip(axes, ("total", "temp"), strict=True):
        for method, marker in ((PLAIN, "o"), (MIN_MEMORY, "s")):
            for seq2seq, style in ((False, "-"), (True, "--")):
                get = (lambda r: r.total_bytes) if measure == "total" else (lambda r: r.temp_bytes)
                pts = sorted((r.seq_len, get(r)) for r in rows
                             if r.method == method and r.seq2seq == seq2seq and get(r))
                if not pts:
                    continue
                slope = next((s.slope for s in fitted if (s.method, s.seq2seq, s.measure)
                              == (method, seq2seq, measure)), None)
                label = f"{method}, {'seq2seq' if seq2seq else 'last'}"
                label += f" (slope {slope:.2f})" if slope is not None else ""
                ax.plot([p[0] for p in pts], [p[1] / 1e6 for p in pts], style, marker=marker, label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(f"{measure} bytes (memory_analysis), MB")
        ax.set_title(f"seed LSTM train step: {measure} memory vs T")
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> str:
    """Device, CPU, cores, OS and library versions, in one line."""
    import jax

    from autoremat._measure import environment

    env = environment()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    eqx = equinox_version()
    return (f"{env['device_kind']} ({env['platform']}, {jax.device_count()} device(s)); CPU {cpu}, "
            f"{cores} cores; {platform.system()} {platform.release()}; python {platform.python_version()}, "
            f"jax {env['jax_version']}, flax {env['flax_version']}, "
            f"equinox {eqx or 'not installed'}")


def _commands_md(command: str | Sequence[str]) -> list[str]:
    commands = [command] if isinstance(command, str) else list(command)
    if len(commands) == 1:
        return [f"Command: `{commands[0]}`", ""]
    return ["Commands (a later one's rows replace the same T and loss of an earlier one's):", "",
            *[f"- `{c}`" for c in commands], ""]


def report(rows: Sequence[Row], fitted: Sequence[Slope], gpu: bool, command: str | Sequence[str],
           walls: Sequence[tuple[int, bool, float]] = (), isolate: bool = False,
           where: str | None = None) -> str:
    """The markdown written to ``compare.md`` (``where``: the machine line; default this one)."""
    lines = [
        "# seed LSTM: side-by-side remat comparison", "",
        f"Measured on: {where or machine()}.", "",
        *_commands_md(command),
        "Rows of one (T, loss on) run in the same process one after another"
        + (" (each row in a fresh subprocess, for the device peak)" if isolate else "")
        + "; `vs plain` is the step-time ratio to that group's plain scan. total = argument + output "
        "+ temp - alias of the compiled step (`memory_analysis()`); step = median of the timed runs "
        "after one warm-up; loss ok: the warm-up loss equals plain's (rtol 1e-5); grads ok: Adam's "
        "first moment (0.1 x gradient) equals plain's (max-norm relative error <= 1e-4)"
        + ("; device peak: `memory_stats()['peak_bytes_in_use']` of the row's process "
           "(n/a where the backend has no memory stats)" if gpu else "") + ". Memory figures are exact "
        "and reproducible; step times are wall-clock medians on the machine as it was (on a shared "
        "CPU they move by tens of percent between runs), so compare rows of one group.", "",
        table(rows, gpu), "",
        "## Memory vs T: log-log slopes", "",
        "Fitted over every measured T. total includes the input x (T * B * 32 float32), linear for "
        "every method; temp is what remat changes. With the loss on all steps the step itself "
        "keeps per-step arrays (the (T, B, H) hidden states the readout reads, the (B, T, 4) "
        "predictions and their gradients), so every method is linear there too.", "",
        slope_table(fitted), "",
        "![memory vs T](memory_vs_T.png)", "",
        "## autoremat against each competitor", "",
        "autoremat's rows divided by the competitor's, same T and loss (below 1: less memory / faster).",
        "",
        ratio_table(competitor_ratios(rows)), "",
    ]
    if walls:
        lines += ["## Wall time", "", "| T | loss on | wall (plan + all rows) |", "|---|---|---|"]
        lines += [f"| {t:,} | {_kind(s)} | {w:.0f} s |" for t, s, w in walls]
        lines += ["", f"Total: {sum(w for _, _, w in walls):.0f} s.", ""]
    return "\n".join(lines)


def write_outputs(out: Path, rows: Sequence[Row], gpu: bool, command: str | Sequence[str],
                  walls: Sequence[tuple[int, bool, float]], isolate: bool, batch: int = 10,
                  hidden: int = 128, where: str | None = None) -> list[Slope]:
    """compare.md, compare.json and memory_vs_T.png; returns the slopes."""
    where = where or machine()
    fitted = slopes(rows)
    plot(rows, fitted, out / "memory_vs_T.png")
    (out / "compare.md").write_text(report(rows, fitted, gpu, command, walls, isolate, where))
    commands = [command] if isinstance(command, str) else list(command)
    data = {"commands": commands, "machine": where, "gpu": gpu, "isolate": isolate, "batch": batch,
            "hidden": hidden, "rows": [asdict(r) for r in rows], "slopes": [asdict(s) for s in fitted],
            "ratios": competitor_ratios(rows),
            "walls": [{"seq_len": t, "seq2seq": s, "seconds": w} for t, s, w in walls]}
    (out / "compare.json").write_text(json.dumps(data, indent=1, default=str))
    return fitted


README_BEGIN = "<!-- studies/compare.py --readme: begin (generated, do not edit) -->"
README_END = "<!-- studies/compare.py --readme: end -->"


def readme_section(data: dict[str, Any]) -> str:
    """What goes between the README markers: machine, command, the table and the slopes."""
    rows = [Row(**r) for r in data["rows"]]
    fitted = slopes(rows)
    total = sum(w["seconds"] for w in data.get("walls", []))
    walls = ", ".join(f"T={w['seq_len']:,} {_kind(w['seq2seq'])} {w['seconds']:.0f} s"
                      for w in data.get("walls", []))
    return "\n".join([
        f"Measured on: {data['machine']}.", "",
        "```bash", *_saved_commands(data), "```", "",
        f"Wall time {total / 60:.0f} min ({walls}).", "",
        table(rows, data.get("gpu", False)), "",
        slope_table([s for s in fitted if s.method in (PLAIN, MIN_MEMORY)]), "",
    ])


def _saved_commands(data: dict[str, Any]) -> list[str]:
    return list(data.get("commands") or [data["command"]])


def merged(previous: dict[str, Any], rows: Sequence[Row], walls: Sequence[tuple[int, bool, float]],
           command: str) -> tuple[list[Row], list[tuple[int, bool, float]], list[str]]:
    """This run's rows plus a saved run's rows of the (T, loss) groups this run did not measure."""
    mine = {(r.seq_len, r.seq2seq) for r in rows}
    old = [Row(**r) for r in previous["rows"] if (r["seq_len"], r["seq2seq"]) not in mine]
    old_walls = [(w["seq_len"], w["seq2seq"], w["seconds"]) for w in previous.get("walls", [])
                 if (w["seq_len"], w["seq2seq"]) not in mine]
    all_rows = sorted([*old, *rows], key=lambda r: (r.seq_len, r.seq2seq))  # stable: method order kept
    all_walls = sorted([*old_walls, *walls], key=lambda w: (w[0], w[1]))
    return all_rows, all_walls, [*_saved_commands(previous), command] if old else [command]


def update_readme(readme: Path, json_path: Path) -> None:
    """Replace the text between ``README_BEGIN`` and ``README_END`` in ``readme``."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise SystemExit(f"{readme}: no {README_BEGIN!r} ... {README_END!r} markers")
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    body = readme_section(json.loads(json_path.read_text()))
    readme.write_text(f"{head}{README_BEGIN}\n{body}{README_END}{tail}")


def render(json_path: Path, out: Path) -> list[Row]:
    """Rewrite compare.md/.json and the PNG from a saved compare.json (no measuring)."""
    data = json.loads(Path(json_path).read_text())
    rows = [Row(**r) for r in data["rows"]]
    walls = [(w["seq_len"], w["seq2seq"], w["seconds"]) for w in data.get("walls", [])]
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(out, rows, data.get("gpu", False), _saved_commands(data), walls, data.get("isolate", False),
                  data.get("batch", 10), data.get("hidden", 128), data.get("machine"))
    return rows


# --------------------------------------------------------------------------- main


def _extra_schedule(text: str) -> tuple[str, Any]:
    label, sep, path = text.rpartition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"expected LABEL=FILE.yaml, got {text!r}")
    from autoremat._schedule import load_schedule

    return label if label.startswith(AUTOREMAT) else f"{AUTOREMAT} {label}", load_schedule(path)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seq-lens", default="1000,10000", help="comma-separated T values")
    p.add_argument("--with-1e5", action="store_true",
                   help="also run T=100,000 (on 2 CPU cores: plain ~6 GB and ~25 s a step)")
    p.add_argument("--gpu", action="store_true",
                   help="record memory_stats() peak per row, each row in its own process "
                        "(automatic when jax's default backend is gpu)")
    p.add_argument("--isolate", choices=["auto", "on", "off"], default="auto",
                   help="run each row in a fresh subprocess (auto: on with --gpu)")
    p.add_argument("--out", default="studies/results", help="folder for compare.md/.json and the PNG")
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per row (median)")
    p.add_argument("--trials", type=int, default=8, help="autoremat.tune trials per (T, loss kind)")
    p.add_argument("--max-depth", type=int, default=3, help="deepest min-memory candidate (2 or 3)")
    p.add_argument("--seq2seq", choices=["both", "last", "all"], default="both",
                   help="loss on the last state, on all steps, or both")
    p.add_argument("--only", default="", help="comma-separated methods to run (plain always runs)")
    p.add_argument("--extra-schedule", action="append", default=[], type=_extra_schedule,
                   metavar="LABEL=FILE.yaml", help="add a row running this autoremat schedule")
    p.add_argument("--row-timeout", type=float, default=3600.0, help="seconds per isolated row")
    p.add_argument("--merge", metavar="FILE.json",
                   help="keep a saved compare.json's rows of the T and loss kinds this run does not measure")
    p.add_argument("--render", metavar="FILE.json",
                   help="only rewrite the outputs in --out from a saved compare.json")
    p.add_argument("--readme", metavar="README.md",
                   help="with --render: also replace the generated section of this README")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    """Run the comparison; print and write the table and plot; return the rows."""
    args = parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return []
    if args.render:
        rows = render(Path(args.render), Path(args.out))
        if args.readme:
            update_readme(Path(args.readme), Path(args.out) / "compare.json")
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
    rows: list[Row] = []
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
                                log=lambda m: print(m, flush=True))
            walls.append((seq_len, seq2seq, time.perf_counter() - t0))
            print(f"  done in {walls[-1][2]:.0f} s", flush=True)
            shown_rows, shown_walls, commands = (rows, walls, [command]) if previous is None else \
                merged(previous, rows, walls, command)
            fitted = write_outputs(out, shown_rows, gpu, commands, shown_walls, isolate, args.batch,
                                   args.hidden)
    if not rows:
        return rows
    print(table(shown_rows, gpu))
    print(slope_table(fitted))
    print(ratio_table(competitor_ratios(shown_rows)))
    print(f"total {time.perf_counter() - start:.0f} s; wrote {out / 'compare.md'}, "
          f"{out / 'compare.json'}, {out / 'memory_vs_T.png'}")
    return rows


if __name__ == "__main__":
    main()
