"""The record of one measurement: ``Measurement``, what ``autoremat._measure.measure`` returns.

Every figure is defined in ``autoremat._measure.measure`` (its module doc), which
makes them; this module only holds them, reads them back from a study's
trial attrs, and says whether they fit a budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Final, Literal

from autoremat._errors import TuneError
from autoremat._measure.failure import FailedAt

#: A measurement's outcome (``Measurement.status``; stored as this text).
Status = Literal["ok", "over_budget", "error"]
OK: Final[Status] = "ok"
OVER_BUDGET: Final[Status] = "over_budget"


#: The proof of fit's fields (``Measurement.fit_proof_bytes``, ``fit_proof_failed``).
PROOF_FIELDS: Final = ("fit_proof_bytes", "fit_proof_failed")


def proof_attrs(passed_bytes: int | None, failed: str = "") -> dict[str, Any]:
    """A proof of fit's outcome as attrs (``Measurement.proved`` reads them): it passed with
    ``passed_bytes`` on the device, or failed (``failed``: why)."""
    return dict(zip(PROOF_FIELDS, (passed_bytes, failed), strict=True))


def fit_figure(total_bytes: int | None, runtime_peak_bytes: int | None) -> tuple[int | None, str]:
    """The figure a fit is decided by, and its name (``bound``): the measured runtime peak
    where there is one, else the estimate (``Measurement.fit_bytes`` says why)."""
    if runtime_peak_bytes is not None:
        return runtime_peak_bytes, "runtime peak"
    return total_bytes, "estimate"
ERROR: Final[Status] = "error"


@dataclass(frozen=True)
class Measurement:
    """The measured figures of one schedule of one problem on one device.

    Attributes:
      schedule_key: ``Schedule.key()`` of what was measured.
      status: ``"ok"`` (compiled, fits, ran, finite), ``"over_budget"``
        (compiled, total over the budget, not run; or refused by the compiler for
        want of device memory, with the size it stated: ``compiler_bytes``) or ``"error"`` (build,
        compile or run failed, out of memory, or a non-finite loss).
      reason: why it is not ``ok`` (empty when it is), in words.
      failed_at: where it failed: ``"build"``, ``"compile"`` or ``"run"`` (``""``: it did
        not; ``autoremat._measure.failure``); the reason's words start with it.
      out_of_memory: it failed because the device ran out of memory (with
        ``compiler_bytes`` when the compiler stated its size).
      total_bytes: argument + output + temp - alias, in bytes (see module doc).
      temp_bytes, argument_bytes, output_bytes, alias_bytes: the parts.
      peak_bytes: device ``peak_bytes_in_use`` after running (GPU/TPU only): the
        process's high-water mark, so it includes earlier trials and compile scratch.
      runtime_peak_bytes: the step's own peak while it ran (GPU/TPU only): its
        arguments plus what its warm-up run raised the device's mark above what was
        live, isolated from earlier trials and from compiling
        (``autoremat._measure.device_memory``). ``None`` on a CPU, when the time is
        predicted from a short run (until confirmed at full length), or when it
        could not be isolated.
      compile_scratch_bytes: the transient device memory compiling the step took
        (XLA:GPU's autotuning), freed before it runs (GPU only; same method).
      fit_proof_bytes: the proof of fit passed: the step ran once with only this many
        bytes on the device -- its arguments live, the rest free, a filler holding all
        else (``within.runs_within``; ``tune`` proves its pick so, GPU/TPU).
      fit_proof_failed: why the proof of fit failed (``""``: it did not, or none ran);
        such a step does not fit, whatever its figures say.
      step_seconds: median wall seconds of one step (``None`` when not run).
      step_samples: every timed run, in seconds.
      compile_seconds: wall seconds of ``lower(...).compile()``.
      loss: the warm-up's scalar output when the step returns one.
      device_kind, platform, jax_version, flax_version: where it was measured.
      argument_parts: ``(name, bytes)`` per argument of the step
        (``Problem.arg_names``; default ``arg0``, ...).
      stacked_bytes: per-step outputs the step's autoremat scans stack
        (``None``: no autoremat scan); part of the floor no schedule removes.
      carry_bytes: those scans' carries (one each).
      cut_seconds: a cut trial's one (warm-up) run, in seconds: its timing
        stopped there as it was already clearly slower than the best that
        fits (``step_seconds`` is then ``None``; ``time_compiled``).
      devices, mesh: how many devices the step's arguments span and their mesh
        (``data=4``; ``""``: none). Every byte figure is per device
        (``argument_parts`` too); ``peak_bytes`` is the largest device's.
      argument_sharding: ``(name, "replicated" | "sharded" | "partly sharded")``
        per argument on many devices (empty on one).
      timed_seq_len: the ``T`` the step was timed at (``None``: not timed).
        Below the problem's ``seq_len`` the run was short
        (``autoremat._search.short_runs``): ``step_samples`` are that run's, and
        ``step_seconds`` (or ``cut_seconds``) is the full-length time predicted
        from it -- bytes are always the full-length compile's.
      short_seq_len, short_seconds: the short run's ``T'`` and median (or cut)
        seconds, when there was one (kept once confirmed at full length).
      extrapolated_seconds: what the short run predicted, once the schedule was
        also timed at full length (``autoremat._search.confirm``; ``step_seconds`` is then
        measured at ``seq_len``).
    """

    schedule_key: str
    status: Status
    reason: str = ""
    total_bytes: int | None = None
    temp_bytes: int | None = None
    argument_bytes: int | None = None
    output_bytes: int | None = None
    alias_bytes: int | None = None
    peak_bytes: int | None = None
    step_seconds: float | None = None
    step_samples: tuple[float, ...] = field(default_factory=tuple)
    compile_seconds: float | None = None
    loss: float | None = None
    device_kind: str = ""
    platform: str = ""
    jax_version: str = ""
    flax_version: str = ""
    argument_parts: tuple[tuple[str, int], ...] = ()
    stacked_bytes: int | None = None
    carry_bytes: int | None = None
    cut_seconds: float | None = None
    devices: int = 1
    mesh: str = ""
    argument_sharding: tuple[tuple[str, str], ...] = ()
    timed_seq_len: int | None = None
    short_seq_len: int | None = None
    short_seconds: float | None = None
    extrapolated_seconds: float | None = None
    runtime_peak_bytes: int | None = None
    compile_scratch_bytes: int | None = None
    fit_proof_bytes: int | None = None
    fit_proof_failed: str = ""
    compiler_bytes: int | None = None
    failed_at: FailedAt = ""
    out_of_memory: bool = False

    @property
    def cut(self) -> bool:
        """Timing stopped after one run (``cut_seconds``): slower than the best that fits."""
        return self.cut_seconds is not None

    @property
    def feasible(self) -> bool:
        """Compiled, within the budget, ran, and produced finite outputs."""
        return self.status == OK

    def to_attrs(self) -> dict[str, Any]:
        """A JSON-safe mapping (Optuna user attrs), with ``feasible`` added."""
        data = asdict(self)
        data["step_samples"] = list(self.step_samples)
        data["argument_parts"] = [[name, size] for name, size in self.argument_parts]
        data["argument_sharding"] = [[name, how] for name, how in self.argument_sharding]
        data["feasible"] = self.feasible
        return data

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> Measurement:
        """The measurement ``to_attrs`` stored (Optuna user attrs); other keys are ignored.

        Raises:
          TuneError: ``schedule_key`` or ``status`` is missing (not a measurement).
        """
        for key in ("schedule_key", "status"):
            if key not in attrs:
                raise TuneError(f"trial attrs: no {key!r}, so no measurement to read")
        data = {f.name: attrs[f.name] for f in fields(cls) if f.name in attrs}
        data["step_samples"] = tuple(data.get("step_samples") or ())
        data["argument_parts"] = tuple((str(n), int(b)) for n, b in data.get("argument_parts") or ())
        data["argument_sharding"] = tuple((str(n), str(h))
                                          for n, h in data.get("argument_sharding") or ())
        return cls(**data)

    def proved(self, attrs: Mapping[str, Any]) -> Measurement:
        """This measurement with a proof of fit's outcome (``proof_attrs``; a key left out
        is no outcome)."""
        passed, failed = (attrs.get(k) for k in PROOF_FIELDS)
        return replace(self, fit_proof_bytes=passed, fit_proof_failed=str(failed or ""))

    def predicted(self, seq_len: int) -> bool:
        """The step time is predicted from a run shorter than ``seq_len``, not measured."""
        return self.timed_seq_len is not None and self.timed_seq_len < seq_len

    @property
    def size_bytes(self) -> int | None:
        """The schedule's memory: ``fit_bytes``, else the size the compiler stated when
        it ran out of memory (``compiler_bytes``; a lower bound of the total)."""
        fit = self.fit_bytes
        return fit if fit is not None else self.compiler_bytes

    @property
    def fit_bytes(self) -> int | None:
        """The figure the budget is checked against: the measured ``runtime_peak_bytes``
        where there is one (a platform whose method was checked against the truth,
        ``device_memory.VALIDATED``: never under it), else the estimate
        (``total_bytes``; on a CPU, or where the run could not be isolated). The
        estimate is no bound either way on a TPU: 5.5% under the truth for one step, 33%
        over it for another (a layer stack: 20.9 GB estimated, 16.5 GB measured, and it
        ran on a 16.9 GB chip), so where a run was measured the estimate does not
        decide."""
        return fit_figure(self.total_bytes, self.runtime_peak_bytes)[0]

    @property
    def bound(self) -> str:
        """Which figure decides the fit: ``"runtime peak"`` (measured) or
        ``"estimate"``."""
        return fit_figure(self.total_bytes, self.runtime_peak_bytes)[1]

    def fits(self, budget_bytes: int) -> bool:
        """Ran (timed), ``fit_bytes <= budget_bytes`` (the measured runtime peak where
        there is one, else the estimate), and no failed proof of fit: the one test of
        "fits the budget"."""
        fit = self.fit_bytes
        return (self.feasible and self.step_seconds is not None and not self.fit_proof_failed
                and fit is not None and fit <= budget_bytes)

