"""The text ``autoremat export`` prints or writes for MaxText and Flax, and its one line
when the format cannot write a trial (``autoremat._search.export_forms`` finds it all)."""

from __future__ import annotations

from typing import Final

from autoremat._schedules import maxtext_names
from autoremat._schedules.frameworks import DEVICE, OFFLOAD, REMAT
from autoremat._search.export_forms import Figures, FrameworkExport
from autoremat._units import format_bytes, format_seconds

#: Each format's name in a sentence.
FORMAT_NAMES: Final = {"maxtext": "MaxText's remat_policy: custom",
                       "flax": "Flax's nn.remat / nnx.remat", "yaml": "a schedule file"}
_MEANS: Final = {DEVICE: "saved", OFFLOAD: "moved to host memory", REMAT: "recomputed"}


def export_text(found: FrameworkExport, study_name: str = "") -> str:
    """The MaxText block or the Flax lines of an export the format can write."""
    head = _header(found, study_name)
    if found.format == "maxtext":
        return "\n".join([*head, *maxtext_lines(found)]) + "\n"
    return "\n".join([*head, *flax_lines(found)]) + "\n"


def maxtext_lines(found: FrameworkExport) -> list[str]:
    """MaxText's config keys (base.yml) for the trial's policy."""
    form = found.form
    lines = ["# MaxText config keys (configs/base.yml): device = saved, offload = moved to "
             "host memory, remat = recomputed", "remat_policy: custom"]
    lines += [f"{name}: {value}" for name, value in form.maxtext]
    if not form.maxtext:
        lines.append("# (the problem tags none of the names MaxText reads: they keep "
                     "base.yml's defaults)")
    if form.maxtext_preset == "full":
        lines.append("# or MaxText's remat_policy: full, this schedule exactly (it recomputes "
                     "decoder_layer_input too)")
    elif form.maxtext_preset:
        lines.append(f"# the same as MaxText's remat_policy: {form.maxtext_preset} over "
                     "these names")
    lines += [f"# note: {note}" for note in form.notes]
    if any(n == maxtext_names.FLASH_RESIDUAL for n, _ in form.maxtext):
        lines.append(f"# note: {maxtext_names.FLASH_RESIDUAL} tags MaxText's flash kernels' "
                     "saved residuals (attention: flash); on the dot-product path the "
                     "attention's output is attention_out")
    if form.unknown:
        lines.append(f"# names MaxText's custom policy does not read (MaxText "
                     f"{maxtext_names.VERSION}; it recomputes them): "
                     + ", ".join(f"{n} (the schedule: {_MEANS[v]})" for n, v in form.unknown))
    if form.unroll > 1:
        lines.append(f"# the schedule ran the layer scan with unroll={form.unroll}; MaxText's "
                     "scan_layers does not unroll, so its step time may differ")
    return lines


def flax_lines(found: FrameworkExport) -> list[str]:
    """Flax's remat of each scanned step under the trial's policy, linen and NNX: each
    block of a layer stack, or the cell a recurrence runs at each time step."""
    form = found.form
    unroll = (f"# and scan with unroll={form.unroll}: nn.scan(..., unroll={form.unroll}) / "
              f"nnx.scan(..., unroll={form.unroll})" if form.unroll > 1 else "")
    fuse = [] if found.schedule.fuse is not True else [
        "# fuse: true -- measured with the readout and loss inside the scanned step, so "
        "nothing T-long is stacked: move them there (autoremat.fuse_loss / fuse_head; "
        "autoremat.remat_scans does it), or the stack of outputs adds to every figure"]
    if found.recurrence:
        steps = f"{found.seq_len:,} time steps" if found.seq_len else "its time steps"
        head = [f"# a recurrence over {steps}: remat the cell each time step runs"]
        if not form.flax_policy:
            return [*head, "# no remat: scan the cell as it is, with no nn.remat / nnx.remat",
                    *([unroll] if unroll else []), *fuse]
        return [
            *head, *_IMPORTS, f"policy = {form.flax_policy}",
            "# Flax linen: remat the cell, then scan it over time as before "
            "(nn.scan(RematCell, ...) or nn.RNN(RematCell(...)))",
            "RematCell = nn.remat(Cell, prevent_cse=False, policy=policy)",
            "# Flax NNX: remat the cell's call inside nnx.scan over the time steps",
            "cell_step = nnx.remat(cell_step, prevent_cse=False, policy=policy)",
            *([unroll] if unroll else []), *fuse,
        ]
    if not form.flax_policy:
        return ["# no remat: scan Block as it is, with no nn.remat / nnx.remat",
                *([unroll] if unroll else []), *fuse]
    return [
        *_IMPORTS, f"policy = {form.flax_policy}",
        "# Flax linen: remat each block, then scan it as before (nn.scan(RematBlock, ...))",
        "RematBlock = nn.remat(Block, prevent_cse=False, policy=policy)",
        "# Flax NNX: remat the block's call inside nnx.scan",
        "forward = nnx.remat(forward, prevent_cse=False, policy=policy)",
        *([unroll] if unroll else []), *fuse,
    ]


