"""MaxText's remat presets against autoremat's pick, on the layer stack (issue 37 item 4).

The built-in layer stack (``autoremat --problem layer_stack``: a decoder-only
transformer shaped like MaxText's default block -- gated MLP, MaxText's tag names --
bfloat16 activations, its layers one scan; default 24 layers, d_model 1024, 16 heads,
MLP 4096, 2048 tokens, batch 8) under each preset of ``PRESETS`` -- MaxText's
``remat_policy`` presets as its source defines them (``maxtext_names``, over the
stack's tags), JAX's dots policies, the offloaded ones, no remat, and Flax's own
``nn.scan(nn.remat(block))`` -- and under ``autoremat.tune``'s pick at three budgets.
Every figure comes from the same ``autoremat.measure_step`` (compiled memory, the
device's measured runtime peak, the median step time), in one process.

Stages, each written to ``--out`` (``layer_presets.json`` and ``.md``) as it ends, and
skipped when ``--out`` already holds its result, so a run stopped by its deadline is
resumed by the same command (the tunes' studies are in ``--out/studies.db`` too):

1. ``presets``: every preset measured once, no budget (one that does not compile or
   run is recorded as such);
2. ``budgets``: three budgets, unless ``--budgets`` gives them: the device's memory
   (or, without a limit, 1.1x the largest preset that ran), halfway between ``full``
   and ``minimal`` (where ``minimal`` ran; else the geometric mean of the smallest and
   largest preset that ran), and the smallest less half its temp (no preset fits;
   what no schedule removes -- arguments, outputs -- still does);
3. ``tune 1..3``: ``autoremat.tune`` at each budget (``--tune-limit``, and never past
   the deadline), then its pick measured again beside the presets;
4. ``check``: at a float32 size small enough for any device, every preset's and every
   pick's loss and gradients against the unscheduled model (flax's ``nn.scan``) under
   ``jax.default_matmul_precision("highest")``: the largest relative difference.

A stage starts only when the time left (``--deadline`` seconds from the start) can
hold it; a compile or run in flight is not interrupted, so leave a margin. Without an
accelerator it says so and exits 0; ``--small --allow-cpu`` runs every stage at a
tiny size on a CPU (``tests/test_layer_presets.py``). On the TPU machine (one process
holds the chip; ``.device`` carried, made by ``studies/device_wheels.sh``; a run that
came back in ``.device/layer_presets`` carries on where it stopped)::

    source studies/device_setup.sh && mkdir -p /tmp/lp && cp -rn .device/layer_presets/. /tmp/lp/
    python3 studies/layer_presets.py --out /tmp/lp --deadline 480 --tune-limit 200
    cp -r /tmp/lp "$OUT"/layer_presets
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import autoremat
from autoremat._models.layer_stack import CHECKPOINT_NAMES
from autoremat._schedules import maxtext_names

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MB = 10**6
#: The stack's block (``layer_stack``'s shape): results of another shape are not resumed.
BLOCK = "gated MLP, MaxText's tags"
OFFLOAD = {"offload_src": "device", "offload_dst": "pinned_host"}


def maxtext_presets() -> dict[str, tuple[str, Any]]:
    """MaxText's own presets (``autoremat._schedules.maxtext_names``: read from its source)
    over the stack's tags, each distinct action once (``presets_over``)."""
    tags = set(CHECKPOINT_NAMES)
    out: dict[str, tuple[str, Any]] = {}
    found = maxtext_names.presets_over(tags, maxtext_names.SEARCHED
                                       + maxtext_names.SEARCHED_OFFLOADED)
    for label, (saved, moved) in found.items():
        what = f"remat_policy={label} (MaxText {maxtext_names.VERSION})"
        out[label] = (what, {"save_only_these_names": list(saved)} if not moved else
                      {"save_and_offload_only_these_names": {
                          "names_which_can_be_saved": list(saved),
                          "names_which_can_be_offloaded": list(moved), **OFFLOAD}})
    return out


#: name -> (what it is, the policy of every layer as schedule data; None:
#: flax's nn.scan(nn.remat(block)), not autoremat).
PRESETS: dict[str, tuple[str, Any]] = {
    "none": ("no remat: every layer's residuals stored", "none"),
    "full": ("remat_policy=full (the default): nothing saved", "nothing_saveable"),
    "dots_no_batch": ("JAX's dots_with_no_batch_dims_saveable: the weight matmuls' outputs",
                      "dots_with_no_batch_dims_saveable"),
    "checkpoint_dots": ("JAX's checkpoint_dots: every matmul's output, attention's too",
                        "checkpoint_dots"),
    **maxtext_presets(),
    "offload_dots_no_batch": ("the weight matmuls' outputs offloaded, by kind",
                              {"offload_dot_with_no_batch_dims": OFFLOAD}),
    "save_all_names": ("every checkpoint name saved (save_only_these_names)",
                       {"save_only_these_names": list(CHECKPOINT_NAMES)}),
    "flax_remat": ("flax nn.scan(nn.remat(block)), nothing_saveable", None),
}
FULL = {"layers": 24, "d_model": 1024, "heads": 16, "mlp": 4096, "seq_len": 2048, "batch": 8}
#: The MLP-heavy size (issue 45): 512 tokens, MLP 4 x d_model, so the weight matmuls and
#: the MLP's activations outweigh attention's scores.
MLP_HEAVY = {"layers": 12, "d_model": 1536, "heads": 12, "mlp": 6144, "seq_len": 512,
             "batch": 16}
