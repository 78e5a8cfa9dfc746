"""Where a measured step's memory goes, and the part no schedule can remove.

``memory_analysis()`` gives four figures (argument, output, temp, alias; ``memory_parts``
reads them, ``total_of`` is the step's total). The breakdown splits them further, each
part from where it is known exactly:

* arguments: per argument of the step (``Problem.arg_names``: params,
  optimizer state, inputs, ...), as the device holds them (``on_device_size_in_bytes``:
  a TPU pads small minor dimensions to (8, 128) tiles) -- per device: a sharded array
  counts its shard (``autoremat._measure.mesh``), and each argument is marked
  replicated or sharded;
* stacked: the per-step outputs every (outermost) autoremat scan stacks and
  its carry, reported by the scan at trace time (``record_scans``); on an
  accelerator each stacked array is sized as the device lays it out (the output
  size of a compiled array of its shape and dtype);
* the rest of temp: what the compiled executable needs beyond the stack --
  the residuals the schedule keeps, cotangents, workspace.

Every line adds up to what it prints. Where temp is smaller than the stacked outputs
(a TPU keeps a small working set in on-chip memory, which temp does not count: 0 B
for a step whose per-step outputs are 51 MB), the breakdown says so instead of
placing them inside temp, and leaves them out of the floor.

A schedule only changes the rest of temp: it trades stored residuals for
recomputation (Chen et al. 2016; Griewank & Walther 2000). Arguments,
outputs and the stacked per-step outputs (where they are in device memory) are a
*floor* under every schedule's total. When a budget is under it, the fixes are outside the
schedule: the readout inside the step (``autoremat.fuse_loss`` stacks
nothing, ``fuse_head`` only ``(T, B, Y)``; ``remat_scans`` and so
``Problem.from_loss`` do it for an unmodified readout separable in time, and
the floor they report is what remains), a shorter ``T``, a smaller batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autoremat._measure.device_memory import unmeasured_reason
from autoremat._measure.measurement import OK, PROOF_FIELDS, Measurement, figure_names, fit_figure
from autoremat._measure.mesh import device_note, leaf_bytes
from autoremat._units import format_bytes

#: The keys a breakdown reads (``Measurement`` fields, and ``Schedule.meta`` keys).
KEYS = figure_names("total_bytes", "temp_bytes", "argument_bytes", "output_bytes",
                    "alias_bytes", "argument_parts", "stacked_bytes", "carry_bytes",
                    "argument_sharding", "devices", "mesh", "platform")
#: The figures measured on a device that reports ``memory_stats()`` (GPU, TPU;
#: ``autoremat._measure.device_memory``), kept only where measured: on a CPU a
#: breakdown, a front's JSON and a schedule's meta are as without them.
DEVICE_KEYS = figure_names("runtime_peak_bytes", "compile_scratch_bytes", "peak_bytes",
                           *PROOF_FIELDS)


def breakdown_figures(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The ``KEYS`` of ``attrs`` (``Measurement.to_attrs``), and its ``DEVICE_KEYS`` that
    were measured."""
    return {k: v for k, v in attrs.items()
            if k in KEYS or (k in DEVICE_KEYS and v is not None and v != "")}


def _arg_sizes(args: Sequence[Any], names: Sequence[str] | None) -> list[tuple[str, int, str]]:
    """``(name, per-device bytes, "replicated" | "sharded" | "partly sharded")`` per argument,
    as the device holds them (``device_bytes``)."""
    import jax

    if names is None or len(names) != len(args):
        names = [f"arg{i}" for i in range(len(args))]
    out = []
    for name, arg in zip(names, args, strict=True):
        sizes = [leaf_bytes(leaf) for leaf in jax.tree_util.tree_leaves(arg)]
        split = {per < whole for per, whole in sizes if whole}
        how = "partly sharded" if len(split) > 1 else "sharded" if True in split else "replicated"
        out.append((str(name), sum(device_bytes(leaf) for leaf in jax.tree_util.tree_leaves(arg)),
                    how))
    return out


