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

The parts are records (``Breakdown``, ``Floor``, ``DeviceFigures``); their words are the
command line's (``autoremat._cli.breakdown_text``). Where temp is smaller than the stacked
outputs (a TPU keeps a small working set in on-chip memory, which temp does not count:
0 B for a step whose per-step outputs are 51 MB), the breakdown marks it (``on_chip``)
instead of placing them inside temp, and leaves them out of the floor.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoremat._measure.device_memory import unmeasured_reason
from autoremat._measure.measurement import OK, PROOF_FIELDS, Measurement, figure_names, fit_figure
from autoremat._measure.mesh import leaf_bytes

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


@dataclass(frozen=True)
class Floor:
    """The bytes no schedule removes (``floor_of``), and what they are made of.

    Attributes:
      bytes: arguments + outputs - alias + stacked per-step outputs (the stacked outputs
        left out where ``on_chip``), at most the step's total.
      argument_bytes, output_bytes, alias_bytes: ``memory_analysis()``'s parts.
      argument_parts: ``(name, bytes per device)`` per argument.
      stacked_bytes: the per-step outputs the scans stack.
      on_chip: this compile kept the stacked outputs outside temp (``_on_chip``).
    """

    bytes: int
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    stacked_bytes: int
    argument_parts: tuple[tuple[str, int], ...] = ()
    on_chip: bool = False


def floor_of(fig: Figures) -> Floor | None:
    """The floor under every schedule's total; ``None`` when a part is unknown or no
    autoremat scan was recorded."""
    sizes = (m := _measured(fig)).sizes
    args, outputs, stacked = sizes.argument_bytes, sizes.output_bytes, sizes.stacked_bytes
    if args is None or outputs is None or stacked is None:
        return None
    on_chip = _on_chip(m)
    alias = int(sizes.alias_bytes or 0)
    floor = int(args) + int(outputs) + (0 if on_chip else int(stacked)) - alias
    total = sizes.total_bytes
    return Floor(floor if total is None else min(floor, int(total)), int(args), int(outputs),
                 alias, int(stacked), tuple(sizes.argument_parts), on_chip)


def least_bytes(fig: Figures) -> int | None:
    """Bytes under the total of every schedule of the step, fused or not: its arguments
    and outputs, less what they alias (the floor less the stacked outputs, which only an
    unfused readout has); ``None``: a part is unknown."""
    sizes = _measured(fig).sizes
    if sizes.argument_bytes is None or sizes.output_bytes is None:
        return None
    return int(sizes.argument_bytes) + int(sizes.output_bytes) - int(sizes.alias_bytes or 0)


def floor_bytes(fig: Figures) -> int | None:
    """``floor_of(fig).bytes``: under every schedule's total (``None``: unknown)."""
    floor = floor_of(fig)
    return None if floor is None else floor.bytes


@dataclass(frozen=True)
class Breakdown:
    """Where a measured step's memory goes (``breakdown_of``): the four figures of
    ``memory_analysis()``, the arguments one by one, the stacked per-step outputs, the
    floor, and what the device measured (``None`` where it did not: a CPU).

    Attributes:
      total_bytes, temp_bytes, alias_bytes: ``memory_analysis()``'s (alias 0 if none).
      argument_bytes, output_bytes: its other two (``None``: not reported).
      argument_parts: ``(name, bytes per device)``; argument_sharding: ``(name, how)``
        (``"replicated"``, ``"sharded"``, ``"partly sharded"``; empty on one device).
      stacked_bytes, carry_bytes: what the scans stack and carry (``None``: no scan).
      on_chip: temp is below the stacked outputs (kept outside temp, ``_on_chip``).
      floor: the bytes no schedule removes (``floor_of``).
      devices, mesh: the figures are per device, on this many, on this mesh.
      device: what the device measured next to the estimate (``DeviceFigures``).
    """

    total_bytes: int
    temp_bytes: int
    alias_bytes: int
    argument_bytes: int | None
    output_bytes: int | None
    argument_parts: tuple[tuple[str, int], ...]
    argument_sharding: tuple[tuple[str, str], ...]
    stacked_bytes: int | None
    carry_bytes: int | None
    on_chip: bool
    floor: Floor | None
    devices: int
    mesh: str
    device: DeviceFigures | None


@dataclass(frozen=True)
class DeviceFigures:
    """The estimate next to what the device measured (``device_figures``).

    Attributes:
      estimate_bytes: the step's total (``memory_analysis()``).
      runtime_peak_bytes: the step's measured runtime peak (``None``: not measured, see
        ``unmeasured_reason``); compile_scratch_bytes: the transient compile scratch;
        process_peak_bytes: the process's peak.
      unmeasured_reason: why the platform's runtime peak is not measured (``""``: it is).
      bound: which of estimate and runtime peak decides the fit (``fit_figure``).
      proof_bytes: the budget a proof of fit ran the step under (``None``: none ran);
      proof_failed: why that proof failed (``""``: it did not); argument_bytes: the
        arguments live during the proof.
    """

    estimate_bytes: int | None
    runtime_peak_bytes: int | None
    compile_scratch_bytes: int | None
    process_peak_bytes: int | None
    unmeasured_reason: str
    bound: str
    proof_bytes: int | None
    proof_failed: str
    argument_bytes: int | None


def device_figures(fig: Figures) -> DeviceFigures | None:
    """What the device measured and proved; ``None`` where it measured and proved nothing
    and its platform's method is not in doubt (a CPU)."""
    m = _measured(fig)
    total, runtime = m.sizes.total_bytes, m.peaks.runtime_peak_bytes
    scratch = m.peaks.compile_scratch_bytes
    reason = unmeasured_reason(str(m.where.platform or ""))
    proven, failed = m.proof.fit_proof_bytes, m.proof.fit_proof_failed
    if runtime is None and scratch is None and not reason and not failed and proven is None:
        return None
    return DeviceFigures(total, runtime, scratch, m.peaks.peak_bytes, reason,
                         fit_figure(total, runtime)[1], proven, str(failed or ""),
                         m.sizes.argument_bytes)


def breakdown_of(fig: Figures) -> Breakdown | None:
    """The breakdown of a measurement (or a schedule's ``meta``); ``None`` when it holds no
    total or temp."""
    m = _measured(fig)
    sizes, where = m.sizes, m.where
    if sizes.total_bytes is None or sizes.temp_bytes is None:
        return None
    return Breakdown(
        total_bytes=int(sizes.total_bytes), temp_bytes=int(sizes.temp_bytes),
        alias_bytes=int(sizes.alias_bytes or 0), argument_bytes=sizes.argument_bytes,
        output_bytes=sizes.output_bytes, argument_parts=tuple(sizes.argument_parts),
        argument_sharding=tuple(where.argument_sharding),
        stacked_bytes=None if sizes.stacked_bytes is None else int(sizes.stacked_bytes),
        carry_bytes=sizes.carry_bytes, on_chip=_on_chip(m), floor=floor_of(m),
        devices=int(where.devices or 1), mesh=str(where.mesh or ""),
        device=device_figures(m))


