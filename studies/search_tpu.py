"""Searching on the TPU (issue 36): one process, one command, within ``--deadline``.

Stages, in priority order; each is guarded (a failure is written down, the next one
runs), starts only with time left, and appends its result to ``--out/search_tpu.md``
and ``search_tpu.json`` as it finishes, with one printed line:

a. ``big``: tune the seed LSTM at hidden 1024, batch 128, T=10^4, seq2seq, under 12 GB
   with a time limit of 80 s: out-of-memory compiles (every compile is counted: a
   wrapper around ``compile_step``), trials, wall time, the pick and its step time.
   Target: at most 2 out-of-memory compiles, and the pick in at most 81 s (half of
   the 162 s before) or faster than 593 ms.
b. ``seed_4gb``: the seed at T=10^4 under 4 GB, tuned from ``Problem.from_loss`` on
   ``examples/seed_unmodified.py`` (``linen.problem``) and from the built-in problem
   with ``fused_readout=None`` (60 s each): each pick and whether it is fused; then
   a small fixed grid timed directly, fused and unfused (``GRID``), so the target --
   each pick within 1.05x the faster of the best fused and best unfused that fit --
   is checked.
c. ``seed_100k``: the built-in seed at T=10^5 (fusion a choice) under 1 GB, 80 s.
d. ``offload``: the probe's offload placements on this device (offered / left out and
   why), at hidden 1024, batch 128, fused readout; then the smallest on-device
   schedules (``ON_DEVICE``) and each offered placement's schedule (``OFFLOADED``)
   measured, and whether any offload schedule fits a budget below the smallest
   on-device one (9/10 of it) -- "does offload win where HBM binds".
e. ``priors``: plain at unroll 1 and 8 and binomial s=11 (seed, seq2seq, T=10^4),
   and the ``TPU_PRIOR`` constants they give (``autoremat._search.planning.predict``).

On the TPU machine, after the set-up of ``shared/reference/tpu.md`` (optuna from the
carried wheels into ``/tmp/site``)::

    PYTHONUNBUFFERED=1 PYTHONPATH=$PYTHONPATH:/tmp/site:$PWD \\
        python3 studies/search_tpu.py --out "$OUT"

``--stages b,e`` runs only those. Off a TPU it says so and exits 0, unless
``--allow-cpu``; ``--small`` shrinks every size and time limit (the plumbing test,
``tests/test_studies.py``: its figures are not measurements of anything).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import autoremat

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("a", "b", "c", "d", "e")
#: The fixed grid of stage b (``grid_schedule``), each timed fused and unfused.
GRID = ("plain", "100x100 n/e", "125x80 n/e")
#: Stage d: the smallest schedules that keep everything on the device.
ON_DEVICE = ("100x100 n/n", "binomial s=11")


def _sizes(small: bool) -> dict[str, Any]:
    """Every size and time limit of the stages; ``small``: the CPU plumbing test's."""
    if small:
        return {"big": dict(seq_len=256, batch=4, hidden=16), "big_budget": "2MB",
                "big_limit": 120.0, "seed_len": 256, "seed_budget": "12MB", "seed_limit": 120.0,
                "long_len": 512, "long_budget": "12MB", "long_limit": 120.0, "tune_trials": 2,
                "grid": GRID[1:2],
                "offload": dict(seq_len=256, batch=4, hidden=16), "prior_len": 256,
                "time_budget": 0.05, "tune_time_budget": 0.05, "min_stage": 1.0}
    return {"big": dict(seq_len=10_000, batch=128, hidden=1024), "big_budget": "12GB",
            "big_limit": 80.0, "seed_len": 10_000, "seed_budget": "4GB", "seed_limit": 60.0,
            "long_len": 100_000, "long_budget": "1GB", "long_limit": 80.0,
            "offload": dict(seq_len=10_000, batch=128, hidden=1024), "prior_len": 10_000,
            "time_budget": 1.0, "tune_time_budget": None, "min_stage": 20.0,
            "tune_trials": None, "grid": GRID}