def device_bytes(leaf: Any) -> int:
    """One array's bytes on one device as the device lays it out: a placed ``jax.Array``'s
    ``on_device_size_in_bytes`` per shard (a TPU pads to tiles); else its shape's bytes."""
    per, _ = leaf_bytes(leaf)
    size, sharding = getattr(leaf, "on_device_size_in_bytes", None), getattr(leaf, "sharding", None)
    if size is None or sharding is None:
        return per
    try:
        return int(size()) // max(1, int(sharding.num_devices))
    except Exception:  # deleted, or not placed: the shape's bytes
        return per


def memory_parts(compiled: Any) -> dict[str, int | None]:
    """``memory_analysis()`` sizes; ``None`` where missing or negative."""
    try:
        analysis = compiled.memory_analysis()
    except Exception:
        analysis = None
    if isinstance(analysis, (list, tuple)):  # some versions: one per device
        analysis = analysis[0] if analysis else None
    names = {"argument": "argument_size_in_bytes", "output": "output_size_in_bytes",
             "temp": "temp_size_in_bytes", "alias": "alias_size_in_bytes"}
    parts: dict[str, int | None] = {}
    for part, attr in names.items():
        value = getattr(analysis, attr, None) if analysis is not None else None
        parts[part] = int(value) if isinstance(value, int) and value >= 0 else None
    return parts


def total_of(parts: dict[str, int | None]) -> int | None:
    """argument + output + temp - alias; ``None`` when XLA reported nothing usable."""
    core = [parts["argument"], parts["output"], parts["temp"]]
    if any(v is None for v in core) or sum(v for v in core if v is not None) == 0:
        return None
    return sum(v for v in core if v is not None) - (parts["alias"] or 0)


def argument_parts(args: Sequence[Any], names: Sequence[str] | None) -> tuple[tuple[str, int], ...]:
    """``(name, bytes per device)`` of each argument (``names`` when they match ``args``,
    else ``arg0``...); a sharded array counts its one shard."""
    return tuple((name, per) for name, per, _ in _arg_sizes(args, names))


def argument_sharding(args: Sequence[Any], names: Sequence[str] | None,
                      devices: int) -> tuple[tuple[str, str], ...]:
    """``(name, "replicated" | "sharded" | "partly sharded")`` per argument; empty on one
    device. ``partly``: some of its arrays are split, others whole on every device."""
    if devices <= 1:
        return ()
    return tuple((name, how) for name, _, how in _arg_sizes(args, names))


def scan_figures(records: Sequence[Any], platform: str = "cpu") -> dict[str, int | None]:
    """``stacked_bytes`` and ``carry_bytes`` summed over the recorded scans (``None``: no scan);
    off a CPU the stacked arrays as ``platform``'s device lays them out (``laid_out_bytes``)."""
    if not records:
        return {"stacked_bytes": None, "carry_bytes": None}
    return {"stacked_bytes": sum(_stacked_on_device(r, platform) for r in records),
            "carry_bytes": sum(r.carry_bytes for r in records)}


def _stacked_on_device(record: Any, platform: str) -> int:
    if platform == "cpu" or not record.stacked_shapes:
        return int(record.stacked_bytes)
    sizes = [laid_out_bytes(shape, dtype) for shape, dtype in record.stacked_shapes]
    return int(record.stacked_bytes) if None in sizes else sum(s or 0 for s in sizes)


