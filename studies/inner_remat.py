"""What a remat already inside the scheduled block does to a schedule's memory and time.

A user's layer stack often wraps its block in ``nnx.remat`` / ``nn.remat`` /
``jax.checkpoint(policy=...)`` before scanning it (MaxText's ``remat_policy``, Flax's
guides). autoremat then wraps the scanned step in the schedule's own checkpoints. This
compiles the NNX stack of ``examples/nnx_stack.py`` (its layer scan under
``autoremat.nnx.remat_scans``, ``min_length`` = the layer count) with the block inside
the scanned step wrapped four ways -- not at all, ``nnx.remat`` (nothing saved, Flax's
default), ``nnx.remat(policy=save_only_these_names(ffn_up))`` and
``nnx.remat(policy=dots_saveable)`` -- under schedules that keep nothing, keep the
names ``attn_qkv`` and ``ffn_up``, keep the dots, or do no remat at all, and records
what the layer scan stores for the backward pass (its stacked residuals, from
``jax.ad_checkpoint.print_saved_residuals``), each step's compiled temp memory
(``compiled.memory_analysis()`` via ``autoremat.measure_step``), its step time (median
of ``--rounds`` runs, the four wrappings of one schedule timed in turn) and whether its
loss equals the unwrapped block's.

    python studies/inner_remat.py            # ~2 min on 2 CPUs

Writes ``studies/results/inner_remat.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import optax
from flax import nnx

import autoremat
import autoremat.nnx
from autoremat._atomic import atomic_write_text
from autoremat._measure.device import environment
from autoremat._units import format_bytes

ROOT = Path(__file__).resolve().parents[1]
SAVED = ["attn_qkv", "ffn_up"]
RESIDUAL = re.compile(r"^(\w+)\[([\d,]*)\]")
ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2, "i32": 4, "u32": 4, "bool": 1}
SCHEDULES: dict[str, Callable[[int], autoremat.Schedule]] = {
    "no remat (plain)": autoremat.plain,
    "nothing saved": lambda n: autoremat.nested([n], "nothing_saveable"),
    f"saves {', '.join(SAVED)}": lambda n: autoremat.nested(
        [n], [{"save_only_these_names": SAVED}]),
    "saves dots": lambda n: autoremat.nested([n], "dots_saveable"),
}
INNER: dict[str, Any] = {
    "none": None,
    "nnx.remat": {},
    "nnx.remat(save ffn_up)": {"policy": jax.checkpoint_policies.save_only_these_names("ffn_up")},
    "nnx.remat(dots)": {"policy": jax.checkpoint_policies.dots_saveable},
}


def load_example(sizes: dict[str, int]) -> Any:
    """``examples/nnx_stack.py`` at ``sizes`` (its ``NNX_STACK_*`` settings)."""
    for key, value in sizes.items():
        os.environ[f"NNX_STACK_{key.upper()}"] = str(value)
    spec = importlib.util.spec_from_file_location("nnx_stack", ROOT / "examples" / "nnx_stack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def with_inner(example: Any, inner: dict[str, Any] | None) -> Any:
    """The example's stack, its block inside the scanned step wrapped in ``nnx.remat(**inner)``."""
    model = example.Stack()
    if inner is not None:
        model.layers = nnx.scan(nnx.remat(example._layer, **inner),
                                in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    return model


def step_of(example: Any, inner: dict[str, Any] | None,
            schedule: autoremat.Schedule) -> tuple[Any, tuple[Any, ...]]:
    """The training step (loss under ``nnx.remat_scans``, Adam) and its arguments."""
    problem = autoremat.nnx.problem(
        "inner_remat", lambda _: with_inner(example, inner), example.loss_fn,
        lambda m: nnx.Optimizer(m, optax.adam(1e-3), wrt=nnx.Param),
        (example.tokens(),), example.LAYERS, min_length=example.LAYERS, fuse=False)
    return problem.build(schedule)


def stored_by_the_scan(example: Any, inner: dict[str, Any] | None,
                       schedule: autoremat.Schedule) -> int:
    """Bytes of the residuals the loss's gradient keeps that the layer scan stacks (a
    leading axis of the layer count), read from ``print_saved_residuals``."""
    graphdef, state = nnx.split(with_inner(example, inner))
    loss = autoremat.nnx.remat_scans(example.loss_fn, schedule, min_length=example.LAYERS)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        jax.ad_checkpoint.print_saved_residuals(
            lambda s, t: loss(nnx.merge(graphdef, s), t), state, example.tokens())
    total = 0
    for line in printed.getvalue().splitlines():
        found = RESIDUAL.match(line)
        if found and "output of scan" in line:
            shape = [int(n) for n in found.group(2).split(",") if n]
            if shape and shape[0] == example.LAYERS:
                total += math.prod(shape) * ITEMSIZE[found.group(1)]
    return total


def timed(steps: list[tuple[Any, tuple[Any, ...]]], rounds: int) -> list[tuple[float, float]]:
    """Per step, (median seconds of ``rounds`` runs after a warm-up, the loss); the steps
    timed in turn, so a busy machine slows them alike."""
    compiled = [jax.jit(step).lower(*args).compile() for step, args in steps]
    losses = [float(jax.block_until_ready(c(*args))[1])
              for c, (_, args) in zip(compiled, steps, strict=True)]
    samples: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for c, (_, args), out in zip(compiled, steps, samples, strict=True):
            t0 = time.perf_counter()
            jax.block_until_ready(c(*args))
            out.append(time.perf_counter() - t0)
    return [(statistics.median(t), loss) for t, loss in zip(samples, losses, strict=True)]


def summary(rows: list[tuple[str, str, int, int, float, bool]]) -> list[str]:
    """What the table shows, read from it: per schedule, whether the inner remat changed
    what the layer scan stores, and the range of its temp and step-time ratios."""
    out = ["What it shows, per schedule (inner remat against the unwrapped block):", ""]
    for label in SCHEDULES:
        mine = [r for r in rows if r[0] == label]
        base = next(r for r in mine if r[1] == "none")
        others = [r for r in mine if r[1] != "none"]
        stored = ("the same residuals stored whatever the inner policy (the schedule's "
                  "policy decides)" if all(r[2] == base[2] for r in others)
                  else "stored residuals " + ", ".join(
                      f"{r[1]} {format_bytes(r[2])}" for r in others)
                  + f" against {format_bytes(base[2])} (the inner policy decides)")
        temps = [r[3] / base[3] for r in others]
        times = [r[4] / base[4] for r in others]
        out.append(f"- {label}: {stored}; temp {min(temps):.2f}-{max(temps):.2f}x, step "
                   f"{min(times):.2f}-{max(times):.2f}x.")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--mlp", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="timed runs of each step")
    parser.add_argument("--out", type=Path, default=ROOT / "studies" / "results" / "inner_remat.md")
    args = parser.parse_args(argv)
    sizes = {"layers": args.layers, "d_model": args.d_model, "heads": 4, "mlp": args.mlp,
             "seq_len": args.seq_len, "batch": args.batch}
    example = load_example(sizes)
    rows: list[tuple[str, str, int, int, float, bool]] = []
    reference: float | None = None
    for sched_label, make in SCHEDULES.items():
        schedule = make(args.layers)
        steps = [step_of(example, inner, schedule) for inner in INNER.values()]
        times = timed(steps, args.rounds)
        for (inner_label, inner), (step, step_args), (seconds, loss) in zip(
                INNER.items(), steps, times, strict=True):
            m = autoremat.measure_step(step, step_args, run=False)
            stored = stored_by_the_scan(example, inner, schedule)
            reference = loss if reference is None else reference
            same = abs(loss - reference) <= 1e-5 * abs(reference)
            rows.append((sched_label, inner_label, stored, m.temp_bytes, seconds, same))
            print(f"{sched_label:<24} {inner_label:<24} stored {format_bytes(stored):>9} temp "
                  f"{format_bytes(m.temp_bytes):>9} {seconds * 1e3:8.1f} ms  same loss {same}",
                  flush=True)
    env = environment()
    base = {s: (t, sec) for s, i, _, t, sec, _ in rows if i == "none"}
    lines = [
        "# A remat inside the scheduled block: what it does to a schedule",
        "",
        f"`python studies/inner_remat.py --layers {args.layers} --d-model {args.d_model} "
        f"--mlp {args.mlp} --seq-len {args.seq_len} --batch {args.batch} --rounds "
        f"{args.rounds}` ({env['device_kind']}, jax {env['jax_version']}, flax "
        f"{env['flax_version']}). The NNX stack of `examples/nnx_stack.py` (float32, 4 heads, "
        "Adam 1e-3), its layer scan under `autoremat.nnx.remat_scans` (min_length = the layer "
        "count, unfused); the block inside the scanned step wrapped as the *inner remat* "
        "column says. Temp memory from `compiled.memory_analysis()` (`measure_step`), the "
        f"step time the median of {args.rounds} runs; *vs unwrapped*: against the same "
        "schedule with the block unwrapped.",
        "",
        "| schedule | inner remat | stored by the layer scan | temp | vs unwrapped | step "
        "| vs unwrapped | same loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sched_label, inner_label, stored, temp, seconds, same in rows:
        t0, s0 = base[sched_label]
        lines.append(f"| {sched_label} | {inner_label} | {format_bytes(stored)} | "
                     f"{format_bytes(temp)} | "
                     f"{temp / t0:.2f} | {seconds * 1e3:.1f} ms | {seconds / s0:.2f} | {same} |")
    lines += ["", *summary(rows)]
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
