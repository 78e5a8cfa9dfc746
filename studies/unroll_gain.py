"""Does unrolling the layer scan pay on the MLP-heavy stack? One process, one table.

The question behind the search's unroll target: on the layer stack ``tune_time.py``'s case
``d`` tunes (``layer_presets.MLP_HEAVY``: 12 layers, d_model 1536, MLP 6144, 512 tokens,
batch 16, bfloat16), is some unroll of the layer scan >= 5% faster than unroll 1 under the
policies the search picks? Each (policy, unroll) is compiled the way the search compiles
(``compile_pool.compile_quietly``: several on threads at once) and timed in turn with the
same ``time_compiled`` the search uses; the table gives each one's compile seconds, memory
and step time, and its step time over the same policy's at unroll 1.

Unrolling a scan of ``L`` layers by ``u`` puts ``u`` copies of the layer in the loop body:
XLA can overlap one layer's weight reads with the previous one's compute and drops the
per-iteration dynamic slices, at ``u`` times the compile (and the program's size).

On the TPU machine (``source studies/device_setup.sh``)::

    python3 studies/unroll_gain.py --out "$OUT"/unroll_gain.md

``--small --allow-cpu`` runs a tiny stack on a CPU (``tests/test_studies.py``: the
plumbing, not a measurement).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from studies.layer_presets import MLP_HEAVY, SMALL  # noqa: E402

#: label -> the policy of every layer (schedule data), as the search names them.
POLICIES: dict[str, Any] = {
    "save all 7 projections": {"save_only_these_names": [
        "query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo"]},
    "dots_with_no_batch_dims": "dots_with_no_batch_dims_saveable",
    "dots": "dots_saveable",
    "nothing": "nothing_saveable",
}
#: (policy, unrolls): the pick at every unroll that divides 12 up to 6, the rest at 1 and 4.
PLAN: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("save all 7 projections", (1, 2, 3, 4, 6)),
    ("dots_with_no_batch_dims", (1, 4)),
    ("dots", (1, 4)),
    ("nothing", (1, 4)),
)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the Markdown table to write")
    p.add_argument("--workers", type=int, default=6, help="compiles at once")
    p.add_argument("--time-budget", type=float, default=2.0,
                   help="seconds of timed runs per schedule")
    p.add_argument("--small", action="store_true", help="a tiny stack (tests)")
    p.add_argument("--allow-cpu", action="store_true", help="run without an accelerator")
    args = p.parse_args(argv)
    import jax

    platform = jax.default_backend()
    if platform == "cpu" and not args.allow_cpu:
        print("unroll_gain: no accelerator here (--allow-cpu runs it anyway); nothing written")
        return 0
    import autoremat
    from autoremat._measure.timing import time_compiled
    from autoremat._models.layer_stack import LayerStack, layer_stack_model
    from autoremat._search.planning.compile_pool import compile_quietly

    sizes = SMALL if args.small else MLP_HEAVY
    problem = layer_stack_model(LayerStack(**sizes)).problem()
    layers = sizes["layers"]
    plan = [(label, u) for label, unrolls in PLAN for u in unrolls if layers % u == 0]
    start = time.monotonic()

    def compiled(item: tuple[str, int]) -> Any:
        label, unroll = item
        schedule = autoremat.nested([layers], [POLICIES[label]], unroll=unroll)
        return compile_quietly(problem, schedule, None, platform)

    rows: dict[tuple[str, int], dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        for item, c in zip(plan, pool.map(compiled, plan), strict=True):
            m = time_compiled(c, time_budget=args.time_budget)
            c.release()
            rows[item] = {"compile_s": c.measurement.compile_seconds, "status": m.status,
                          "total": m.total_bytes, "step": m.step_seconds}
            print(f"[{time.monotonic() - start:5.0f} s] {item[0]} unroll={item[1]}: "
                  f"{m.status} {m.step_seconds}", flush=True)
    lines = [
        "# Unrolling the layer scan on the MLP-heavy stack",
        "",
        f"Sizes {sizes}; {jax.devices()[0].device_kind}, jax {jax.__version__}; "
        f"{args.workers} compiles at once; {time.monotonic() - start:.0f} s in all.",
        "",
        "| policy | unroll | compile s | total MB | step ms | / unroll 1 |",
        "|---|---|---|---|---|---|",
    ]
    for (label, unroll), r in rows.items():
        if r["status"] != "ok" or r["step"] is None:
            lines.append(f"| {label} | {unroll} | - | - | {r['status']} | - |")
            continue
        base = rows.get((label, 1), {}).get("step")
        ratio = f"{r['step'] / base:.3f}" if base else "-"
        lines.append(f"| {label} | {unroll} | {r['compile_s'] or 0:.1f} | "
                     f"{(r['total'] or 0) / 1e6:,.0f} | {r['step'] * 1e3:.1f} | {ratio} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
