"""Is a saved schedule still the one for this problem? Stale-schedule warnings.

A tuned schedule is a measurement of one step (argument shapes and dtypes) on
one device kind and mesh. ``load_schedule(path, problem=...)`` loads it and
warns with a ``StaleScheduleWarning`` when the problem's argument fingerprint,
name, sequence length or mesh (its per-device figures hold on that mesh only),
or the current device kind, differ from what ``meta`` records. The schedule
still runs -- any schedule is correct for any ``T`` -- but its memory and time
figures may no longer hold.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Final

from autoremat._measure.device import arguments_fingerprint, environment
from autoremat._measure.mesh import layout
from autoremat._measure.problem import Problem
from autoremat._schedules import read_schedule
from autoremat._schedules.base import Schedule

#: What a tuned schedule's ``meta`` says it was tuned for and where it came from
#: (``autoremat._search.study.trial_schedule`` writes them, this module reads them
#: first; the measured figures come with them: ``autoremat._measure.breakdown.KEYS``
#: and the step and compile times).
TUNED_FOR: Final = ("problem", "seq_len", "layer_stack", "fingerprint", "device_kind", "platform",
                    "jax_version", "flax_version", "budget_bytes", "study_name", "trial",
                    "storage", "date")
#: The timing figures a tuned schedule's ``meta`` records.
TIMING: Final = ("step_seconds", "compile_seconds", "timed_seq_len", "extrapolated_seconds")


class StaleScheduleWarning(UserWarning):
    """The schedule was tuned for other shapes, another problem or device."""


def schedule_mismatches(
    schedule: Schedule, problem: Problem | None = None, *, device_kind: str | None = None
) -> list[str]:
    """What differs between the schedule's ``meta`` and this problem/device.

    Args:
      schedule: a schedule, usually loaded from a file written by ``tune``.
      problem: when given, its name, ``seq_len``, argument fingerprint and
        mesh (``mesh_mismatches``) are compared (``problem.build(schedule)`` is called to get the arguments;
        nothing is compiled).
      device_kind: the device to compare with; default: jax's default device.

    Returns:
      One sentence per mismatch; empty when everything recorded matches (a
      schedule without ``meta`` has nothing to compare and matches).
    """
    meta = dict(schedule.meta)
    out: list[str] = []
    if problem is not None:
        needs_args = "fingerprint" in meta or "devices" in meta
        args = problem.build(schedule)[1] if needs_args else ()
        if "devices" in meta:
            out += mesh_mismatches(schedule, *layout(args), "this problem runs on")
        if "fingerprint" in meta:
            now = arguments_fingerprint(args)
            if now != meta["fingerprint"]:
                out.append(
                    f"tuned for other argument shapes/dtypes (fingerprint "
                    f"{meta['fingerprint']}, this problem has {now})"
                )
        if "seq_len" in meta and meta["seq_len"] != problem.seq_len:
            out.append(f"tuned for seq_len {meta['seq_len']}, this problem has {problem.seq_len}")
        if "problem" in meta and meta["problem"] != problem.name:
            out.append(f"tuned for problem {meta['problem']!r}, this is {problem.name!r}")
    if "device_kind" in meta:
        kind = device_kind if device_kind is not None else environment()["device_kind"]
        if meta["device_kind"] != kind:
            out.append(f"tuned on device {meta['device_kind']!r}, running on {kind!r}")
    return out


def mesh_mismatches(schedule: Schedule, devices: int | None = None, mesh: str = "",
                    where: str = "this run has") -> list[str]:
    """The mesh the schedule was tuned on (``meta`` ``devices``/``mesh``), if not this one.

    ``devices``/``mesh``: what it runs on now; default: every device of this
    process, no mesh -- then only the device count is compared (a problem, not
    the process, decides the mesh). Empty when ``meta`` records no devices.
    """
    meta = dict(schedule.meta)
    if "devices" not in meta:
        return []
    tuned = (int(meta["devices"]), str(meta.get("mesh") or ""))
    if devices is None:
        import jax

        now = (jax.device_count(), "")
        same = now[0] == tuned[0]
    else:
        now = (devices, mesh)
        same = now == tuned
    if same:
        return []

    def on(n: int, m: str) -> str:
        return f"{n} device{'s' if n != 1 else ''}" + (f", mesh {m}" if m else " (no mesh)")

    return [f"tuned per device on {on(*tuned)}, {where} {on(*now)}"]


def load_schedule(
    path: str | os.PathLike[str], problem: Problem | None = None, **kwargs: Any
) -> Schedule:
    """Load a schedule file; with ``problem``, warn if it was tuned for another.

    Reads and checks the YAML (``ScheduleError`` naming the field) and, when ``problem`` is
    given, a ``StaleScheduleWarning`` naming each mismatch found by
    ``schedule_mismatches`` (argument shapes/dtypes, problem, sequence length,
    device kind). ``kwargs`` go to ``schedule_mismatches``.

    Raises:
      ScheduleError: the file is missing or not a valid schedule.
    """
    schedule = read_schedule(path)
    if problem is not None:
        problems = schedule_mismatches(schedule, problem, **kwargs)
        if problems:
            warnings.warn(
                f"{path}: schedule may be stale: " + "; ".join(problems)
                + " -- it still runs, but re-tune (autoremat tune) for its figures to hold",
                StaleScheduleWarning,
                stacklevel=2,
            )
    return schedule
