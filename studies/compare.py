"""Side-by-side remat benchmarks on the seed LSTM train step (issue 6).

In ONE process, on the seed's LSTM train step (``autoremat.seed_lstm``,
seq2seq False and True), for each sequence length T, this measures:

* ``plain``: ``Schedule.plain(T)`` (a plain scan, no remat);
* ``per-cell remat``: ``Schedule.nested([T], 'nothing_saveable')``;
* ``flax nn.scan(nn.remat)``: Flax's FAQ recipe, written here directly;
* ``equinox checkpointed``: ``equinox.internal.scan(kind='checkpointed')``
  (only if equinox is importable; otherwise a skip message);
* ``hand sqrt(T) nested``: two ``lax.scan`` levels with ``jax.checkpoint``
  on the chunk body, written directly (no autoremat);
* ``autoremat min-memory``: the smallest measured total of a few 2/3-level
  nested schedules;
* ``autoremat tuned <=25%``: ``autoremat.tune`` under 25% of the plain
  scan's total, re-measured here next to the others.

Every row gets the same measurement: compile with
``jax.jit(step).lower(*args).compile()``, read ``memory_analysis()``
(total = argument + output + temp - alias), one warm-up run, then
``--repeats`` timed runs (median). The loss is the warm-up's loss and is
compared with the plain scan's (rtol 1e-5). ``--gpu`` adds the device's
``memory_stats()['peak_bytes_in_use']`` after each row (a process-wide
high-water mark, so it only grows from row to row).

Writes ``compare.md`` (table + slopes) and ``memory_vs_T.png`` (log-log
memory vs T for plain and min-memory autoremat, with fitted slopes) into
``--out``.

Usage::

    python studies/compare.py --seq-lens 1000,10000 [--with-1e5] [--gpu] [--out studies/results]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RTOL = 1e-5


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
    peak_bytes: int | None = None
    error: str = ""


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
    import jax

    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:
        return None
    peak = stats.get("peak_bytes_in_use") if isinstance(stats, dict) else None
    return int(peak) if isinstance(peak, int) else None


def compile_step(step: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, float]:
    """The compiled step and its compile wall time (lower + compile)."""
    import jax

    t0 = time.perf_counter()
    compiled = jax.jit(step).lower(*args).compile()
    return compiled, time.perf_counter() - t0


def measure_row(row: Row, step: Callable[..., Any], args: tuple[Any, ...], repeats: int,
                gpu: bool, compiled: tuple[Any, float] | None = None) -> Row:
    """Fill ``row`` by compiling, sizing and timing ``step(*args)``; errors are recorded.

    ``compiled``: an already compiled ``(executable, compile_seconds)`` of that step.
    """
    import jax
    import numpy as np

    try:
        compiled_step, row.compile_seconds = compiled or compile_step(step, args)
        row.total_bytes, row.temp_bytes = _memory(compiled_step)
        out = jax.block_until_ready(compiled_step(*args))
        row.loss = float(np.asarray(out[-1]))
        samples = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled_step(*args))
            samples.append(time.perf_counter() - t0)
        row.step_seconds = statistics.median(samples)
        del compiled_step, out
    except Exception as e:
        row.error = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    if gpu:
        row.peak_bytes = _peak_bytes()
    return row


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


def equinox_step(setup: dict[str, Any], seq2seq: bool) -> Callable[..., Any]:
    """``equinox.internal.scan(kind='checkpointed')`` (default checkpoints)."""
    import equinox.internal as eqxi
    import jax.numpy as jnp

    cell = setup["cell"]

    def run_scan(params: Any, x: Any) -> tuple[Any, Any]:
        def cell_step(carry: Any, xt: Any) -> tuple[Any, Any]:
            carry, h = cell.apply({"params": params["cell"]}, carry, xt)
            return carry, (h if seq2seq else None)

        (_, h_last), hs = eqxi.scan(cell_step, setup["carry0"], jnp.moveaxis(x, 1, 0),
                                    kind="checkpointed")
        return h_last, hs

    return _train_step(setup, seq2seq, run_scan)


def min_memory_candidates(seq_len: int, max_depth: int = 3) -> list[Any]:
    """A few 2/3-level nested schedules with ``nothing_saveable`` outer levels."""
    from autoremat import Schedule

    cands = []
    for depth in range(2, max_depth + 1):
        lengths = _chunk(seq_len, depth)
        if min(lengths) < 2:
            continue
        cands.append(Schedule.nested(lengths, "nothing_saveable"))
        cands.append(Schedule.nested(lengths, ["nothing_saveable"] * (depth - 1) + ["none"]))
    return cands or [Schedule.nested([seq_len], "nothing_saveable")]


# --------------------------------------------------------------------------- one (T, seq2seq)


def compare_one(seq_len: int, seq2seq: bool, *, batch: int, hidden: int, repeats: int, trials: int,
                gpu: bool, max_depth: int = 3, log: Callable[[str], None] = print) -> list[Row]:
    """All rows for one sequence length and loss kind, measured in this process."""
    import importlib.util

    import numpy as np

    from autoremat import Schedule, tune

    setup = _lstm_setup(seq_len, batch, hidden, seq2seq)
    problem, args = setup["problem"], setup["args"]

    def new(method: str, detail: str = "") -> Row:
        return Row(seq_len=seq_len, seq2seq=seq2seq, method=method, detail=detail)

    def with_schedule(method: str, schedule: Any) -> Row:
        step, sargs = problem.build(schedule)
        return measure_row(new(method, schedule.describe()), step, sargs, repeats, gpu)

    rows = [with_schedule("plain", Schedule.plain(seq_len))]
    plain = rows[0]
    log(f"  plain: total {_mb(plain.total_bytes)}, step {_s(plain.step_seconds)}")
    rows.append(with_schedule("per-cell remat", Schedule.nested([seq_len], "nothing_saveable")))
    rows.append(measure_row(new("flax nn.scan(nn.remat)"), flax_scan_remat_step(setup, seq2seq),
                            args, repeats, gpu))
    if importlib.util.find_spec("equinox") is not None:
        try:
            step = equinox_step(setup, seq2seq)
            rows.append(measure_row(new("equinox checkpointed"), step, args, repeats, gpu))
        except Exception as e:
            rows.append(new("equinox checkpointed", f"error: {type(e).__name__}: {e}"[:120]))
    else:
        log("  equinox: not installed, skipping eqxi.scan(kind='checkpointed')")
    step, detail = hand_nested_step(setup, seq2seq, seq_len)
    rows.append(measure_row(new("hand sqrt(T) nested", detail), step, args, repeats, gpu))

    # Minimum memory: size a few candidates (compile only), run the smallest.
    sized = []
    for cand in min_memory_candidates(seq_len, max_depth):
        step, sargs = problem.build(cand)
        try:
            done = compile_step(step, sargs)
        except Exception:
            continue
        total, _ = _memory(done[0])
        if total is not None and (not sized or total < sized[0]):
            sized = [total, cand, step, sargs, done]
    if sized:
        _, best, step, sargs, done = sized
        row = new("autoremat min-memory", best.describe())
        rows.append(measure_row(row, step, sargs, repeats, gpu, compiled=done))
        del done, sized
    else:
        rows.append(with_schedule("autoremat min-memory", min_memory_candidates(seq_len, max_depth)[0]))

    # Tuned under 25% of plain's total; re-measured here for a same-run ratio.
    if plain.total_bytes is not None and trials > 0:
        budget = plain.total_bytes // 4
        with tempfile.TemporaryDirectory() as tmp:
            result = tune(problem, budget, n_trials=trials, storage=f"sqlite:///{tmp}/compare.db",
                          study_name="compare", time_budget=0.5)
        if result.best is not None:
            rows.append(with_schedule("autoremat tuned <=25%", result.best))
        else:
            rows.append(new("autoremat tuned <=25%", "nothing fits the budget"))

    for row in rows:
        if row.step_seconds is not None and plain.step_seconds:
            row.ratio = row.step_seconds / plain.step_seconds
        if row.loss is not None and plain.loss is not None:
            row.loss_matches = bool(np.isclose(row.loss, plain.loss, rtol=RTOL, atol=0.0))
    plain.ratio = 1.0
    return rows


# --------------------------------------------------------------------------- reporting


def _mb(b: int | None) -> str:
    return "-" if b is None else f"{b / 1e6:,.2f} MB"


def _s(s: float | None) -> str:
    return "-" if s is None else f"{s:.3f} s"


def table(rows: Sequence[Row], gpu: bool = False) -> str:
    """A markdown table of ``rows``."""
    head = ["T", "loss on", "method", "schedule", "total", "temp", "step", "ratio", "compile", "loss ok"]
    if gpu:
        head.append("peak (process)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            f"{r.seq_len:,}", "all steps" if r.seq2seq else "last", r.method,
            r.detail or (r.error[:60] if r.error else ""), _mb(r.total_bytes), _mb(r.temp_bytes),
            _s(r.step_seconds), "-" if r.ratio is None else f"{r.ratio:.2f}",
            _s(r.compile_seconds), {True: "yes", False: "NO", None: "-"}[r.loss_matches],
        ]
        if gpu:
            cells.append(_mb(r.peak_bytes))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def slopes(rows: Sequence[Row]) -> dict[tuple[str, bool], float | None]:
    """Fitted log-log slope of total bytes vs T, for plain and min-memory, per loss kind."""
    import numpy as np

    out: dict[tuple[str, bool], float | None] = {}
    for method in ("plain", "autoremat min-memory"):
        for seq2seq in (False, True):
            pts = [(r.seq_len, r.total_bytes) for r in rows
                   if r.method == method and r.seq2seq == seq2seq and r.total_bytes]
            if len({t for t, _ in pts}) < 2:
                out[(method, seq2seq)] = None
                continue
            t, b = np.log10([p[0] for p in pts]), np.log10([p[1] for p in pts])
            out[(method, seq2seq)] = float(np.polyfit(t, b, 1)[0])
    return out


def plot(rows: Sequence[Row], fitted: dict[tuple[str, bool], float | None], path: Path) -> None:
    """Log-log memory vs T for plain and min-memory autoremat, slopes in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for method, marker in (("plain", "o"), ("autoremat min-memory", "s")):
        for seq2seq, style in ((False, "-"), (True, "--")):
            pts = sorted((r.seq_len, r.total_bytes) for r in rows
                         if r.method == method and r.seq2seq == seq2seq and r.total_bytes)
            if not pts:
                continue
            slope = fitted.get((method, seq2seq))
            label = f"{method}, {'seq2seq' if seq2seq else 'last'}"
            label += f" (slope {slope:.2f})" if slope is not None else ""
            ax.plot([p[0] for p in pts], [p[1] / 1e6 for p in pts], style, marker=marker, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("total bytes (memory_analysis), MB")
    ax.set_title("seed LSTM train step: memory vs T")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(rows: Sequence[Row], fitted: dict[tuple[str, bool], float | None], gpu: bool,
           command: str) -> str:
    """The markdown written to ``compare.md``."""
    import jax

    from autoremat._measure import environment

    env = environment()
    lines = [
        "# seed LSTM: side-by-side remat comparison", "",
        f"Measured on {env['device_kind']} ({env['platform']}, {jax.device_count()} device(s)), "
        f"jax {env['jax_version']}, flax {env['flax_version']}.", "",
        f"Command: `{command}`", "",
        table(rows, gpu), "",
        "Log-log slopes of total bytes vs T:", "",
    ]
    for (method, seq2seq), slope in fitted.items():
        kind = "seq2seq" if seq2seq else "last"
        lines.append(f"- {method}, {kind}: {'-' if slope is None else f'{slope:.2f}'}")
    lines += ["", "![memory vs T](memory_vs_T.png)", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seq-lens", default="1000,10000", help="comma-separated T values")
    p.add_argument("--with-1e5", action="store_true", help="also run T=100,000 (slow on CPU)")
    p.add_argument("--gpu", action="store_true", help="record memory_stats() peak per row")
    p.add_argument("--out", default="studies/results", help="folder for compare.md and the PNG")
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per row (median)")
    p.add_argument("--trials", type=int, default=8, help="autoremat.tune trials per (T, loss kind)")
    p.add_argument("--max-depth", type=int, default=3, help="deepest min-memory candidate (2 or 3)")
    p.add_argument("--seq2seq", choices=["both", "last", "all"], default="both",
                   help="loss on the last state, on all steps, or both")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    """Run the comparison; print and write the table and plot; return the rows."""
    args = parse_args(argv)
    seq_lens = [int(s) for s in args.seq_lens.split(",") if s.strip()]
    if args.with_1e5 and 100_000 not in seq_lens:
        seq_lens.append(100_000)
    kinds = {"both": (False, True), "last": (False,), "all": (True,)}[args.seq2seq]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    start = time.perf_counter()
    for seq_len in seq_lens:
        for seq2seq in kinds:
            print(f"T={seq_len} seq2seq={seq2seq}", flush=True)
            t0 = time.perf_counter()
            rows += compare_one(seq_len, seq2seq, batch=args.batch, hidden=args.hidden,
                                repeats=args.repeats, trials=args.trials, gpu=args.gpu,
                                max_depth=args.max_depth)
            print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
    fitted = slopes(rows)
    plot(rows, fitted, out / "memory_vs_T.png")
    command = "python studies/compare.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "compare.md").write_text(report(rows, fitted, args.gpu, command.strip()))
    print(table(rows, args.gpu))
    for (method, seq2seq), slope in fitted.items():
        print(f"slope {method} {'seq2seq' if seq2seq else 'last'}: "
              f"{'-' if slope is None else f'{slope:.2f}'}")
    print(f"total {time.perf_counter() - start:.0f} s; wrote {out / 'compare.md'}, "
          f"{out / 'memory_vs_T.png'}")
    return rows


if __name__ == "__main__":
    main()
