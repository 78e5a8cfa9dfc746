"""Where a measured step's memory goes, and the part no schedule can remove.

``memory_analysis()`` gives four figures (argument, output, temp, alias). The
breakdown splits them further, each part from where it is known exactly:

* arguments: per argument of the step (``Problem.arg_names``: params,
  optimizer state, inputs, ...), summed from the argument tree's shapes --
  per device: a sharded array counts its shard (``autoremat._mesh``), and
  each argument is marked replicated or sharded;
* stacked: the per-step outputs every (outermost) autoremat scan stacks and
  its carry, reported by the scan at trace time (``record_scans``);
* the rest of temp: what the compiled executable needs beyond the stack --
  the residuals the schedule keeps, cotangents, workspace.

A schedule only changes the rest of temp: it trades stored residuals for
recomputation (Chen et al. 2016; Griewank & Walther 2000). Arguments,
outputs and the stacked per-step outputs are a *floor* under every
schedule's total. When a budget is under it, the fixes are outside the
schedule: the readout inside the step (``autoremat.fuse_loss`` stacks
nothing, ``fuse_head`` only ``(T, B, Y)``; ``remat_scans`` and so
``Problem.from_loss`` do it for an unmodified readout separable in time, and
the floor they report is what remains), a shorter ``T``, a smaller batch.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoremat._mesh import device_note, leaf_bytes
from autoremat._units import format_bytes

#: The keys a breakdown reads (``Measurement`` fields, and ``Schedule.meta`` keys).
KEYS = ("total_bytes", "temp_bytes", "argument_bytes", "output_bytes", "alias_bytes",
        "argument_parts", "stacked_bytes", "carry_bytes", "argument_sharding", "devices",
        "mesh")


@dataclass(frozen=True)
class ScanRecord:
    """What one autoremat scan holds whatever its schedule (``record_scans``).

    Attributes:
      stacked_bytes: its stacked per-step outputs (``T`` x one step's ``y``).
      carry_bytes: one carry.
    """

    stacked_bytes: int
    carry_bytes: int


SCAN_RECORDS: contextvars.ContextVar[list[ScanRecord] | None] = contextvars.ContextVar(
    "autoremat_scan_records", default=None)


@contextlib.contextmanager
def record_scans() -> Iterator[list[ScanRecord]]:
    """Every outermost autoremat scan traced inside appends its ``ScanRecord`` to the list.

    Scans inside a scanned step are not recorded: what they stack is part of
    the outer step's output.
    """
    records: list[ScanRecord] = []
    token = SCAN_RECORDS.set(records)
    try:
        yield records
    finally:
        SCAN_RECORDS.reset(token)


def _arg_sizes(args: Sequence[Any], names: Sequence[str] | None) -> list[tuple[str, int, str]]:
    """``(name, per-device bytes, "replicated" | "sharded" | "partly sharded")`` per argument."""
    import jax

    if names is None or len(names) != len(args):
        names = [f"arg{i}" for i in range(len(args))]
    out = []
    for name, arg in zip(names, args, strict=True):
        sizes = [leaf_bytes(leaf) for leaf in jax.tree_util.tree_leaves(arg)]
        split = {per < whole for per, whole in sizes if whole}
        how = "partly sharded" if len(split) > 1 else "sharded" if True in split else "replicated"
        out.append((str(name), sum(per for per, _ in sizes), how))
    return out


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


def scan_figures(records: Sequence[Any]) -> dict[str, int | None]:
    """``stacked_bytes`` and ``carry_bytes`` summed over the recorded scans (``None``: no scan)."""
    if not records:
        return {"stacked_bytes": None, "carry_bytes": None}
    return {"stacked_bytes": sum(r.stacked_bytes for r in records),
            "carry_bytes": sum(r.carry_bytes for r in records)}


def _parts(value: Any) -> list[tuple[str, int]]:
    """``argument_parts`` as pairs, from pairs (a ``Measurement``) or a mapping (``meta``)."""
    if isinstance(value, Mapping):
        return [(str(k), int(v)) for k, v in value.items()]
    return [(str(k), int(v)) for k, v in value or ()]


def _parts_text(value: Any) -> list[tuple[str, str]]:
    """``argument_sharding`` as pairs, from pairs (a ``Measurement``) or a mapping (``meta``)."""
    if isinstance(value, Mapping):
        return [(str(k), str(v)) for k, v in value.items()]
    return [(str(k), str(v)) for k, v in value or ()]


def floor_bytes(fig: Mapping[str, Any]) -> int | None:
    """Arguments + outputs - alias + stacked per-step outputs: under every schedule's total.

    ``None`` when a part is unknown or no autoremat scan was recorded.
    """
    needed = [fig.get(k) for k in ("argument_bytes", "output_bytes", "stacked_bytes")]
    if any(v is None for v in needed):
        return None
    floor = sum(int(v) for v in needed if v is not None) - int(fig.get("alias_bytes") or 0)
    total = fig.get("total_bytes")
    return floor if total is None else min(floor, int(total))


def breakdown_lines(fig: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """The breakdown as ``autoremat show``/``pareto``/``tune`` print it (empty: no figures)."""
    if fig.get("total_bytes") is None or fig.get("temp_bytes") is None:
        return []
    alias = int(fig.get("alias_bytes") or 0)
    note = device_note(int(fig.get("devices") or 1), str(fig.get("mesh") or ""))
    lines = [f"{indent}memory ({note}): total {format_bytes(fig['total_bytes'])} = arguments "
             f"{format_bytes(fig.get('argument_bytes'))} + outputs "
             f"{format_bytes(fig.get('output_bytes'))}"
             + (f" - aliased {format_bytes(alias)}" if alias else "")
             + f" + temp {format_bytes(fig['temp_bytes'])}"]
    parts = _parts(fig.get("argument_parts"))
    how = dict(_parts_text(fig.get("argument_sharding")))
    if parts:
        lines.append(f"{indent}  arguments: " + ", ".join(
            f"{n} {format_bytes(b)}" + (f" ({how[n]})" if n in how else "") for n, b in parts))
    stacked = fig.get("stacked_bytes")
    if stacked is not None:
        rest = max(0, int(fig["temp_bytes"]) - int(stacked))
        lines.append(f"{indent}  temp: per-step outputs stacked by the scan "
                     f"{format_bytes(stacked)} (carry {format_bytes(fig.get('carry_bytes'))}); "
                     f"the rest {format_bytes(rest)} (residuals the schedule keeps, cotangents, "
                     "workspace)")
    floor = floor_bytes(fig)
    if floor is not None:
        lines.append(f"{indent}  floor no schedule removes: {format_bytes(floor)} (arguments + "
                     "outputs + stacked per-step outputs)")
    return lines


def floor_message(fig: Mapping[str, Any], budget_bytes: int) -> str | None:
    """Why nothing can fit ``budget_bytes`` when it is under the floor, and how to lower it.

    ``None`` when the floor is unknown or within the budget.
    """
    floor = floor_bytes(fig)
    if floor is None or floor <= budget_bytes:
        return None
    parts = _parts(fig.get("argument_parts"))
    args = ", ".join(f"{n} {format_bytes(b)}" for n, b in parts)
    alias = int(fig.get("alias_bytes") or 0)
    stacked = int(fig.get("stacked_bytes") or 0)
    made_of = (f"arguments {format_bytes(fig.get('argument_bytes'))}"
               + (f" ({args})" if args else "")
               + f", outputs {format_bytes(fig.get('output_bytes'))}"
               + (f" (aliased {format_bytes(alias)})" if alias else "")
               + f", per-step outputs stacked by the scan {format_bytes(stacked)}")
    fixes = ["a shorter sequence (built-in problem: seed_lstm(seq_len=...))",
             "a smaller batch (seed_lstm(batch=...))"]
    if stacked:
        fixes.insert(0, "the readout inside the scanned step (autoremat.fuse_loss stacks "
                     "nothing, autoremat.fuse_head only its outputs; the built-in problem: "
                     "seed_lstm(fused_readout=True); remat_scans and Problem.from_loss move "
                     "a readout and loss separable in time by themselves, and "
                     "remat_scans(...).describe(...) names what stopped them)")
    return (f"the budget {format_bytes(budget_bytes)} is under the {format_bytes(floor)} "
            f"({floor} bytes) that no schedule can remove: {made_of}. To lower it: "
            + "; ".join(fixes))