SIZES = {"builtin": FULL, "mlp": MLP_HEAVY}
SMALL = {"layers": 4, "d_model": 32, "heads": 4, "mlp": 64, "seq_len": 16, "batch": 2}
#: The check stage's float32 size (the default stack's shape, shrunk).
CHECK = {"layers": 6, "d_model": 128, "heads": 4, "mlp": 256, "seq_len": 128, "batch": 2}


def schedule_of(policy: Any, layers: int) -> Any:

    return autoremat.nested([layers], [policy])


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


class Results:
    """``--out/layer_presets.json`` (what each stage found) and its table, ``.md``."""

    def __init__(self, out: Path, sizes: dict[str, int]) -> None:
        self.out, self.path = out, out / "layer_presets.json"
        out.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"sizes": sizes, "block": BLOCK, "presets": {},
                                     "budgets": None, "tunes": {}, "check": None}
        if self.path.exists():
            old = json.loads(self.path.read_text())
            if old.get("sizes") == sizes and old.get("block") == BLOCK:
                self.data = old  # a run of the same stack: resumed

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1))
        (self.out / "layer_presets.md").write_text("\n".join(report(self.data)) + "\n")


def row(m: Any, seconds: float) -> dict[str, Any]:
    """The figures of one ``Measurement``."""
    return {"status": m.status, "reason": m.reason[:300], "total_bytes": m.total_bytes,
            "temp_bytes": m.temp_bytes, "runtime_peak_bytes": m.runtime_peak_bytes,
            "fit_bytes": m.fit_bytes, "step_seconds": m.step_seconds,
            "compile_seconds": m.compile_seconds, "loss": m.loss, "wall_seconds": seconds}


def measure_preset(model: Any, name: str, time_budget: float) -> dict[str, Any]:
    import jax

    import autoremat

    _, policy = PRESETS[name]
    start = time.monotonic()
    if policy is None:
        step = model.train_step(None, flax_policy=jax.checkpoint_policies.nothing_saveable)
        describe = "flax nn.scan(nn.remat(block))"
    else:
        schedule = schedule_of(policy, model.sizes.layers)
        step, describe = model.train_step(schedule), schedule.describe()
    m = autoremat.measure_step(step, model.args, time_budget=time_budget,
                               arg_names=model.ARG_NAMES, label=name)
    return {"describe": describe, **row(m, time.monotonic() - start)}


def fits(r: dict[str, Any], budget: int) -> bool:
    """Whether ``r`` ran and its ``fit_bytes`` (autoremat's rule: the measured runtime
    peak where there is one, else the estimate) is within ``budget``."""
    return (r.get("status") == "ok" and r.get("step_seconds") is not None
            and r.get("fit_bytes") is not None and r["fit_bytes"] <= budget)


def fastest(presets: dict[str, dict[str, Any]], budget: int) -> str | None:
    """The fastest preset that fits ``budget`` (``None``: none does)."""
    fitting = [n for n, r in presets.items() if fits(r, budget)]
    return min(fitting, key=lambda n: presets[n]["step_seconds"], default=None)