@functools.lru_cache(maxsize=256)
def laid_out_bytes(shape: tuple[int, ...], dtype: str) -> int | None:
    """The device bytes of an array of ``shape`` and ``dtype`` on the default device: the
    output size of a compiled program that makes one (``memory_analysis``), so tiling and
    padding are the device's own; ``None`` where that cannot be read."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    try:
        logical = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        made = jax.jit(lambda: jnp.zeros(shape, dtype)).lower().compile()
        size = getattr(made.memory_analysis(), "output_size_in_bytes", None)
    except Exception:  # typed PRNG keys (no numpy dtype), a backend without the analysis
        return None
    return int(size) if isinstance(size, int) and size >= logical else None


#: A measurement's figures: a ``Measurement`` (typed, as measured) or a mapping of the same
#: names (a schedule's ``meta``, read back from YAML). Both are read as a ``Measurement``.
Figures = Measurement | Mapping[str, Any]


def _measured(fig: Figures) -> Measurement:
    """Either form as a ``Measurement``: a ``meta`` mapping is read by the records' own
    names (``Measurement.from_attrs``); only its figures are read here."""
    if isinstance(fig, Mapping):
        return Measurement.from_attrs({**fig, "schedule_key": "", "status": OK})
    return fig


def _on_chip(m: Measurement) -> bool:
    """Temp is smaller than the stacked per-step outputs: the compiler kept some of them
    outside device memory's temp (a TPU's on-chip memory), so they are not all there."""
    stacked, temp = m.sizes.stacked_bytes, m.sizes.temp_bytes
    return stacked is not None and temp is not None and int(temp) < int(stacked)


def floor_bytes(fig: Figures) -> int | None:
    """Arguments + outputs - alias + stacked per-step outputs: under every schedule's total
    (the stacked outputs left out where this compile kept them on chip, ``_on_chip``).

    ``None`` when a part is unknown or no autoremat scan was recorded.
    """
    sizes = (m := _measured(fig)).sizes
    needed = [sizes.argument_bytes, sizes.output_bytes, sizes.stacked_bytes]
    if any(v is None for v in needed):
        return None
    if _on_chip(m):
        needed = needed[:2]
    floor = sum(int(v) for v in needed if v is not None) - int(sizes.alias_bytes or 0)
    total = sizes.total_bytes
    return floor if total is None else min(floor, int(total))


def breakdown_lines(fig: Figures, indent: str = "  ") -> list[str]:
    """The breakdown as ``autoremat show``/``pareto``/``tune`` print it (empty: no figures).
    Each line adds up to what it prints."""
    m = _measured(fig)
    sizes, where = m.sizes, m.where
    if sizes.total_bytes is None or sizes.temp_bytes is None:
        return []
    alias = int(sizes.alias_bytes or 0)
    temp = int(sizes.temp_bytes)
    note = device_note(int(where.devices or 1), str(where.mesh or ""))
    lines = [f"{indent}memory ({note}): total {format_bytes(sizes.total_bytes)} = arguments "
             f"{format_bytes(sizes.argument_bytes)} + outputs "
             f"{format_bytes(sizes.output_bytes)}"
             + (f" - aliased {format_bytes(alias)}" if alias else "")
             + f" + temp {format_bytes(temp)}"]
    how = dict(where.argument_sharding)
    if sizes.argument_parts:
        lines.append(f"{indent}  arguments: " + ", ".join(
            f"{n} {format_bytes(b)}" + (f" ({how[n]})" if n in how else "")
            for n, b in sizes.argument_parts))
    stacked = sizes.stacked_bytes
    carry = f"(carry {format_bytes(sizes.carry_bytes)})"
    if stacked is not None and _on_chip(m):
        lines.append(f"{indent}  temp {format_bytes(temp)} is below the per-step outputs the "
                     f"scan stacks, {format_bytes(stacked)} {carry}: the compiler keeps them "
                     "outside temp (in the chip's on-chip memory), so temp holds no part of "
                     "them that can be told apart")
    elif stacked is not None:
        lines.append(f"{indent}  temp = per-step outputs stacked by the scan "
                     f"{format_bytes(stacked)} {carry} + the rest "
                     f"{format_bytes(temp - int(stacked))} (residuals the schedule keeps, "
                     "cotangents, workspace)")
    floor = floor_bytes(m)
    if floor is not None:
        what = ("arguments + outputs; the stacked outputs are on chip here" if _on_chip(m)
                else "arguments + outputs + stacked per-step outputs")
        lines.append(f"{indent}  floor no schedule removes: {format_bytes(floor)} ({what})")
    return lines + device_lines(m, indent)


def device_lines(fig: Figures, indent: str = "  ") -> list[str]:
    """The estimate next to what the device measured (empty on a CPU): the step's runtime
    peak (``-`` with the reason where the platform's method is not validated), the
    transient compile scratch, the process's peak, which of estimate and runtime peak
    decides the fit (the runtime peak where measured), and the proof of fit."""
    m = _measured(fig)
    total, runtime = m.sizes.total_bytes, m.peaks.runtime_peak_bytes
    scratch, process = m.peaks.compile_scratch_bytes, m.peaks.peak_bytes
    reason = unmeasured_reason(str(m.where.platform or ""))
    proof = proof_text(m)
    if runtime is None and scratch is None and not reason and not proof:
        return []
    parts = [f"estimate {format_bytes(total)}"]
    if runtime is not None:
        change = f", {100 * (runtime - total) / total:+.1f}%" if total else ""
        parts.append(f"measured runtime peak {format_bytes(runtime)}{change}")
    else:
        parts.append(f"measured runtime peak - ({reason or 'not measured at full length'})")
    if scratch is not None:
        parts.append(f"compile scratch {format_bytes(scratch)} (transient, freed before "
                     "the step runs)")
    if process is not None:
        parts.append(f"process peak {format_bytes(process)}")
    bound = fit_figure(total, runtime)[1].replace("runtime peak", "measured runtime peak")
    return ([f"{indent}  device memory: " + ", ".join(parts) + f"; the fit is bound by the {bound}"]
            + ([f"{indent}  {proof}"] if proof else []))


def proof_text(fig: Figures) -> str:
    """One line on the proof of fit (``""``: none was run)."""
    m = _measured(fig)
    proven, failed = m.proof.fit_proof_bytes, m.proof.fit_proof_failed
    if failed:
        return f"proof of fit: FAILED ({failed})"
    if proven is None:
        return ""
    args = m.sizes.argument_bytes
    live = f": arguments {format_bytes(args)} live, the rest free" if args is not None else ""
    return (f"proof of fit: ran once with only {format_bytes(proven)} on the device "
            f"(the budget{live})")


def seed_lstm_argument(name: str) -> str:
    """How the library sets one of the built-in problem's settings: ``seed_lstm(name=...)``."""
    return f"seed_lstm({name}=...)"


def floor_message(fig: Figures, budget_bytes: int,
                  setting: Callable[[str], str] = seed_lstm_argument) -> str | None:
    """Why nothing can fit ``budget_bytes`` when it is under the floor, and how to lower it.

    ``None`` when the floor is unknown or within the budget. The settings that lower it
    (the built-in problem's ``fused_readout``, ``seq_len``, ``batch``) are worded by
    ``setting`` (name -> text): the library's ``seed_lstm(seq_len=...)``, or a front
    end's own (the CLI's ``--seq-len``).
    """
    sizes = (m := _measured(fig)).sizes
    floor = floor_bytes(m)
    if floor is None or floor <= budget_bytes:
        return None
    args = ", ".join(f"{n} {format_bytes(b)}" for n, b in sizes.argument_parts)
    alias = int(sizes.alias_bytes or 0)
    stacked = int(sizes.stacked_bytes or 0)
    made_of = (f"arguments {format_bytes(sizes.argument_bytes)}"
               + (f" ({args})" if args else "")
               + f", outputs {format_bytes(sizes.output_bytes)}"
               + (f" (aliased {format_bytes(alias)})" if alias else "")
               + f", per-step outputs stacked by the scan {format_bytes(stacked)}")
    fixes = [f"a shorter sequence (the built-in problem: {setting('seq_len')})",
             f"a smaller batch (the built-in problem: {setting('batch')})"]
    if stacked:
        fixes.insert(0, "the readout inside the scanned step (autoremat.fuse_loss stacks "
                     "nothing, autoremat.fuse_head only its outputs; the built-in problem: "
                     f"{setting('fused_readout')}; remat_scans and "
                     "Problem.from_loss move a readout and loss separable in time by themselves, "
                     "and remat_scans(...).describe(...) names what stopped them)")
    return (f"the budget {format_bytes(budget_bytes)} is under the {format_bytes(floor)} "
            f"({floor} bytes) that no schedule can remove: {made_of}. To lower it: "
            + "; ".join(fixes))
