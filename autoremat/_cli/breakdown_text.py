"""The memory breakdown and the floor in words, as ``tune``, ``pareto`` and ``show`` print
them; the figures are records of ``autoremat._measure.breakdown`` (``Breakdown``,
``Floor``). Every line adds up to what it prints. The fixes a floor names are the
problem's (``autoremat._models.FloorFixes``: the built-in problem's settings by default),
worded by a ``setting`` function: the library's ``seed_lstm(seq_len=...)`` or the
command line's ``--seq-len``."""

from __future__ import annotations

from collections.abc import Callable

from autoremat._measure.breakdown import (
    Breakdown,
    DeviceFigures,
    Figures,
    breakdown_of,
    floor_of,
)
from autoremat._measure.mesh import device_note
from autoremat._models import SEED_FIXES, FloorFixes
from autoremat._search.bound import Bound
from autoremat._search.study import TuneResult
from autoremat._units import format_bytes


def breakdown_lines(fig: Figures, indent: str = "  ") -> list[str]:
    """The breakdown as ``autoremat show``/``pareto``/``tune`` print it (empty: no figures)."""
    b = breakdown_of(fig)
    return [] if b is None else breakdown_text(b, indent)


def breakdown_text(b: Breakdown, indent: str = "  ") -> list[str]:
    """``b``'s lines: the total, the arguments, temp and the stacked outputs, the floor,
    and what the device measured."""
    note = device_note(b.devices, b.mesh)
    lines = [f"{indent}memory ({note}): total {format_bytes(b.total_bytes)} = arguments "
             f"{format_bytes(b.argument_bytes)} + outputs "
             f"{format_bytes(b.output_bytes)}"
             + (f" - aliased {format_bytes(b.alias_bytes)}" if b.alias_bytes else "")
             + f" + temp {format_bytes(b.temp_bytes)}"]
    how = dict(b.argument_sharding)
    if b.argument_parts:
        lines.append(f"{indent}  arguments: " + ", ".join(
            f"{n} {format_bytes(size)}" + (f" ({how[n]})" if n in how else "")
            for n, size in b.argument_parts))
    stacked, temp = b.stacked_bytes, b.temp_bytes
    carry = f"(carry {format_bytes(b.carry_bytes)})"
    if stacked is not None and b.on_chip:
        lines.append(f"{indent}  temp {format_bytes(temp)} is below the per-step outputs the "
                     f"scan stacks, {format_bytes(stacked)} {carry}: the compiler keeps them "
                     "outside temp (in the chip's on-chip memory), so temp holds no part of "
                     "them that can be told apart")
    elif stacked is not None:
        lines.append(f"{indent}  temp = per-step outputs stacked by the scan "
                     f"{format_bytes(stacked)} {carry} + the rest "
                     f"{format_bytes(temp - stacked)} (residuals the schedule keeps, "
                     "cotangents, workspace)")
    if b.floor is not None:
        what = ("arguments + outputs; the stacked outputs are on chip here" if b.on_chip
                else "arguments + outputs + stacked per-step outputs")
        lines.append(f"{indent}  floor no schedule removes: {format_bytes(b.floor.bytes)} "
                     f"({what})")
    return lines + device_lines(b.device, indent)


def device_lines(d: DeviceFigures | None, indent: str = "  ") -> list[str]:
    """The estimate next to what the device measured (empty on a CPU): the step's runtime
    peak (``-`` with the reason where the platform's method is not validated), the
    transient compile scratch, the process's peak, which of estimate and runtime peak
    decides the fit (the runtime peak where measured), and the proof of fit."""
    if d is None:
        return []
    total, runtime = d.estimate_bytes, d.runtime_peak_bytes
    parts = [f"estimate {format_bytes(total)}"]
    if runtime is not None:
        change = f", {100 * (runtime - total) / total:+.1f}%" if total else ""
        parts.append(f"measured runtime peak {format_bytes(runtime)}{change}")
    else:
        parts.append("measured runtime peak - "
                     f"({d.unmeasured_reason or 'not measured at full length'})")
    if d.compile_scratch_bytes is not None:
        parts.append(f"compile scratch {format_bytes(d.compile_scratch_bytes)} (transient, "
                     "freed before the step runs)")
    if d.process_peak_bytes is not None:
        parts.append(f"process peak {format_bytes(d.process_peak_bytes)}")
    bound = d.bound.replace("runtime peak", "measured runtime peak")
    proof = proof_text(d)
    return ([f"{indent}  device memory: " + ", ".join(parts) + f"; the fit is bound by the {bound}"]
            + ([f"{indent}  {proof}"] if proof else []))


def proof_text(d: DeviceFigures | None) -> str:
    """One line on the proof of fit (``""``: none was run)."""
    if d is None:
        return ""
    if d.proof_failed:
        return f"proof of fit: FAILED ({d.proof_failed})"
    if d.proof_bytes is None:
        return ""
    args = d.argument_bytes
    live = f": arguments {format_bytes(args)} live, the rest free" if args is not None else ""
    return (f"proof of fit: ran once with only {format_bytes(d.proof_bytes)} on the device "
            f"(the budget{live})")


def seed_lstm_argument(name: str) -> str:
    """How the library sets one of the built-in problem's settings: ``seed_lstm(name=...)``."""
    return f"seed_lstm({name}=...)"