def grid_schedule(label: str, seq_len: int) -> Any:
    """A grid label's schedule at ``seq_len`` (``AxB``: ``A = T / B`` outer chunks)."""

    if label == "plain":
        return autoremat.plain(seq_len)
    if label.startswith("binomial s="):
        return autoremat.binomial(int(label.split("=")[1]))
    shape, pols = label.split()
    inner = int(shape.split("x")[1])
    if seq_len < 10_000:  # --small: the same shape, scaled
        inner = max(2, round(inner * (seq_len / 10_000) ** 0.5))
    names = {"n": "nothing_saveable", "e": "everything_saveable", "d": "dots_saveable"}
    return autoremat.nested([-(-seq_len // inner), inner], [names[p] for p in pols.split("/")])


class Report:
    """``search_tpu.md`` and ``search_tpu.json`` under ``out``, appended as stages finish."""

    def __init__(self, out: Path, header: list[str]) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.md, self.js = out / "search_tpu.md", out / "search_tpu.json"
        self.data: dict[str, Any] = {"header": header, "stages": {}}
        self.md.write_text("# studies/search_tpu.py\n\n" + "\n".join(header) + "\n")
        self._dump()

    def _dump(self) -> None:
        self.js.write_text(json.dumps(self.data, indent=1, default=str) + "\n")

    def stage(self, name: str, result: dict[str, Any], lines: list[str]) -> None:
        self.data["stages"][name] = result
        self._dump()
        with self.md.open("a") as f:
            f.write(f"\n## {name}\n\n" + "\n".join(lines) + "\n")


@contextlib.contextmanager
def counting_compiles() -> Iterator[dict[str, Any]]:
    """Count every ``compile_step`` (the planner's and the tuner's) while inside: calls,
    out-of-memory compiles (``failed_at`` compile, ``out_of_memory``, with the size the
    compiler stated), and their seconds."""
    import autoremat._measure.measure as measure_module

    real = measure_module.compile_step
    seen: dict[str, Any] = {"compiles": 0, "oom": 0, "oom_sizes": [], "oom_keys": [],
                            "errors": 0}

    def counted(*args: Any, **kwargs: Any) -> Any:
        compiled = real(*args, **kwargs)
        m = compiled.measurement
        seen["compiles"] += 1
        if m.failed_at == "compile" and m.out_of_memory:
            seen["oom"] += 1
            seen["oom_sizes"].append(m.compiler_bytes)
            seen["oom_keys"].append(kwargs.get("label", ""))
        elif m.status == "error":
            seen["errors"] += 1
        return compiled

    measure_module.compile_step = counted
    try:
        yield seen
    finally:
        measure_module.compile_step = real


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4g} ms"


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.4g} MB"


def _tune(problem: Any, budget: str, limit: float, storage: str, name: str,
          time_budget: float | None, trials: int | None) -> dict[str, Any]:
    """One ``autoremat.tune`` (as the CLI runs it: ``time_budget`` ``None``) with every
    compile counted; what the stage reports. ``trials``: a count instead of the time
    limit (``--small``: a busy CPU must not decide whether anything was measured)."""
    import autoremat
    from autoremat._units import parse_bytes

    start = time.monotonic()
    from autoremat._measure.timing import DEFAULT_TIME_BUDGET

    with counting_compiles() as seen:
        result = autoremat.tune(problem, parse_bytes(budget), time_limit=limit,
                                n_trials=trials, storage=storage, study_name=name,
                                time_budget=DEFAULT_TIME_BUDGET if time_budget is None
                                else time_budget)
    wall = time.monotonic() - start
    best, trial = result.best, result.best_trial
    m = trial.measurement if trial is not None else None
    return {
        "problem": problem.name, "budget": budget, "time_limit_s": limit, "wall_s": wall,
        "trials": result.n_trials, "measured": result.measured, **seen,
        "pick": best.describe() if best is not None else None,
        "fuse": best.fuse if best is not None else None,
        "fuse_why": best.meta.get("fuse_why") if best is not None else None,
        "step_s": m.step_seconds if m is not None else None,
        "total_bytes": m.total_bytes if m is not None else None,
        "runtime_peak_bytes": m.runtime_peak_bytes if m is not None else None,
        "unconfirmed": result.unconfirmed,
    }


def _tune_lines(r: dict[str, Any]) -> list[str]:
    return [f"- {r['problem']} under {r['budget']} (time limit {r['time_limit_s']:.0f} s): "
            f"{r['trials']} trials ({r['measured']} measured) in {r['wall_s']:.1f} s; "
            f"{r['compiles']} compiles, {r['oom']} out of memory at compile "
            f"({', '.join(_mb(s) for s in r['oom_sizes']) or 'none'}), {r['errors']} other "
            f"failures",
            f"- pick: {r['pick']}, {_ms(r['step_s'])}, total {_mb(r['total_bytes'])}"
            f" (runtime peak {_mb(r['runtime_peak_bytes'])})"
            + (f"; {r['fuse_why']}" if r.get("fuse_why") else "")
            + (f"; unconfirmed: {r['unconfirmed']}" if r.get("unconfirmed") else "")]


def _measure(problem: Any, schedule: Any, budget: int | None, time_budget: float) -> dict[str, Any]:
    import autoremat

    m = autoremat.measure(problem, schedule, budget_bytes=budget, time_budget=time_budget)
    return {"schedule": schedule.describe(), "status": m.status, "reason": m.reason[:300],
            "step_s": m.step_seconds, "total_bytes": m.total_bytes,
            "runtime_peak_bytes": m.runtime_peak_bytes, "compiler_bytes": m.compiler_bytes,
            "fits": budget is not None and m.fits(budget)}


def _row_line(r: dict[str, Any]) -> str:
    tail = "" if r["status"] == "ok" else f" [{r['status']}: {r['reason'][:160]}]"
    return (f"- {r['schedule']}: {_ms(r['step_s'])}, total {_mb(r['total_bytes'])}, runtime "
            f"peak {_mb(r['runtime_peak_bytes'])}{tail}")


def _seed_unmodified(seq_len: int) -> Any:
    """``examples/seed_unmodified.py``'s ``problem()`` at ``seq_len`` (its env knob)."""
    from bench_remat_scans import load_seed  # studies/, beside this script

    return load_seed(seq_len).problem()


# -- the stages ------------------------------------------------------------------------
def stage_a(s: dict[str, Any], storage: str) -> tuple[dict[str, Any], list[str], str]:
    from autoremat import seed_lstm

    r = _tune(seed_lstm(**s["big"]), s["big_budget"], s["big_limit"], storage, "big",
              s["tune_time_budget"], s["tune_trials"])
    ok = r["oom"] <= 2 and (r["wall_s"] <= 81 or (r["step_s"] or 1) < 0.593)
    r["target"] = ok
    lines = [*_tune_lines(r), "- target (<= 2 OOM compiles; pick in <= 81 s or < 593 ms): "
             + ("met" if ok else "NOT met")]
    return r, lines, f"{r['oom']} OOM compiles, {r['trials']} trials, {r['wall_s']:.0f} s, " \
                     f"pick {r['pick']} {_ms(r['step_s'])}"


def _fuse_label(fuse: bool | None) -> str:
    return "fusion not a choice" if fuse is None else "fused" if fuse else "unfused"


def stage_b(s: dict[str, Any], storage: str) -> tuple[dict[str, Any], list[str], str]:
    """Each problem: tuned, then the grid timed fused and unfused on it, then the pick
    against the faster of the best fused and the best unfused that fit."""
    from autoremat import seed_lstm
    from autoremat._units import parse_bytes

    n, budget = s["seed_len"], s["seed_budget"]
    out: dict[str, Any] = {}
    lines: list[str] = []
    summary = []
    problems = {"from_loss": lambda: _seed_unmodified(n),
                "built_in": lambda: seed_lstm(seq_len=n, fused_readout=None)}
    for label, make in problems.items():
        lines.append(f"### {label}")
        try:
            problem = make()
            r = _tune(problem, budget, s["seed_limit"], storage, f"seed_{label}",
                      s["tune_time_budget"], s["tune_trials"])
            lines += _tune_lines(r)
        except Exception as e:  # written down; the rest of the stage runs
            out[label] = {"error": f"{type(e).__name__}: {e}"}
            lines.append(f"- failed: {type(e).__name__}: {e}")
            continue
        rows = []
        for name in s["grid"]:
            for fuse in (True, False):
                try:
                    row = _measure(problem, grid_schedule(name, n).with_fuse(fuse),
                                   parse_bytes(budget), s["time_budget"])
                except Exception as e:
                    row = {"schedule": f"{name} {_fuse_label(fuse)}", "status": "error",
                           "reason": f"{type(e).__name__}: {e}", "step_s": None,
                           "total_bytes": None, "runtime_peak_bytes": None, "fits": False}
                rows.append({"label": name, "fused": fuse, **row})
        best = {f: min((x for x in rows if x["fused"] is f and x["fits"]),
                       key=lambda x: x["step_s"], default=None) for f in (True, False)}
        times = [b["step_s"] for b in best.values() if b is not None]
        fastest = min(times) if times else None
        step = r.get("step_s")
        ratio = None if step is None or fastest is None else step / fastest
        met = ratio is not None and ratio <= 1.05
        r.update(grid=rows, fastest_grid_s=fastest, ratio_to_fastest=ratio, target=met)
        out[label] = r
        lines += ["- the grid, timed directly:"] + ["  " + _row_line(x) for x in rows]
        for f, b in best.items():
            lines.append(f"- best {_fuse_label(f)} that fits: "
                         + ("none" if b is None else f"{b['schedule']} {_ms(b['step_s'])}"))
        shown = "-" if ratio is None else f"{ratio:.3f}"
        lines.append(f"- pick {r.get('pick')} ({_fuse_label(r.get('fuse'))}), {_ms(step)} = "
                     f"{shown}x the faster of the grid's best fused and best unfused: target "
                     f"1.05x {'met' if met else 'NOT met'}")
        summary.append(f"{label} {r.get('pick')} {_ms(step)} ({shown}x)")
    return out, lines, "; ".join(summary)


def stage_c(s: dict[str, Any], storage: str) -> tuple[dict[str, Any], list[str], str]:
    from autoremat import seed_lstm

    r = _tune(seed_lstm(seq_len=s["long_len"], fused_readout=None), s["long_budget"],
              s["long_limit"], storage, "seed_100k", s["tune_time_budget"], s["tune_trials"])
    return r, _tune_lines(r), f"pick {r['pick']} {_ms(r['step_s'])}"


def stage_d(s: dict[str, Any], storage: str) -> tuple[dict[str, Any], list[str], str]:
    import jax

    from autoremat import seed_lstm
    from autoremat._schedules.nested_space import OFFLOAD_POLICIES
    from autoremat._search.probes.probe import checks, probe

    platform = jax.default_backend()
    problem = seed_lstm(**s["offload"], fused_readout=True)
    verdicts = probe(problem, "tpu")  # the TPU's choices, on whatever device this is
    outcome = {label: v.text() for label, v in verdicts.items()}  # as stored
    lines = [f"- probe ({platform}): {label}: {why}" for label, why in outcome.items()]
    offered = [k for k, v in verdicts.items() if v.offered]
    n = problem.seq_len
    rows = [_measure(problem, grid_schedule(label, n), None, s["time_budget"])
            for label in ON_DEVICE]
    on_device = [r["total_bytes"] for r in rows if r["status"] == "ok" and r["total_bytes"]]
    budget = int(0.9 * min(on_device)) if on_device else None
    shapes = {k: c.schedule for k, c in checks(64, "tpu").items() if k in OFFLOAD_POLICIES}
    offloaded = []
    for label, probe_schedule in shapes.items():

        levels = getattr(probe_schedule, "levels", ())
        policies = [lv.policy for lv in levels]
        if len(levels) == 1:
            schedule = autoremat.nested([n], policies)
        else:
            inner = grid_schedule("100x100 n/n", n).lengths[1]
            schedule = autoremat.nested([-(-n // inner), inner], policies)
        r = _measure(problem, schedule, budget, s["time_budget"])
        r["placement"], r["offered"] = label, label in offered
        offloaded.append(r)
    wins = [r for r in offloaded if r["offered"] and r["fits"]]
    lines += ["### on the device"] + [_row_line(r) for r in rows]
    lines += [f"### offloaded (budget {_mb(budget)}: 9/10 of the smallest on-device total)"]
    lines += [_row_line(r) + f" ({r['placement']}, {'offered' if r['offered'] else 'left out'})"
              for r in offloaded]
    answer = (f"offload wins under {_mb(budget)}: " + ", ".join(
        f"{r['schedule']} {_ms(r['step_s'])}" for r in wins)) if wins else \
        f"no offload schedule fits under {_mb(budget)} (or none was offered)"
    lines.append(f"- answer: {answer}")
    result = {"platform": platform, "probe": outcome, "offered": offered,
              "on_device": rows, "budget": budget, "offloaded": offloaded, "answer": answer}
    return result, lines, f"offered {offered or 'none'}; {answer}"


def stage_e(s: dict[str, Any], storage: str) -> tuple[dict[str, Any], list[str], str]:
    from autoremat import seed_lstm
    from autoremat._search.planning.predict import Structure

    n = s["prior_len"]
    problem = seed_lstm(seq_len=n)
    schedules = {"plain": autoremat.plain(n),
                 "plain_unroll8": autoremat.nested([n], "none", unroll=8),
                 "binomial11": autoremat.binomial(11)}
    rows = {k: _measure(problem, v, None, max(s["time_budget"], 0.5) if n >= 10_000
                        else s["time_budget"]) for k, v in schedules.items()}
    t1, t8, tb = (rows[k]["step_s"] for k in schedules)
    result: dict[str, Any] = {"rows": rows}
    lines = [_row_line(r) for r in rows.values()]
    if None not in (t1, t8, tb):
        # 10^4 e + 10^4 l = t1; 10^4 e + 1250 l = t8  (units of Structure, as the GPU's)
        trips1, trips8 = n, n / 8
        loop_s = (t1 - t8) / (trips1 - trips8)
        eval_s = (t1 - trips1 * loop_s) / n
        b = Structure.of(schedules["binomial11"], n)
        book = (tb / eval_s - (b.evaluations + b.partial) - b.loop * loop_s / eval_s) \
            / max(1.0, b.bookkeeping)
        result.update(loop=loop_s / eval_s, bookkeeping=max(0.0, book), eval_s=eval_s,
                      loop_s=loop_s, bookkeeping_raw=book)
        lines.append(f"- e = {eval_s * 1e6:.3g} us, l = {loop_s * 1e6:.3g} us: "
                     f"TPU_PRIOR = Prior(loop={loop_s / eval_s:.2f}, "
                     f"bookkeeping={max(0.0, book):.2f})  (raw bookkeeping {book:.2f}); "
                     f"binomial s=11 / plain = {tb / t1:.2f}x")
    return result, lines, (f"loop={result.get('loop', float('nan')):.2f} "
                           f"bookkeeping={result.get('bookkeeping', float('nan')):.2f}")


STAGE_FUNCS: dict[str, tuple[str, Callable[..., tuple[dict[str, Any], list[str], str]]]] = {
    "a": ("a. hidden 1024, batch 128, T=10^4, 12 GB", stage_a),
    "b": ("b. seed T=10^4, 4 GB: loss-made and built-in, and the grid", stage_b),
    "c": ("c. seed T=10^5, 1 GB", stage_c),
    "d": ("d. offload placements, hidden 1024, batch 128, fused", stage_d),
    "e": ("e. priors: plain unroll 1 / 8, binomial s=11", stage_e),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="results folder")
    p.add_argument("--deadline", type=float, default=420.0,
                   help="seconds from the start; a stage starts only before it")
    p.add_argument("--stages", default=",".join(STAGES), help="e.g. a,b,c,d,e")
    p.add_argument("--allow-cpu", action="store_true", help="run without a TPU")
    p.add_argument("--small", action="store_true", help="tiny sizes (the plumbing test)")
    args = p.parse_args(argv)
    start = time.monotonic()
    import jax

    platform = jax.default_backend()
    if platform != "tpu" and not args.allow_cpu:
        print(f"no TPU here (jax backend {platform!r}); nothing written (--allow-cpu runs it)")
        return 0
    stages = [x.strip() for x in args.stages.split(",") if x.strip()]
    unknown = [x for x in stages if x not in STAGE_FUNCS]
    if unknown:
        p.error(f"--stages: unknown {unknown}; known: {','.join(STAGES)}")
    sizes = _sizes(args.small)
    device = jax.devices()[0]
    header = [f"- {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}; "
              f"{getattr(device, 'device_kind', platform)} ({platform}), jax {jax.__version__}",
              f"- stages {','.join(stages)}; deadline {args.deadline:.0f} s"
              + ("; --small: sizes are not the issue's, figures are plumbing only"
                 if args.small else "")]
    report = Report(args.out, header)
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{tmp}/search_tpu.db"
        for key in stages:
            title, func = STAGE_FUNCS[key]
            left = args.deadline - (time.monotonic() - start)
            if left < sizes["min_stage"]:
                report.stage(key, {"skipped": f"{left:.0f} s left"},
                             [f"- skipped: {left:.0f} s left before the deadline"])
                print(f"{title}: skipped ({left:.0f} s left)", flush=True)
                continue
            t0 = time.monotonic()
            try:
                result, lines, line = func(sizes, storage)
            except Exception as e:
                result = {"error": f"{type(e).__name__}: {e}",
                          "traceback": traceback.format_exc()[-3000:]}
                lines, line = [f"- failed: {type(e).__name__}: {e}"], f"FAILED: {e}"
            result["stage_s"] = time.monotonic() - t0
            report.stage(key, result, [f"*{title}* ({result['stage_s']:.0f} s)", *lines])
            print(f"{title}: {line} ({result['stage_s']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
