"""A study's front as ``autoremat pareto`` prints it: a table (with the chosen point's memory
breakdown) or JSON. The front itself is data: ``autoremat._search.pareto.pareto_front``."""

from __future__ import annotations

import json
from dataclasses import asdict

from autoremat._cli.breakdown_text import breakdown_lines
from autoremat._measure.breakdown import DEVICE_KEYS
from autoremat._measure.measurement import fit_figure
from autoremat._search.pareto import FrontPoint
from autoremat._units import format_bytes, format_seconds


def front_table(points: list[FrontPoint], budget_bytes: int, note: str = "",
                seq_len: int | None = None) -> str:
    """A plain-text table of the front; ``*`` marks the chosen schedule; ``note``: what the
    memory figures are (``mesh.device_note``: per device, on how many, which mesh);
    ``seq_len``: the study's ``T`` (the ``timed`` column says where a step time is
    predicted from a shorter run). Where the device measured memory (GPU/TPU), three
    more columns: the measured runtime peak, the transient compile scratch, and which
    of estimate and runtime peak bound the fit."""
    device = any(k in p.breakdown for p in points for k in DEVICE_KEYS[:2])
    lines = [
        f"Pareto front within budget {format_bytes(budget_bytes)} ({len(points)} points; "
        "* = chosen: fastest that fits)" + (f"; memory {note}" if note else ""),
        f"  {'trial':>5}  {'total':>10}  " + (_DEVICE_HEADER if device else "")
        + f"{'step':>10}  {'vs fastest':>10}  {'recompute':>9}  "
        f"{'vs opt':>6}  {'timed':>16}  schedule",
    ]
    for p in points:
        mark = "*" if p.chosen else " "
        lines.append(
            f"{mark} {p.number:>5}  {format_bytes(p.total_bytes):>10}  "
            + (_device_cells(p) if device else "")
            + f"{format_seconds(p.step_seconds):>10}  {p.ratio_to_fastest:>9.2f}x  {p.recompute:>8.2f}x  "
            f"{p.vs_optimum:>6.2f}  {_timed(p.timed_seq_len, seq_len):>16}  {p.schedule}"
        )
    lines.append("  recompute: step runs per step (1 plain scan, 2 per-step remat); vs opt: over the "
                 "fewest any schedule storing as many carries needs (autoremat.bounds)")
    if device:
        lines.append("  total: the estimate (memory_analysis); runtime peak: measured, this step "
                     "alone (memory_stats); compile scratch: transient, while compiling; the "
                     "fit is decided by the runtime peak where measured (bound), else the "
                     "estimate")
    for p in points:
        memory = breakdown_lines(p.breakdown) if p.chosen else []
        if memory:
            lines += [f"chosen (trial {p.number}):", *memory]
    return "\n".join(lines)


_DEVICE_HEADER = f"{'runtime peak':>12}  {'compile scr.':>12}  {'bound':>12}  "


def _device_cells(p: FrontPoint) -> str:
    """The runtime peak, compile scratch and bound cells of a point's row."""
    runtime = p.breakdown.get("runtime_peak_bytes")
    scratch = p.breakdown.get("compile_scratch_bytes")
    bound = fit_figure(p.total_bytes, runtime)[1]
    return (f"{format_bytes(runtime) if runtime is not None else '-':>12}  "
            f"{format_bytes(scratch) if scratch is not None else '-':>12}  {bound:>12}  ")


def _timed(timed_seq_len: int | None, seq_len: int | None) -> str:
    """``measured at T`` or ``predicted, T'=N`` (``-``: not recorded, an older study)."""
    if timed_seq_len is None:
        return "-"
    if seq_len is not None and timed_seq_len < seq_len:
        return f"predicted T'={timed_seq_len}"
    return "measured at T"


def front_json(points: list[FrontPoint], budget_bytes: int) -> str:
    """The front as JSON: ``{"budget_bytes": ..., "front": [FrontPoint fields...]}``."""
    return json.dumps({"budget_bytes": budget_bytes, "front": [asdict(p) for p in points]},
                      indent=2)