def auto_budgets(presets: dict[str, dict[str, Any]], device_bytes: int | None) -> list[int]:
    """The module docstring's three budgets, largest first."""
    ran = sorted((r["fit_bytes"], r.get("temp_bytes") or 0) for r in presets.values()
                 if r.get("status") == "ok" and r.get("fit_bytes"))
    if not ran:
        raise SystemExit("layer_presets: no preset ran, so there is nothing to set budgets by; "
                         "give --budgets")
    (low, low_temp), (high, _) = ran[0], ran[-1]
    top = device_bytes or int(1.1 * high)
    full, minimal = (presets.get(n, {}).get("fit_bytes") for n in ("full", "minimal"))
    mid = (full + minimal) // 2 if full and minimal and minimal > full else int(
        math.sqrt(low * high))
    return [top, mid, low - low_temp // 2]


def tune_at(model: Any, budget: int, limit: float, storage: str, trials: int | None,
            time_budget: float) -> dict[str, Any]:
    import autoremat

    problem = model.problem()
    start = time.monotonic()
    result = autoremat.tune(problem, budget, time_limit=max(1.0, limit), storage=storage,
                            study_name=f"{problem.name} under {budget}B", n_trials=trials,
                            time_budget=time_budget)
    seconds = time.monotonic() - start
    measured = study_trials(result.study_name, storage)
    out: dict[str, Any] = {
        "budget_bytes": budget, "tune_seconds": seconds, "limit_seconds": limit,
        "trials": len(measured), "pick": None,
        "over_budget": sum((t.measurement.fit_bytes or 0) > budget for t in measured),
        "measured": [t.schedule.describe() for t in measured]}
    if result.best is not None and result.best_trial is not None:
        again = autoremat.measure(problem, result.best, time_budget=time_budget)
        out["pick"] = {"describe": result.best.describe(), "schedule": result.best.to_data(),
                       "in_tune": row(result.best_trial.measurement, 0.0),
                       **row(again, time.monotonic() - start - seconds)}
    return out


def study_trials(name: str, storage: str) -> list[Any]:
    """The study's measured trials (``MeasuredTrial``), in order."""
    import optuna

    from autoremat._search.study import measured_trials

    return measured_trials(optuna.load_study(study_name=name, storage=storage))


def check_values(sizes: dict[str, int], schedules: dict[str, Any]) -> dict[str, Any]:
    """The largest relative difference of loss and gradients from the unscheduled model's,
    per preset and pick, at float32 and the highest matmul precision."""
    import jax
    import jax.numpy as jnp

    from autoremat._models.layer_stack import LayerStack, layer_stack_model
    from autoremat._schedules import from_data

    model = layer_stack_model(LayerStack(**sizes, dtype="float32"))
    params, _, tokens = model.args
    out: dict[str, Any] = {"sizes": sizes}
    with jax.default_matmul_precision("highest"):
        want = jax.jit(jax.value_and_grad(model.loss_fn(None)))(params, tokens)
        for name, data in schedules.items():
            try:
                if data is None:
                    loss = model.loss_fn(None, flax_policy=jax.checkpoint_policies.nothing_saveable)
                else:
                    schedule = from_data(data) if isinstance(data, dict) and "kind" in data \
                        else schedule_of(data, sizes["layers"])
                    loss = model.loss_fn(schedule)
                got = jax.jit(jax.value_and_grad(loss))(params, tokens)
                worst = max(float(jnp.max(jnp.abs(g - w)) / (jnp.max(jnp.abs(w)) + 1e-30))
                            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want),
                                            strict=True))
                out[name] = {"max_rel_diff": worst}
            except Exception as e:  # recorded: an offload policy may not compile here
                out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    return out


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{1000 * s:.1f}"


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / MB:,.1f} MB"


