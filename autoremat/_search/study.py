"""Reading a study: what it was tuned for, its measured trials, and its answer.

Every trial that measured a schedule holds, in its Optuna user attrs, the
``Measurement`` (``Measurement.to_attrs``, read back with ``from_attrs``),
the schedule (``"schedule"``, ``Schedule.to_data``) and ``"measured": True``;
the study holds ``StudyInfo``. The answer is the fastest measured trial that
fits the budget (``Measurement.fits``), among those timed at full length when any
was (``choose``) -- or, of the trials whose step times lie within the measured noise of
the fastest's, the one with the least memory, the plain scan last (``tie_break``). Nothing here runs
the search (``autoremat._search.tune``) or measures anything.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from autoremat._errors import TuneError
from autoremat._measure.breakdown import DEVICE_KEYS
from autoremat._measure.compile_cache import CacheUse
from autoremat._measure.measurement import Measurement
from autoremat._schedules import plain
from autoremat._schedules.base import Schedule
from autoremat._search.attrs import (
    COMPILE_FAILED,
    LAYER_STACK,
    MEASURED,
    NAME_COSTS,
)
from autoremat._search.bound import Bound
from autoremat._search.planning.candidates import TooLate
from autoremat._search.storage import DEFAULT_STORAGE, open_storage, redact, sqlite_file
from autoremat._search.trials import MeasuredTrial, Pick, fastest_fitting, fuse_why, tie_break

if TYPE_CHECKING:
    import optuna

    from autoremat._search.reports import ProofOfFit

#: The study attrs a resumed study must match (else it was made for another problem).
MATCHED_STUDY_ATTRS = ("budget_bytes", "problem", "fingerprint", "device_kind")


@dataclass(frozen=True)
class StudyInfo:
    """What a study was made for (its user attrs).

    Attributes:
      budget_bytes: the memory budget of ``total_bytes``.
      seq_len: the problem's sequence length.
      problem: the problem's name; fingerprint: its argument shapes' hash.
      device_kind, platform: the device it was tuned on.
      storage: the storage URL, password redacted.
      devices, mesh: how many devices the step spans and their mesh (``data=4``;
        ``""``: none); the budget and every figure are per device.
      fuse_choice: fusing the readout was a choice of the search (``Problem.fuse_choice``).
      notes: what building the problem noticed (``Problem.notes``: a remat inside the
        step, a scan's own unroll the schedule's replaces), recorded in the answer's meta.
    """

    budget_bytes: int
    seq_len: int
    problem: str | None = None
    fingerprint: str | None = None
    device_kind: str | None = None
    platform: str | None = None
    storage: str = ""
    devices: int = 1
    mesh: str = ""
    fuse_choice: bool = False
    notes: tuple[str, ...] = ()

    @classmethod
    def of(cls, study: optuna.Study) -> StudyInfo:
        """The study's ``StudyInfo``.

        Raises:
          TuneError: the study holds no ``budget_bytes``/``seq_len`` (not made by ``tune``).
        """
        attrs = study.user_attrs
        for key in ("budget_bytes", "seq_len"):
            if key not in attrs:
                raise TuneError(f"study_name: study {study.study_name!r} has no {key!r}; "
                                "it was not made by autoremat tune")
        found = {f.name: attrs[f.name] for f in fields(cls) if f.name in attrs}
        if "notes" in found:
            found["notes"] = tuple(found["notes"])
        return cls(**found)

    def to_attrs(self) -> dict[str, Any]:
        """The study user attrs ``tune`` sets."""
        return asdict(self)


@dataclass(frozen=True)
class Overrun:
    """A time limit spent inside a compile: the limit, how long the call took, the trial
    whose compile outlasted the limit (``None``: the bound's two compiles before the
    search, ``autoremat._search.bound``) and that compile's seconds."""

    limit_seconds: float
    elapsed_seconds: float
    trial: int | None
    compile_seconds: float


def load_study(study_name: str, storage: str | None = None) -> optuna.Study:
    """Open the existing study ``study_name`` in ``storage`` (default ``DEFAULT_STORAGE``).
    Reading only: an SQLite file that does not exist is not created.

    Raises:
      TuneError: the storage cannot be opened or holds no such study.
    """
    import optuna

    url = storage or DEFAULT_STORAGE
    file = sqlite_file(url) if isinstance(url, str) else None
    if file is not None and not file.is_file():
        raise TuneError(f"study_name: no study {study_name!r} in {redact(url)}: the file "
                        "does not exist (no tune saved a study there); give the storage that "
                        f"holds {study_name!r}, or tune first")
    storage_obj = open_storage(storage)
    try:
        return optuna.load_study(study_name=study_name, storage=storage_obj)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage_obj)]
        raise TuneError(
            f"study_name: no study {study_name!r} in {redact(storage or DEFAULT_STORAGE)}; "
            f"studies there: {', '.join(repr(n) for n in names) or 'none'}"
        ) from None