#: What the Flax lines use.
_IMPORTS: Final = ("import jax", "import flax.linen as nn", "from flax import nnx")


def cannot_line(found: FrameworkExport, searched: bool = True) -> str:
    """One line: the format cannot write this trial, why, and the nearest measured trial
    it can write, with its figures; ``searched``: a study was looked in for one."""
    who = f"trial {found.figures.number}" if found.figures.number is not None \
        else "the schedule"
    line = (f"{who} ({found.figures.schedule}) has no form in {FORMAT_NAMES[found.format]}: "
            f"{found.form.why_not or found.form.maxtext_why_not}")
    if found.recurrence and found.format == "maxtext":
        steps = f"{found.seq_len:,} time steps" if found.seq_len else "time steps"
        return (f"{who} ({found.figures.schedule}) has no form in {FORMAT_NAMES['maxtext']}: "
                f"the study's scan is a recurrence over {steps}, and MaxText's keys name the "
                "values of a decoder layer in a stack of layers, so none of its terms apply; "
                "export --format flax (remat of the cell at each time step) or --format yaml "
                "(autoremat.scan runs it)")
    near = found.nearest
    if near is None:
        return (f"{line}; the study measured no schedule it can write" if searched else
                f"{line}; no study to look for the nearest in (give --study-name)")
    f = near.figures
    ratio = (f" ({f.step_seconds / found.figures.step_seconds:.2f}x {who}'s)"
             if f.step_seconds and found.figures.step_seconds else "")
    where = (f"within the budget {format_bytes(near.budget_bytes)}" if f.fits else
             f"over the budget {format_bytes(near.budget_bytes)}: none it can write fits")
    return (f"{line}; the nearest it can write: trial {f.number}, {f.schedule}, "
            f"{memory(f)}, step {format_seconds(f.step_seconds)}{ratio}, {where} "
            f"(autoremat export {f.number} --format {found.format}, or add --nearest)")


def memory(f: Figures) -> str:
    """``total X`` and, where a runtime peak decided the fit, ``measured peak Y``."""
    text = f"total {format_bytes(f.total_bytes)}"
    if f.fit_bytes is not None and f.fit_bytes != f.total_bytes:
        text += f", measured peak {format_bytes(f.fit_bytes)}"
    return text


def _header(found: FrameworkExport, study_name: str) -> list[str]:
    f = found.figures
    who = (f"trial {f.number}" + (f" of study {study_name!r}" if study_name else "")
           if f.number is not None else "schedule")
    budget = (f", budget {format_bytes(found.budget_bytes)}"
              if found.budget_bytes is not None else "")
    measured = (f"#   measured: {memory(f)}, step {format_seconds(f.step_seconds)}{budget}"
                if f.total_bytes is not None or f.step_seconds is not None
                else "#   not measured (no tune's meta in the file)")
    return [f"# autoremat: {who}: {f.schedule}", measured]