def report(data: dict[str, Any]) -> list[str]:
    """The tables of ``layer_presets.md``."""
    env = data.get("environment", {})
    lines = ["# Remat presets against autoremat's pick: the layer stack", "",
             f"Sizes: {data['sizes']}; {env.get('device', '?')}, jax {env.get('jax', '?')}.",
             "Memory: compiled total (arguments + outputs + temp) and the device's measured",
             "runtime peak where it reports one; *fits* uses the figure autoremat's fit is",
             "decided by (`fit_bytes`, recorded with the run).", "",
             "## Presets (one policy for every layer)", "",
             "| preset | MaxText | schedule | total | runtime peak | step ms | status |",
             "|---|---|---|---|---|---|---|"]
    for name, r in data["presets"].items():
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r['reason'][:80]}"
        lines.append(f"| {name} | {PRESETS[name][0]} | {r['describe']} | {_mb(r['total_bytes'])} "
                     f"| {_mb(r['runtime_peak_bytes'])} | {_ms(r['step_seconds'])} | {status} |")
    if data.get("tunes"):
        lines += ["", "## At three budgets", "",
                  "| budget | presets that fit | fastest preset that fits | its step ms | "
                  "autoremat's pick | pick's fit | pick's step ms | pick / fastest preset "
                  "| tune s | trials (over budget) |", "|---|---|---|---|---|---|---|---|---|---|"]
        presets = data["presets"]
        for key, t in data["tunes"].items():
            budget = int(key)
            fitting = [n for n, r in presets.items() if fits(r, budget)]
            best = fastest(presets, budget)
            best_s = None if best is None else presets[best]["step_seconds"]
            pick = t.get("pick") or {}
            pick_s = pick.get("step_seconds")
            ok = pick and fits(pick, budget)
            ratio = ("-" if not ok else "fits where none does" if best_s is None
                     else f"{pick_s / best_s:.2f}")
            cut = (f" (cut to {t['limit_seconds']:.0f} s by --deadline)"
                   if t.get("cut_by_deadline") else "")
            lines.append(f"| {_mb(budget)} | {', '.join(fitting) or '(no preset)'} | {best or '-'} | "
                         f"{_ms(best_s)} | {pick.get('describe', 'nothing fits')} | "
                         f"{_mb(pick.get('fit_bytes'))} | {_ms(pick_s)} | {ratio} | "
                         f"{t['tune_seconds']:.0f}{cut} | {t['trials']} "
                         f"({t.get('over_budget', '?')}) |")
    if data.get("check"):
        lines += ["", f"## Values (float32, highest precision, sizes {data['check']['sizes']})",
                  "", "| schedule | max relative difference from the unscheduled model |",
                  "|---|---|"]
        for name, r in data["check"].items():
            if name != "sizes":
                lines.append(f"| {name} | {r.get('max_rel_diff', r.get('error'))} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="results folder (resumed)")
    p.add_argument("--deadline", type=float, default=540.0, help="seconds from the start")
    p.add_argument("--budgets", help="budgets, e.g. 12GB,6GB,3GB (default: three, auto)")
    p.add_argument("--presets", help=f"a comma-separated subset of: {', '.join(PRESETS)}")
    p.add_argument("--tune-limit", type=float, default=240.0, help="seconds per tune")
    p.add_argument("--trials", type=int, help="measure up to N schedules per tune")
    p.add_argument("--time-budget", type=float, default=2.0,
                   help="seconds of timed runs per schedule")
    p.add_argument("--size", choices=list(SIZES), default="builtin",
                   help="builtin: the built-in stack's default sizes; mlp: the MLP-heavy size")
    p.add_argument("--small", action="store_true", help="a tiny stack (tests)")
    p.add_argument("--allow-cpu", action="store_true", help="run without an accelerator")
    args = p.parse_args(argv)
    deadline = Deadline(args.deadline)
    import jax

    if jax.default_backend() == "cpu" and not args.allow_cpu:
        print("layer_presets: no accelerator here (--allow-cpu runs it anyway); nothing written")
        return 0
    from autoremat._measure.allocator import limit_bytes
    from autoremat._models.layer_stack import LayerStack, layer_stack_model
    from autoremat._units import parse_bytes

    sizes = SMALL if args.small else SIZES[args.size]
    results = Results(args.out, sizes)
    data = results.data
    data["environment"] = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
    model = layer_stack_model(LayerStack(**sizes))

    def log(text: str) -> None:
        print(f"[{args.deadline - deadline.left():6.0f} s] {text}", flush=True)

    chosen = args.presets.split(",") if args.presets else list(PRESETS)
    unknown = [n for n in chosen if n not in PRESETS]
    if unknown:
        p.error(f"--presets: unknown {unknown[0]!r}; valid: {', '.join(PRESETS)}")
    for name in chosen:
        if name in data["presets"]:
            continue
        if deadline.left() < 60 and not args.small:
            log("deadline: presets left for the next run")
            results.save()
            return 0
        data["presets"][name] = r = measure_preset(model, name, args.time_budget)
        log(f"preset {name}: {r['status']} {_mb(r['fit_bytes'])} {_ms(r['step_seconds'])} ms")
        results.save()
    if data["budgets"] is None:
        data["budgets"] = ([parse_bytes(b) for b in args.budgets.split(",")] if args.budgets
                           else auto_budgets(data["presets"], limit_bytes()))
        results.save()
    storage = f"sqlite:///{(args.out / 'studies.db').resolve()}"
    for budget in data["budgets"]:
        if str(budget) in data["tunes"]:
            continue
        limit = min(args.tune_limit, deadline.left() - 90)
        if limit < 30 and not args.small:
            log(f"deadline: the tune at {_mb(budget)} is left for the next run")
            results.save()
            return 0
        data["tunes"][str(budget)] = t = tune_at(model, budget, limit, storage, args.trials,
                                                 args.time_budget)
        t["cut_by_deadline"] = limit < args.tune_limit  # less than --tune-limit was left
        log(f"tune at {_mb(budget)}: {(t['pick'] or {}).get('describe')} in "
            f"{t['tune_seconds']:.0f} s")
        results.save()
    if data["check"] is None and (deadline.left() > 60 or args.small):
        schedules = {name: PRESETS[name][1] for name in data["presets"]}
        schedules.update({f"pick at {_mb(int(b))}": t["pick"]["schedule"]
                          for b, t in data["tunes"].items() if t.get("pick")})
        data["check"] = check_values(SMALL if args.small else CHECK, schedules)
        results.save()
    log(f"wrote {results.path} and layer_presets.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