def checkpoint_names(study: optuna.Study) -> tuple[str, ...]:
    """The step's ``checkpoint_name`` tags the study recorded (a layer stack's; none for a
    step without, or a recurrence)."""
    rows = study.user_attrs.get(NAME_COSTS) or []
    return tuple(str(r["name"]) for r in rows if isinstance(r, dict) and "name" in r)


def is_recurrence(study: optuna.Study) -> bool:
    """The study's scan is a recurrence over time steps, not a stack of layers
    (``LAYER_STACK``)."""
    attrs = study.user_attrs
    return not bool(attrs.get(LAYER_STACK, NAME_COSTS in attrs))


def measured_trials(study: optuna.Study) -> list[MeasuredTrial]:
    """Finished trials that hold a measurement (COMPLETE, or FAIL with a reason)."""
    from optuna.trial import TrialState

    attrs = study.user_attrs
    found = (MeasuredTrial.of(t, attrs) for t in study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)))
    return [t for t in found if t is not None]


def choose(study: optuna.Study, info: StudyInfo | None = None) -> MeasuredTrial | None:
    """The fastest trial that fits the study's budget (ties within noise: the least
    memory, ``tie_break``), or ``None``;
    among those timed at full length when there are any (a time predicted from a short
    run is the answer only while none was: ``autoremat._search.confirm``). ``info``: what
    the study was made for, when the caller has it (``tune``), else read from the study."""
    info = info if info is not None else StudyInfo.of(study)
    return fastest_fitting(measured_trials(study), info.budget_bytes, info.seq_len)


def trial_schedule(study: optuna.Study, trial: MeasuredTrial,
                   info: StudyInfo | None = None) -> Schedule:
    """The trial's schedule, with ``meta`` recording what it was tuned for (``layer_stack``:
    its scan runs layers, not the time steps of a recurrence) and measured; ``info``: the
    study's ``StudyInfo`` when the caller has it (else read from the study)."""
    m = trial.measurement
    sizes, timing, where = m.sizes, m.timing, m.where
    info = info if info is not None else StudyInfo.of(study)
    return trial.schedule.with_meta(
        problem=info.problem, seq_len=info.seq_len, layer_stack=not is_recurrence(study),
        fingerprint=info.fingerprint,
        device_kind=where.device_kind, platform=where.platform,
        jax_version=where.jax_version, flax_version=where.flax_version,
        budget_bytes=info.budget_bytes, total_bytes=sizes.total_bytes,
        temp_bytes=sizes.temp_bytes, step_seconds=timing.step_seconds,
        timed_seq_len=timing.timed_seq_len, extrapolated_seconds=timing.extrapolated_seconds,
        compile_seconds=timing.compile_seconds, argument_bytes=sizes.argument_bytes,
        output_bytes=sizes.output_bytes, alias_bytes=sizes.alias_bytes,
        argument_parts=dict(sizes.argument_parts), stacked_bytes=sizes.stacked_bytes,
        carry_bytes=sizes.carry_bytes, devices=where.devices, mesh=where.mesh or None,
        **({"argument_sharding": dict(where.argument_sharding)}
           if where.argument_sharding else {}),
        **device_memory_meta(m),
        **({"notes": list(info.notes)} if info.notes else {}),
        study_name=study.study_name,
        storage=redact(info.storage), trial=trial.number,
        date=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    )


def device_memory_meta(m: Measurement) -> dict[str, int]:
    """The measured device figures for ``meta``, and the proof of fit's budget (none on a
    CPU, so its meta is unchanged)."""
    return {k: v for k in DEVICE_KEYS if isinstance(v := getattr(m, k), int)}


