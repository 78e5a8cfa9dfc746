"""Does a scan run the program its schedule was tuned with? Checked at trace time.

A tuned schedule's ``meta`` records what the measured program held (``total_bytes``,
``stacked_bytes``: what its scans stacked, ``budget_bytes``, ``seq_len``, ``devices``).
A scan runs the schedule's levels and policies, but two things the tuner measured are
not the scan's to apply:

* **where the readout runs.** A schedule tuned with the readout and loss inside the
  scanned step (``fuse: true``, or a problem fused by hand) stacks no ``(T, B, H)``
  outputs; the same schedule under a scan whose step returns its hidden state stacks
  them, and their cotangents in the backward pass: on the built-in LSTM at T=10^4 on a
  CPU that is about 100 MB more than the 25 MB the tune measured. Every outermost scan
  compares what it stacks per step with what the tuned program stacked, and says so where
  the difference is more than ``TOLERANCE`` of the tuned total: an error where even the
  stacked outputs alone (a lower bound: their cotangents come on top) break the
  schedule's budget, a ``ScheduleMismatchWarning`` otherwise. On a TPU (``meta``'s
  ``platform``) the message says that its compiler can keep stacked outputs in on-chip
  memory, outside the device memory the budget counts (``autoremat._measure.breakdown``),
  so a compile tells what they add; it still refuses, since it did not for every
  schedule: the built-in LSTM's fused ``100x100`` pick run unfused compiled to 101 MB
  where the tune measured 16.6 MB, its unfused ``125x80`` pick to 16.6 MB
  (``studies/results/deploy_parity.md``). Applied by
  ``remat_scans(loss, schedule)`` (it moves the readout into the step), by the readout
  moved into the step by hand (``autoremat.fuse_head`` / ``fuse_loss``), or accepted
  with ``schedule.with_meta(budget_bytes=None)`` (then warned, not refused).
* **compiler options.** ``compiler_options`` configure the compile of the whole jitted
  step, which a scan does not own: warned once per schedule, naming the call that
  applies them (``jax.jit(step, compiler_options=dict(schedule.compiler_options))``).

The measurement stage applies both itself, so it is not warned of the options.
"""

from __future__ import annotations

import contextvars
import warnings
from dataclasses import dataclass
from typing import Final

from autoremat._errors import ScheduleError
from autoremat._schedules.base import Schedule
from autoremat._units import format_bytes

#: What a scan may stack beyond the tuned program, as a share of its tuned total, before
#: it is said: the adoption paths compile within 2% of the tuned figure.
TOLERANCE: Final = 0.02


class ScheduleMismatchWarning(UserWarning):
    """A scan runs a tuned schedule in a program that differs from the one measured (its
    stacked outputs, its compiler options); the message names both figures and the fix."""


class ScheduleMismatchError(ScheduleError):
    """A scan would run a tuned schedule in a program that breaks the schedule's budget
    (``ScheduleMismatchWarning``'s difference, over ``meta['budget_bytes']``)."""


#: Schedules (by key) whose compiler options were warned of in this process.
_OPTIONS_WARNED: set[str] = set()
#: True while an outermost scan traces its step: scans inside it are part of its step.
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("autoremat_inside_scan",
                                                               default=False)