def floor_message(fig: Figures, budget_bytes: int,
                  setting: Callable[[str], str] = seed_lstm_argument,
                  fixes: FloorFixes = SEED_FIXES) -> str | None:
    """Why nothing can fit ``budget_bytes`` when it is under the floor, and how to lower it.

    ``None`` when the floor is unknown or within the budget. The settings that lower it
    (``fixes``: the problem's; the built-in problem's ``fused_readout``, ``seq_len``,
    ``batch`` by default) are worded by ``setting`` (name -> text).
    """
    floor = floor_of(fig)
    if floor is None or floor.bytes <= budget_bytes:
        return None
    args = ", ".join(f"{n} {format_bytes(b)}" for n, b in floor.argument_parts)
    made_of = (f"arguments {format_bytes(floor.argument_bytes)}"
               + (f" ({args})" if args else "")
               + f", outputs {format_bytes(floor.output_bytes)}"
               + (f" (aliased {format_bytes(floor.alias_bytes)})" if floor.alias_bytes else "")
               + f", per-step outputs stacked by the scan {format_bytes(floor.stacked_bytes)}")
    return (f"the budget {format_bytes(budget_bytes)} is under the {format_bytes(floor.bytes)} "
            f"({floor.bytes} bytes) that no schedule can remove: {made_of}. To lower it: "
            + "; ".join(fix_texts(fixes, setting, stacked=floor.stacked_bytes > 0)))


def fix_texts(fixes: FloorFixes, setting: Callable[[str], str], stacked: bool) -> list[str]:
    """The fixes in words: the readout inside the step (where the scan stacks outputs), a
    shorter sequence, a smaller batch, each with the problem's setting that does it."""
    texts = []
    if stacked and fixes.readout:
        texts.append("the readout inside the scanned step (autoremat.fuse_loss stacks "
                     "nothing, autoremat.fuse_head only its outputs; the built-in problem: "
                     f"{setting(fixes.readout)}; remat_scans and "
                     "Problem.from_loss move a readout and loss separable in time by "
                     "themselves, and remat_scans(...).describe(...) names what stopped them)")
    if fixes.sequence:
        texts.append(f"a shorter sequence (the built-in problem: {setting(fixes.sequence)})")
    if fixes.batch:
        texts.append(f"a smaller batch (the built-in problem: {setting(fixes.batch)})")
    return texts


def nothing_fits_message(result: TuneResult,
                         setting: Callable[[str], str] = seed_lstm_argument,
                         fixes: FloorFixes = SEED_FIXES) -> str:
    """One line: the budget, the least memory measured -- the least-memory schedule's
    compile before the search (``TuneResult.bound``) or the smallest trial -- and why: the
    floor no schedule removes when the budget is under it (what it is made of, how to
    lower it: ``floor_message``), or the memory outside the scans when that is most of it."""
    s = result.smallest_trial
    bound = result.bound
    budget = f"nothing fits in {format_bytes(result.budget_bytes)} ({result.budget_bytes} bytes)"
    outside = "" if bound is None else f"; {bound_text(bound)}"
    total = None if s is None else s.measurement.total_bytes
    if s is None or total is None:
        if bound is not None:
            return f"{budget}: {bound_text(bound)}"
        return (f"nothing fits in {format_bytes(result.budget_bytes)}: no schedule could be "
                "measured (see the trials' 'reason')")
    floor = floor_message(s.measurement, result.budget_bytes, setting, fixes)
    least = (f"; the least-memory schedule ({bound.least}) compiles to "
             f"{format_bytes(bound.least_bytes)}" if bound is not None
             and bound.least_bytes < total else "")
    return (
        f"{budget}: the smallest total measured is {format_bytes(total)} ({total} bytes), "
        f"trial {s.number}: {s.schedule.describe()}{least}{outside}"
        + (f"; {floor}" if floor and (bound is None or not bound.negligible) else "")
    )


def bound_text(bound: Bound) -> str:
    """What scheduling can save at most, in words (``autoremat._search.bound``)."""
    held = bound.step_bytes - bound.saving
    text = (f"scheduling can save at most {format_bytes(bound.saving)} "
            f"({100 * bound.share:.1f}%) of the step's {format_bytes(bound.step_bytes)}: "
            f"the least-memory schedule ({bound.least}) compiles to "
            f"{format_bytes(bound.least_bytes)}")
    if bound.negligible:
        text += (f": {format_bytes(held)} of the step lies outside what a schedule of its "
                 "scans changes (arguments, attention, MLP activations); a smaller batch, a "
                 "shorter sequence or jax.checkpoint around those layers lowers it")
    return text


def bound_line(bound: Bound, searching: bool, timed: int = 0) -> str:
    """The tune's line on the bound; ``searching``: no trial count was given, so a
    negligible bound stops the search (``tune``'s ``on_bound``) at the plain scan, or at
    the ``timed`` schedules measured while the bound compiled beside them."""
    line = f"bound: {bound_text(bound)} (two compiles, {bound.seconds:.1f} s)"
    if bound.negligible and searching:
        line += ("; only the plain scan is timed" if timed <= 1 else
                 f"; the search stops at the {timed} schedules timed while it compiled")
        line += " (--trials N searches anyway)"
    return line