@dataclass(frozen=True)
class TuneResult:
    """What a study found (``tune``, or ``summarize`` of an existing one).

    Attributes:
      study_name, storage: where the study lives (resume with the same pair).
      budget_bytes: the memory budget.
      best: the fastest schedule that fits, with ``meta`` filled in, or ``None``.
      best_trial: that trial (number, schedule, measurement).
      plain_trial: the plain scan's trial when it was measured (where fusing the readout is
        a choice, unfused before fused).
      smallest_trial: the measured trial with the smallest ``total_bytes``.
      measured: how many schedules this call measured.
      n_trials: how many trials the study holds in all (measured, queued, pruned, failed).
      study_measured: how many schedules the study holds measured (every worker's, every
        call's; a failed compile measured nothing and is not one).
      queued: trials waiting to be measured (seed schedules enqueued when the study was
        made that no call has reached yet).
      compile_failed: trials whose schedule failed to build or compile.
      interrupted: ``True`` when Ctrl-C stopped the search.
      devices, mesh: what the figures are per device of (``StudyInfo``).
      confirmed: trials timed on a short run and then at full length
        (``measurement.extrapolated_seconds``: the prediction).
      unconfirmed: why ``best``'s step time is a prediction, not measured ("" when not).
      proof: what the proof of fit found (``None`` when none ran).
      checkpoint_names: the step's ``checkpoint_name`` tags the study recorded (a layer
        stack's), the ``names`` of ``autoremat.framework_policy``.
      bound: what scheduling can save at most, measured before the search (``None``
        where it could not be compiled).
      overrun: the time limit ran out inside one compile (``tune``; ``None`` otherwise).
      tie: where ``best`` is not the fastest that fits but tied with it within the
        measured noise and smaller (``tie_break``): the fastest, the noise, the memory
        ratio; ``None`` otherwise.
      compile_cache: what JAX's persistent compilation cache did during the tune (hits,
        misses, its folder); ``None``: not a tune.
      too_late: candidates the search did not compile as their compile (an unrolled one)
        would end past the time limit.
    """

    study_name: str
    storage: str
    budget_bytes: int
    best: Schedule | None
    best_trial: MeasuredTrial | None
    plain_trial: MeasuredTrial | None
    smallest_trial: MeasuredTrial | None
    measured: int
    n_trials: int
    interrupted: bool = False
    devices: int = 1
    mesh: str = ""
    confirmed: tuple[MeasuredTrial, ...] = ()
    unconfirmed: str = ""
    proof: ProofOfFit | None = None
    bound: Bound | None = None
    overrun: Overrun | None = None
    study_measured: int = 0
    queued: int = 0
    compile_failed: int = 0
    checkpoint_names: tuple[str, ...] = ()
    tie: Pick | None = None
    compile_cache: CacheUse | None = None
    too_late: tuple[TooLate, ...] = ()


def summarize(study: optuna.Study, storage: str, *, info: StudyInfo | None = None,
              measured: int = 0, interrupted: bool = False,
              unconfirmed: str = "", proof: ProofOfFit | None = None,
              compile_cache: CacheUse | None = None,
              too_late: tuple[TooLate, ...] = ()) -> TuneResult:
    """The ``TuneResult`` of a study (nothing is measured, nothing written); ``info``: what
    the study was made for, when the caller has it (``tune``), else read from the study."""
    info = info if info is not None else StudyInfo.of(study)
    trials = measured_trials(study)
    picked = tie_break(trials, info.budget_bytes, info.seq_len)
    best_trial = None if picked is None else picked.pick
    best = trial_schedule(study, best_trial, info) if best_trial is not None else None
    if best is not None and best_trial is not None and best.fuse is not None:
        best = best.with_meta(fuse_why=fuse_why(trials, best_trial, info.budget_bytes,
                                                info.seq_len))
    plain_key = plain(info.seq_len).key()
    plains = sorted((t for t in trials if t.schedule.with_fuse(None).key() == plain_key),
                    key=lambda t: (t.schedule.fuse is not None, bool(t.schedule.fuse)))
    sized = [t for t in trials if t.measurement.total_bytes is not None]
    counts = trial_counts(study)
    return TuneResult(
        study_name=study.study_name, storage=storage, budget_bytes=info.budget_bytes,
        best=best, best_trial=best_trial,
        plain_trial=next(iter(plains), None),  # as written first, where fuse is a choice
        smallest_trial=min(sized, key=lambda t: t.measurement.total_bytes or 0, default=None),
        measured=measured, n_trials=len(study.trials), interrupted=interrupted,
        devices=info.devices, mesh=info.mesh,
        confirmed=tuple(t for t in trials if t.measurement.extrapolated_seconds is not None),
        unconfirmed=unconfirmed, proof=proof, checkpoint_names=checkpoint_names(study),
        bound=Bound.of(study.user_attrs),
        tie=picked if picked is not None and picked.tied else None,
        compile_cache=compile_cache, too_late=too_late,
        study_measured=counts["study_measured"], queued=counts["queued"],
        compile_failed=counts["compile_failed"],
    )


def trial_counts(study: optuna.Study) -> dict[str, int]:
    """``study_measured``, ``queued`` and ``compile_failed`` of ``TuneResult``."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    measured = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)
                and t.user_attrs.get(MEASURED)]
    failed = sum(1 for t in measured if t.user_attrs.get(COMPILE_FAILED))
    return {"study_measured": len(measured) - failed, "compile_failed": failed,
            "queued": sum(1 for t in trials if t.state == TrialState.WAITING)}