@dataclass(frozen=True)
class StackedDifference:
    """What a scan stacks beyond its tuned program (``stacked_difference``).

    Attributes:
      extra_bytes: the stacked outputs beyond the tuned program's, per device, at this
        scan's length (a lower bound on the memory it adds: the backward pass holds their
        cotangents too, up to twice this).
      tuned_total: the tuned program's total (``meta['total_bytes']``).
      budget: the schedule's budget (``meta['budget_bytes']``), or ``None``.
      fused: the schedule was tuned with the readout inside the step (``fuse: true``).
      on_chip_maybe: tuned where the compiler may keep stacked outputs on chip (a TPU):
        the bytes they add are known only from a compile (the message says so).
    """

    extra_bytes: int
    tuned_total: int
    budget: int | None
    fused: bool
    on_chip_maybe: bool = False

    @property
    def breaks_budget(self) -> bool:
        """Even the extra stacked outputs alone take the step over the budget (and they are
        in the memory the budget counts)."""
        return self.budget is not None and self.tuned_total + self.extra_bytes > self.budget

    def message(self, schedule: Schedule) -> str:
        where = ("tuned with the readout and loss inside the scanned step (fuse: true)"
                 if self.fused else "tuned with smaller per-step outputs")
        budget = ("" if self.budget is None else
                  f", {'over' if self.breaks_budget else 'within'} its budget "
                  f"{format_bytes(self.budget)}")
        accept = (" To run it anyway: schedule.with_meta(budget_bytes=None) (or delete "
                  "budget_bytes from the file's meta)." if self.breaks_budget else "")
        chip = ("; a TPU can keep them on chip, so a compile tells (e.g. the show command "
                "given the problem)" if self.on_chip_maybe else "")
        needs = (f"the step needs about {format_bytes(self.tuned_total + self.extra_bytes)} to "
                 f"{format_bytes(self.tuned_total + 2 * self.extra_bytes)} (with their "
                 f"cotangents{chip}){budget}")
        return (f"schedule {schedule.describe()}: {where}, total "
                f"{format_bytes(self.tuned_total)}; this scan stacks "
                f"{format_bytes(self.extra_bytes)} more per-step outputs, so {needs}. "
                "Run what was measured: wrap the loss, "
                "autoremat.remat_scans(loss, schedule), which moves a per-step readout and "
                "loss into the step, or call them inside the step yourself "
                "(autoremat.fuse_head / fuse_loss)." + accept)


def stacked_difference(schedule: Schedule, stacked_bytes: int,
                       steps: int) -> StackedDifference | None:
    """How much more than the tuned program a scan of ``steps`` steps stacking
    ``stacked_bytes`` (its outputs' global bytes) holds, where ``meta`` says and the
    difference is over ``TOLERANCE`` of the tuned total; ``None`` otherwise.

    Compared per step and per device (the tuned figures are per device: the stack is
    taken as split evenly over ``meta['devices']``), so a schedule used at another length
    is held to the same per-step outputs.
    """
    meta = schedule.meta
    tuned_stack, seq_len, total = (meta.get(k) for k in ("stacked_bytes", "seq_len",
                                                          "total_bytes"))
    if not (isinstance(tuned_stack, int) and isinstance(seq_len, int)
            and isinstance(total, int)) or min(tuned_stack, seq_len, total) < 0:
        return None  # not written by the tuner: nothing to hold it to
    if not seq_len or not steps:
        return None
    devices = meta.get("devices")
    devices = devices if isinstance(devices, int) and devices > 0 else 1
    extra = int(stacked_bytes / devices - tuned_stack / seq_len * steps)
    if extra <= TOLERANCE * total:
        return None
    budget = meta.get("budget_bytes")
    return StackedDifference(extra, total, budget if isinstance(budget, int) else None,
                             schedule.fuse is True, meta.get("platform") == "tpu")


def check_stacked(schedule: Schedule, stacked_bytes: int, steps: int) -> None:
    """Raise or warn (module doc) where a scan of ``steps`` steps stacking ``stacked_bytes``
    holds more than its tuned program."""
    difference = stacked_difference(schedule, stacked_bytes, steps)
    if difference is None:
        return
    if difference.breaks_budget:
        raise ScheduleMismatchError(difference.message(schedule))
    warnings.warn(difference.message(schedule), ScheduleMismatchWarning, stacklevel=4)


def warn_options(schedule: Schedule) -> None:
    """Warn once per schedule that a scan cannot apply its ``compiler_options``."""
    if not schedule.compiler_options or schedule.key() in _OPTIONS_WARNED:
        return
    _OPTIONS_WARNED.add(schedule.key())
    options = ", ".join(f"{k}={v!r}" for k, v in schedule.compiler_options.items())
    warnings.warn(
        f"schedule {schedule.describe()}: tuned with compiler_options {{{options}}}, which "
        "configure the compile of the whole jitted step; a scan cannot apply them. Compile "
        "your step with them as the tuner did: jax.jit(step, "
        "compiler_options=dict(schedule.compiler_options)).", ScheduleMismatchWarning,
        stacklevel=4)


def inside_scan() -> contextvars.Token[bool] | None:
    """Mark an outermost scan's trace (``None``: already inside one, nothing to check)."""
    return None if _INSIDE.get() else _INSIDE.set(True)


def left_scan(token: contextvars.Token[bool]) -> None:
    _INSIDE.reset(token)
