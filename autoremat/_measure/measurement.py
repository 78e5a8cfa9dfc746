"""The record of one measurement: ``Measurement``, what ``autoremat._measure.measure`` returns.

Every figure is defined in ``autoremat._measure.measure`` (its module doc), which
makes them; this module only holds them (in the records of ``autoremat._measure.figures``),
reads them back from a study's trial attrs, and says whether they fit a budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final, Generic, Literal, TypeVar, overload

from autoremat._errors import TuneError
from autoremat._measure.failure import FailedAt
from autoremat._measure.figures import (
    OWNER,
    RECORDS,
    DevicePeaks,
    Failure,
    Named,
    Pairs,
    Proof,
    Sizes,
    Timing,
    Where,
    from_attrs,
    to_attrs,
)

V = TypeVar("V")

#: A measurement's outcome (``Measurement.status``; stored as this text).
Status = Literal["ok", "over_budget", "error"]
OK: Final[Status] = "ok"
OVER_BUDGET: Final[Status] = "over_budget"
ERROR: Final[Status] = "error"


def figure_names(*names: str) -> tuple[str, ...]:
    """``names``, each a ``Measurement`` figure's attr name (or ``schedule_key``,
    ``status``, ``reason``): a list of them kept as text fails on a typo when made."""
    unknown = [n for n in names if n not in OWNER and n not in ("schedule_key", "status",
                                                                "reason")]
    if unknown:
        raise TypeError(f"no Measurement figure named {', '.join(map(repr, unknown))}")
    return names


#: The proof of fit's fields (``Measurement.fit_proof_bytes``, ``fit_proof_failed``).
PROOF_FIELDS: Final = tuple(to_attrs(Proof()))


def proof_attrs(passed_bytes: int | None, failed: str = "") -> dict[str, Any]:
    """A proof of fit's outcome as attrs (``Measurement.proved`` reads them): it passed with
    ``passed_bytes`` on the device, or failed (``failed``: why)."""
    return to_attrs(Proof(passed_bytes, failed))


def fit_figure(total_bytes: int | None, runtime_peak_bytes: int | None) -> tuple[int | None, str]:
    """The figure a fit is decided by, and its name (``bound``): the measured runtime peak
    where there is one, else the estimate (``Measurement.fit_bytes`` says why)."""
    if runtime_peak_bytes is not None:
        return runtime_peak_bytes, "runtime peak"
    return total_bytes, "estimate"


class _Figure(Generic[V]):
    """A figure read by its flat name from the record that holds it
    (``Measurement.total_bytes`` is ``Measurement.sizes.total_bytes``); a name that is
    not a field of that record fails when the class is made."""

    def __init__(self, record: str) -> None:
        self.record, self.name = record, ""

    def __set_name__(self, owner: type, name: str) -> None:
        if OWNER.get(name) != self.record:
            raise TypeError(f"{owner.__name__}.{name}: not a field of {self.record!r}")
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> _Figure[V]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> V: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.record), self.name)


@dataclass(frozen=True, init=False)
class Measurement:
    """The measured figures of one schedule of one problem on one device.

    Its outcome (``schedule_key``, ``status``, ``reason``) and six records: ``sizes``
    (total, temp, argument, output, alias bytes, argument parts, stacked, carry),
    ``peaks`` (peak, runtime peak, compile scratch), ``timing`` (step and compile seconds,
    samples, loss, cut, the lengths of short runs), ``where`` (device, platform, versions,
    devices, mesh, sharding), ``failure`` (failed at, out of memory, compiler bytes) and
    ``proof`` (the proof of fit). Each figure reads by its flat name too
    (``m.total_bytes`` is ``m.sizes.total_bytes``), is given by it to the constructor, and
    is stored under it in a study (``to_attrs``, ``from_attrs``).

    Attributes:
      schedule_key: ``Schedule.key()`` of what was measured.
      status: ``"ok"`` (compiled, fits, ran, finite), ``"over_budget"``
        (compiled, total over the budget, not run; or refused by the compiler for
        want of device memory, with the size it stated: ``compiler_bytes``) or ``"error"`` (build,
        compile or run failed, out of memory, or a non-finite loss).
      reason: why it is not ``ok`` (empty when it is), in words.
      failed_at: where it failed: ``"build"``, ``"compile"`` or ``"run"`` (``""``: it did
        not); the reason's words start with it.
      out_of_memory: it failed because the device ran out of memory (with
        ``compiler_bytes`` when the compiler stated its size).
      total_bytes: argument + output + temp - alias, in bytes (see module doc).
      temp_bytes, argument_bytes, output_bytes, alias_bytes: the parts.
      peak_bytes: device ``peak_bytes_in_use`` after running (GPU/TPU only): the
        process's high-water mark, so it includes earlier trials and compile scratch.
      runtime_peak_bytes: the step's own peak while it ran (GPU/TPU only): its
        arguments plus what its warm-up run raised the device's mark above what was
        live, isolated from earlier trials and from compiling. ``None`` on a CPU, when the time is
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
        Below the problem's ``seq_len`` the run was short: ``step_samples`` are that run's, and
        ``step_seconds`` (or ``cut_seconds``) is the full-length time predicted
        from it -- bytes are always the full-length compile's.
      short_seq_len, short_seconds: the short run's ``T'`` and median (or cut)
        seconds, when there was one (kept once confirmed at full length).
      extrapolated_seconds: what the short run predicted, once the schedule was
        also timed at full length (``step_seconds`` is then measured at ``seq_len``).
    """

    schedule_key: str
    status: Status
    reason: str = ""
    sizes: Sizes = field(default_factory=Sizes)
    peaks: DevicePeaks = field(default_factory=DevicePeaks)
    timing: Timing = field(default_factory=Timing)
    where: Where = field(default_factory=Where)
    failure: Failure = field(default_factory=Failure)
    proof: Proof = field(default_factory=Proof)

    total_bytes: ClassVar[_Figure[int | None]] = _Figure("sizes")
    temp_bytes: ClassVar[_Figure[int | None]] = _Figure("sizes")
    argument_bytes: ClassVar[_Figure[int | None]] = _Figure("sizes")
    output_bytes: ClassVar[_Figure[int | None]] = _Figure("sizes")
    alias_bytes: ClassVar[_Figure[int | None]] = _Figure("sizes")
    argument_parts: ClassVar[_Figure[Pairs]] = _Figure("sizes")
    stacked_bytes: ClassVar[_Figure[int | None]] = _Figure("sizes")
    carry_bytes: ClassVar[_Figure[int | None]] = _Figure("sizes")
    peak_bytes: ClassVar[_Figure[int | None]] = _Figure("peaks")
    runtime_peak_bytes: ClassVar[_Figure[int | None]] = _Figure("peaks")
    compile_scratch_bytes: ClassVar[_Figure[int | None]] = _Figure("peaks")
    step_seconds: ClassVar[_Figure[float | None]] = _Figure("timing")
    step_samples: ClassVar[_Figure[tuple[float, ...]]] = _Figure("timing")
    compile_seconds: ClassVar[_Figure[float | None]] = _Figure("timing")
    loss: ClassVar[_Figure[float | None]] = _Figure("timing")
    cut_seconds: ClassVar[_Figure[float | None]] = _Figure("timing")
    timed_seq_len: ClassVar[_Figure[int | None]] = _Figure("timing")
    short_seq_len: ClassVar[_Figure[int | None]] = _Figure("timing")
    short_seconds: ClassVar[_Figure[float | None]] = _Figure("timing")
    extrapolated_seconds: ClassVar[_Figure[float | None]] = _Figure("timing")
    device_kind: ClassVar[_Figure[str]] = _Figure("where")
    platform: ClassVar[_Figure[str]] = _Figure("where")
    jax_version: ClassVar[_Figure[str]] = _Figure("where")
    flax_version: ClassVar[_Figure[str]] = _Figure("where")
    devices: ClassVar[_Figure[int]] = _Figure("where")
    mesh: ClassVar[_Figure[str]] = _Figure("where")
    argument_sharding: ClassVar[_Figure[Named]] = _Figure("where")
    failed_at: ClassVar[_Figure[FailedAt]] = _Figure("failure")
    out_of_memory: ClassVar[_Figure[bool]] = _Figure("failure")
    compiler_bytes: ClassVar[_Figure[int | None]] = _Figure("failure")
    fit_proof_bytes: ClassVar[_Figure[int | None]] = _Figure("proof")
    fit_proof_failed: ClassVar[_Figure[str]] = _Figure("proof")

    def __init__(self, schedule_key: str, status: Status, reason: str = "", *,
                 sizes: Sizes | None = None, peaks: DevicePeaks | None = None,
                 timing: Timing | None = None, where: Where | None = None,
                 failure: Failure | None = None, proof: Proof | None = None,
                 **figures: Any) -> None:
        """The records, or any figure by its flat name (``total_bytes=...``: into its
        record, over the one given); a name that is no figure is a ``TypeError``."""
        records: dict[str, Any] = {"sizes": sizes, "peaks": peaks, "timing": timing,
                                   "where": where, "failure": failure, "proof": proof}
        changes: dict[str, dict[str, Any]] = {}
        for name, value in figures.items():
            if name not in OWNER:
                raise TypeError(f"Measurement: no figure named {name!r}")
            changes.setdefault(OWNER[name], {})[name] = value
        for record, cls in RECORDS.items():
            value = records[record] if records[record] is not None else cls()
            object.__setattr__(self, record, replace(value, **changes.get(record, {})))
        object.__setattr__(self, "schedule_key", schedule_key)
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "reason", reason)

    @property
    def cut(self) -> bool:
        """Timing stopped after one run (``cut_seconds``): slower than the best that fits."""
        return self.cut_seconds is not None

    @property
    def feasible(self) -> bool:
        """Compiled, within the budget, ran, and produced finite outputs."""
        return self.status == OK

    def to_attrs(self) -> dict[str, Any]:
        """A JSON-safe flat mapping (Optuna user attrs): each record's ``to_attrs``, with
        ``feasible`` added."""
        data: dict[str, Any] = {"schedule_key": self.schedule_key, "status": self.status,
                                "reason": self.reason}
        for record in RECORDS:
            data.update(to_attrs(getattr(self, record)))
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
        return cls(attrs["schedule_key"], attrs["status"], attrs.get("reason", ""),
                   sizes=from_attrs(Sizes, attrs), peaks=from_attrs(DevicePeaks, attrs),
                   timing=from_attrs(Timing, attrs), where=from_attrs(Where, attrs),
                   failure=from_attrs(Failure, attrs), proof=from_attrs(Proof, attrs))

    def proved(self, attrs: Mapping[str, Any]) -> Measurement:
        """This measurement with a proof of fit's outcome (``proof_attrs``; a key left out
        is no outcome)."""
        proof = from_attrs(Proof, attrs)
        return replace(self, proof=Proof(proof.fit_proof_bytes, str(proof.fit_proof_failed or "")))

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

