"""A schedule as ``autoremat show`` prints it: its levels, what it was tuned for, and what
its ``meta`` records (the measured figures and the memory breakdown)."""

from __future__ import annotations

from autoremat._cli.breakdown_text import breakdown_lines
from autoremat._measure.breakdown import DEVICE_KEYS, KEYS
from autoremat._measure.mesh import device_note
from autoremat._measure.stale import TIMING, TUNED_FOR
from autoremat._schedules.base import Schedule
from autoremat._units import format_bytes, format_seconds


def describe_schedule(schedule: Schedule) -> str:
    """A human summary: levels, policies, and what ``meta`` records."""
    lines = [f"schedule: {schedule.describe()}", *schedule.explain()]
    meta = dict(schedule.meta)
    if not meta:
        lines.append("  meta: none (not written by autoremat tune)")
        return "\n".join(lines)
    lines.append(f"tuned for: {meta.get('problem')} (seq_len {meta.get('seq_len')}, "
                 f"fingerprint {meta.get('fingerprint')})")
    if isinstance(meta.get("layer_stack"), bool):
        lines.append("  a scan over layers (a layer stack)" if meta["layer_stack"] else
                     "  a recurrence over time steps (not a layer stack: no MaxText form)")
    lines.append(f"  on {meta.get('device_kind')} ({meta.get('platform')}), jax "
                 f"{meta.get('jax_version')}, flax {meta.get('flax_version')}")
    if "devices" in meta:
        lines.append(f"  figures {device_note(int(meta['devices']), str(meta.get('mesh') or ''))}")
    lines.append(f"  budget {format_bytes(meta.get('budget_bytes'))}; study "
                 f"{meta.get('study_name')!r} trial {meta.get('trial')} in {meta.get('storage')}"
                 f"; {meta.get('date')}")
    lines.append(f"measured: total {format_bytes(meta.get('total_bytes'))}, temp "
                 f"{format_bytes(meta.get('temp_bytes'))}, step "
                 f"{format_seconds(meta.get('step_seconds'))}, compile "
                 f"{format_seconds(meta.get('compile_seconds'))}")
    timed, seq_len = meta.get("timed_seq_len"), meta.get("seq_len")
    if isinstance(timed, int) and isinstance(seq_len, int) and timed < seq_len:
        lines.append(f"  step time predicted from a run of T'={timed} steps, not measured "
                     f"at T={seq_len}")
    elif meta.get("extrapolated_seconds") is not None:
        lines.append(f"  step time measured at T={seq_len}; short runs had predicted "
                     f"{format_seconds(meta['extrapolated_seconds'])}")
    lines += breakdown_lines(meta)
    if meta.get("fuse_why"):  # fusing the readout was a choice of the search
        lines.append(f"  fuse: {meta['fuse_why']}")
    known = {*TUNED_FOR, *TIMING, *KEYS, *DEVICE_KEYS, "fuse_why"}
    extra = {k: v for k, v in meta.items() if k not in known}
    if extra:
        lines.append(f"other meta: {extra}")
    return "\n".join(lines)
