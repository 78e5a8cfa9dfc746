"""The seed LSTM step on 4 devices (``data=4``) against 1 device: per-device memory.

Compile-only (``autoremat.measure(..., run=False)``: ``memory_analysis()`` of
each compiled step, nothing is run), on 4 forced CPU devices, the seed's
train step at T=10^4, batch 12 (a multiple of 4), for the plain scan, a
nested and a binomial schedule:

* per-device argument bytes (XLA's) against the replicated arguments plus the
  sharded ones / 4, summed from the arrays' shapes -- equal, exactly;
* per-device temp on ``data=4`` against the one-device temp of the same
  schedule (the batch is split 4 ways; replicated parameters, their gradients
  and Adam's temporaries are not).

    python studies/bench_mesh.py        # about 1 minute on 2 CPUs

Writes ``studies/results/mesh.md`` (``--out`` to change).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4")

import argparse
from pathlib import Path

import autoremat
from autoremat._atomic import atomic_write_text
from autoremat._measure.device import environment
from autoremat._units import format_bytes

T, BATCH, MESH = 10_000, 12, "data=4"
SCHEDULES = {"plain": autoremat.plain(T),
             "nested": autoremat.nested([100, 100], ["nothing_saveable", "everything_saveable"]),
             "binomial": autoremat.binomial(16)}


def replicated_plus_sharded(problem: autoremat.Problem) -> tuple[int, int]:
    """``(replicated bytes, sharded bytes)`` of the problem's arguments, whole arrays."""
    import jax

    _, args = problem.build(autoremat.plain(T))
    replicated = sharded = 0
    for leaf in jax.tree_util.tree_leaves(args):
        if leaf.sharding.is_fully_replicated:
            replicated += leaf.nbytes
        else:
            sharded += leaf.nbytes
    return replicated, sharded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "mesh.md"))
    out = parser.parse_args().out
    one = autoremat.seed_lstm(seq_len=T, batch=BATCH)
    four = autoremat.seed_lstm(seq_len=T, batch=BATCH, mesh=MESH)
    replicated, sharded = replicated_plus_sharded(four)
    env = environment()
    lines = [
        "# The seed LSTM step on a mesh: per-device memory",
        "",
        f"Compiled (not run) on 4 forced {env['platform']} devices, jax {env['jax_version']}, "
        f"flax {env['flax_version']}; `python studies/bench_mesh.py`. The seed's train step "
        f"(hidden 128, seq2seq, Adam) at T={T}, batch {BATCH}: on one device, and on mesh "
        f"{MESH} (the batch split 4 ways, parameters and optimizer state replicated). Bytes "
        "are XLA's `memory_analysis()` of each compiled step, per device.",
        "",
        f"Arguments, whole arrays: replicated {format_bytes(replicated)} ({replicated} B), "
        f"sharded {format_bytes(sharded)} ({sharded} B); replicated + sharded/4 = "
        f"{replicated + sharded // 4} B.",
        "",
        "| schedule | args, 1 device | args per device, data=4 | = replicated + sharded/4 | "
        "temp, 1 device | temp per device, data=4 | temp ratio | <= 0.35 |",
        "|---|---:|---:|:---:|---:|---:|---:|:---:|",
    ]
    for label, schedule in SCHEDULES.items():
        a = autoremat.measure(one, schedule, run=False)
        b = autoremat.measure(four, schedule, run=False)
        assert a.temp_bytes and b.temp_bytes and b.argument_bytes, (a.reason, b.reason)
        ratio = b.temp_bytes / a.temp_bytes
        exact = b.argument_bytes == replicated + sharded // 4
        lines.append(
            f"| {label}: `{schedule.describe()}` | {a.argument_bytes} | {b.argument_bytes} | "
            f"{'yes' if exact else 'NO'} | {format_bytes(a.temp_bytes)} | "
            f"{format_bytes(b.temp_bytes)} | {ratio:.3f} | {'yes' if ratio <= 0.35 else 'NO'} |")
        print(lines[-1], flush=True)
    lines += ["", "Temp on the mesh is not a quarter exactly: the parameters' gradients and "
              "Adam's update temporaries are replicated, and each device holds them whole.", ""]
    atomic_write_text(Path(out), "\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
