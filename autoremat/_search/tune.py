"""The search: remat schedules of a problem under a memory budget, as an Optuna study.

``tune`` records every measured schedule as a trial of an Optuna study with
two objectives, ``total_bytes`` and ``step_seconds`` (``measure``); the
budget is a constraint, ``total_bytes - budget <= 0`` (``Measurement.fit_bytes``:
a larger measured runtime peak on GPU/TPU; ``trial.set_constraint``, Optuna 5), so
the whole measured front stays available (``autoremat pareto``). The answer is the
fastest trial that fits
(``autoremat._search.study.choose``).

What gets measured is decided by ``autoremat._search.planner.Planner``, not by a
sampler: the obvious candidates (``space.seed_schedules``) are enqueued first, each
trial holding its schedule, and always measured (they calibrate the cost model); after
them the planner hands its candidate straight to the trial that measures it; candidates
are sized by compiling them (cheap), ranked by a time model calibrated on the
study's own trials (``predict``), and timed only when they fit and are not
dominated; a schedule whose first run is already clearly slower than the best
that fits is a *cut* trial (``cut_seconds``, no ``step_seconds``). The search
ends when nothing left is predicted to beat the best, after ``n_trials``
(exactly that many: past the planner's stop, dominated ones too), or at
``time_limit``.

Long problems (``T >= short_runs.MIN_SEQ_LEN`` with
``Problem.at_length``) are sized at full length but timed on short runs,
their full-length times predicted (``autoremat._search.short_runs``; the trial attr
``timed_seq_len`` says which); before answering, the pick is timed at full
length (``autoremat._search.confirm``) and the answer is the fastest measured.

* A schedule is measured at most once per study: a trial whose schedule key
  was already measured (or is being measured by another worker) is pruned
  with ``user_attrs["duplicate_of"]``; it does not count towards ``n_trials``.
* A seed over the budget is a trial with values ``(total_bytes, inf)``, no
  ``step_seconds`` (other candidates over it are dropped when sized). One
  that fails to build/compile/run (or gives NaN) is a FAIL trial whose
  ``user_attrs["reason"]`` says why; the search goes on. One that failed to
  build or compile (``user_attrs["compile_failed"]``) does not count towards
  ``n_trials`` or ``total_trials``: it measured nothing.
* Before the search, the choices marked risky on this platform (offload policies
  on a GPU or TPU, ``Schedule.checks``; XLA compiler options on a GPU,
  ``_space.checks``) are probed on a small instance of the problem; those that
  fail or change the results are left out of the study's space, recorded in the
  study (``autoremat._search.probe``).
* The trial's user attrs hold every figure (``Measurement.to_attrs``), the
  schedule and the model's ``predicted_seconds``; the study its
  ``StudyInfo``. The same study name resumes; Ctrl-C keeps finished trials.
* Many workers (``autoremat._search.storage``): ``autoremat tune`` started N times on
  one PostgreSQL URL (or one SQLite file on one machine) share one study;
  each plans from what every worker measured so far. A worker claims a
  schedule under ``StudyLock``, so no schedule is measured twice and, with
  ``total_trials``, the study ends with exactly that many measured trials. A
  trial whose worker died goes stale and is re-queued; with ``total_trials``
  a worker waits for trials still running elsewhere (or going stale) before
  it stops, so every worker ends on the same answer.
"""

from __future__ import annotations

import functools
import math
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from autoremat._errors import ProblemError, TuneError, one_line
from autoremat._measure.device import arguments_fingerprint, environment
from autoremat._measure.measure import DEFAULT_TIME_BUDGET
from autoremat._measure.measurement import ERROR, Measurement
from autoremat._measure.mesh import layout
from autoremat._measure.problem import Problem, Step
from autoremat._schedules import from_data, save_schedule
from autoremat._schedules.base import Schedule
from autoremat._search.attrs import (
    COMPILE_FAILED,
    DESCRIBE,
    DUPLICATE_OF,
    MEASURED,
    MEASURING,
    PREDICTED_SECONDS,
    SCHEDULE,
    SCHEDULE_KEY,
    TOTAL_REACHED,
)
from autoremat._search.confirm import confirm
from autoremat._search.planner import Candidate, Planner
from autoremat._search.probe import study_probe
from autoremat._search.resume import default_study_name, open_study
from autoremat._search.short_runs import ShortRuns
from autoremat._search.storage import DEFAULT_HEARTBEAT, DEFAULT_STORAGE, StudyLock, open_storage, redact
from autoremat._search.study import MeasuredTrial, StudyInfo, TuneResult, summarize
from autoremat._units import parse_duration

if TYPE_CHECKING:
    import optuna
    from optuna.storages import RDBStorage
    from optuna.trial import FrozenTrial

_MAX_DUPLICATES_IN_A_ROW: Final = 50
#: Without ``n_trials``, at most this many (the planner or the time limit stops first).
_MAX_TRIALS: Final = 10_000
#: ``tune``'s default time limit: the built-in problem at T=10^4 in under 2.5 minutes.
DEFAULT_TIME_LIMIT: Final = "2m"
OnTrial = Callable[["optuna.Study", "FrozenTrial"], None]
#: What a worker does next (``_Search.next_step``).
NextStep = Literal["measure", "wait", "stop"]


class MeasurementFailed(RuntimeError):
    """A schedule failed to build, compile or run; the trial is marked FAIL."""


#: How ``autoremat._measure.measure`` starts the reason of a failure before any run.
_COMPILE_FAILURES: Final = ("build failed", "compile failed", "out of memory at compile")


def compile_failed(m: Measurement) -> bool:
    """The schedule failed to build or compile, at full length or for its short run
    (reason ``at T'=...: compile failed: ...``): nothing ran, nothing was measured."""
    reason = re.sub(r"^at T'=\d+: ", "", m.reason)
    return m.status == ERROR and reason.startswith(_COMPILE_FAILURES)


def _is_measured(t: FrozenTrial) -> bool:
    from optuna.trial import TrialState

    return t.state in (TrialState.COMPLETE, TrialState.FAIL) and bool(t.user_attrs.get(MEASURED))


def _is_claimed(t: FrozenTrial) -> bool:
    from optuna.trial import TrialState

    return t.state == TrialState.RUNNING and bool(t.user_attrs.get(MEASURING))


def _find_measured(trials: list[FrozenTrial], key: str, exclude: int) -> int | None:
    """The number of a trial that measured (or is measuring) ``key``, if any."""
    for t in trials:
        if t.number == exclude or t.user_attrs.get(SCHEDULE_KEY) != key:
            continue
        if _is_measured(t) or _is_claimed(t):
            return t.number
    return None


def _progress(trials: list[FrozenTrial], exclude: int | None = None) -> tuple[int, int]:
    """``(measured, being measured)``: finished trials holding a measurement (not a
    failed compile), and running trials that have claimed a schedule (not counting
    ``exclude``)."""
    done = sum(1 for t in trials if _is_measured(t) and not t.user_attrs.get(COMPILE_FAILED))
    running = sum(1 for t in trials if t.number != exclude and _is_claimed(t))
    return done, running


class _Search:
    """One worker's search on an open study: claim a schedule, measure it, count.

    Attributes:
      measured: schedules this worker measured.
      duplicates_in_a_row: trials pruned as duplicates since the last measured one.
      attempts: trials started.
    """

    def __init__(self, problem: Problem, info: StudyInfo, study: optuna.Study,
                 storage: RDBStorage, lock: StudyLock, *, total_trials: int | None,
                 time_budget: float, heartbeat: int, on_trial: OnTrial | None,
                 explore_front: bool = False, seed: int = 0,
                 built: tuple[str, Step, tuple[Any, ...]] | None = None,
                 refused: frozenset[str] = frozenset()) -> None:
        self.problem, self.info, self.study, self.lock = problem, info, study, lock
        self.short = ShortRuns(problem)  # times long problems on short runs
        self.planner = Planner(problem, info.budget_bytes, info.platform or "", self.short,
                               seed=seed + len(study.trials), explore_front=explore_front,
                               time_budget=time_budget, built=built, refused=refused)
        self.total_trials, self.time_budget, self.heartbeat = total_trials, time_budget, heartbeat
        self.on_trial = on_trial
        self.storage = storage if hasattr(storage, "get_all_trials") else None
        self.heartbeats = getattr(self.storage, "heartbeat_interval", None) is not None
        self.measured = 0
        self.duplicates_in_a_row = 0
        self.attempts = 0

    def fresh_trials(self) -> list[FrozenTrial]:
        """Every trial, read from the storage itself (not a cache)."""
        if self.storage is not None:
            return self.storage.get_all_trials(self.study._study_id, deepcopy=False)
        return self.study.get_trials(deepcopy=False)

    def claim(self, trial: optuna.Trial, key: str) -> None:
        """Claim ``key`` for this trial, or prune it (duplicate, or the total is reached)."""
        import optuna

        with self.lock:
            trials = self.fresh_trials()
            dup = _find_measured(trials, key, trial.number)
            if dup is not None:
                trial.set_user_attr(DUPLICATE_OF, dup)
                raise optuna.TrialPruned(f"schedule already measured in trial {dup}")
            if self.total_trials is not None:
                done, running = _progress(trials, exclude=trial.number)
                if done + running >= self.total_trials:
                    trial.set_user_attr(TOTAL_REACHED, self.total_trials)
                    raise optuna.TrialPruned(f"the study has its {self.total_trials} trials")
            trial.set_user_attr(MEASURING, True)

    def objective(self, trial: optuna.Trial, planned: Candidate | None) -> tuple[float, float]:
        """Measure ``planned`` -- or, when Optuna handed this worker a trial enqueued
        before (a seed, or the retry of a trial whose worker died), the schedule that
        trial holds: claim it, size it (from the planner's screen when it has one) and, if
        it fits, time it; ``(total_bytes, step_seconds)``."""
        import optuna

        budget = self.info.budget_bytes
        enqueued = trial.user_attrs.get(SCHEDULE)
        if enqueued is not None:
            cand = self.planner.candidate(from_data(enqueued))
        elif planned is not None:
            cand = planned
        else:  # nothing planned, and the trial waiting for it was taken by another worker
            raise optuna.TrialPruned("no schedule to measure")
        schedule, key = cand.schedule, cand.schedule.key()
        trial.set_user_attr(SCHEDULE_KEY, key)
        trial.set_user_attr(SCHEDULE, schedule.to_data())
        trial.set_user_attr(DESCRIBE, schedule.describe())
        self.claim(trial, key)
        compiled = self.planner.take_compiled(cand)
        trial.set_user_attr(PREDICTED_SECONDS, self.planner.predict(cand))
        m = self.short.time(schedule, compiled, budget_bytes=budget, time_budget=self.time_budget,
                            cut_after=self.planner.cut_after())
        compiled.release()
        self.planner.record(schedule, m)
        for k, v in m.to_attrs().items():
            trial.set_user_attr(k, v)
        if compile_failed(m):
            trial.set_user_attr(COMPILE_FAILED, True)  # not one of n_trials
        trial.set_user_attr(MEASURED, True)
        if m.fit_bytes is not None:  # the estimate, or a larger measured runtime peak
            trial.set_constraint("memory", float(m.fit_bytes - budget))
        if m.status == ERROR or m.total_bytes is None:
            raise MeasurementFailed(m.reason)
        seconds = m.step_seconds if m.step_seconds is not None else m.cut_seconds
        return float(m.total_bytes), (seconds if seconds is not None else math.inf)

    def callback(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Count the finished trial, then call ``on_trial``."""
        if trial.user_attrs.get(MEASURED):
            self.measured += not trial.user_attrs.get(COMPILE_FAILED)
            self.duplicates_in_a_row = 0
        elif DUPLICATE_OF in trial.user_attrs:
            self.duplicates_in_a_row += 1
        if self.on_trial is not None:
            self.on_trial(study, trial)

    def fail_stale(self) -> None:
        """Fail (and so re-queue) trials whose worker stopped sending heartbeats."""
        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)

    def next_step(self) -> NextStep:
        """With ``total_trials``: ``"stop"`` (reached), ``"wait"`` (others are measuring
        the last slots: wait for them to finish or go stale, then their retry is ours
        to run) or ``"measure"``."""
        if self.total_trials is None:
            return "measure"
        if self.heartbeats:
            self.fail_stale()
        done, running = _progress(self.fresh_trials())
        if done >= self.total_trials:
            return "stop"
        if done + running >= self.total_trials:
            return "wait" if self.heartbeats else "stop"
        return "measure"

    def plan(self, deadline: float | None, explore: bool,
             dominated: bool = False) -> Candidate | Literal["enqueued"] | None:
        """The planner's next candidate; ``"enqueued"`` when a trial is already waiting (a
        seed or a retry: Optuna hands it to the next ``optimize``); ``None`` when there is
        nothing left worth measuring."""
        from optuna.trial import TrialState

        trials = self.fresh_trials()
        if any(t.state == TrialState.WAITING for t in trials):
            return "enqueued"
        self.planner.observe([(m.schedule, m.measurement) for m in map(MeasuredTrial.of, trials)
                              if m is not None], {str(t.user_attrs.get(SCHEDULE_KEY)) for t
                                                  in trials if _is_measured(t) or _is_claimed(t)})
        return self.planner.next(deadline, explore=explore, dominated=dominated)

    def run(self, n_trials: int | None, time_limit: float | None) -> bool:
        """Measure schedules until the planner is done, ``n_trials`` are measured (then
        exactly that many: past the planner's stop, dominated ones too) or the time
        limit; ``True`` when Ctrl-C stopped it."""
        import optuna

        deadline = None if time_limit is None else time.monotonic() + time_limit
        cap = n_trials if n_trials is not None else _MAX_TRIALS
        max_attempts = cap * 10 + _MAX_DUPLICATES_IN_A_ROW
        verbosity = optuna.logging.get_verbosity()
        # A failed schedule is a FAIL trial with its reason in user_attrs (and on_trial);
        # Optuna's own warning would print the MeasurementFailed traceback.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        try:
            while (self.measured < cap and self.attempts < max_attempts
                   and self.duplicates_in_a_row < _MAX_DUPLICATES_IN_A_ROW):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                step = self.next_step()
                if step == "stop":
                    break
                if step == "wait":
                    pause = min(1.0, self.heartbeat / 4)
                    time.sleep(pause if left is None else max(0.0, min(pause, left)))
                    continue
                exact = n_trials is not None or self.total_trials is not None
                planned = self.plan(deadline, self.planner.explore_front)
                if planned is None and exact:
                    planned = self.plan(deadline, True, True)
                if planned is None:
                    break
                self.attempts += 1
                cand = planned if isinstance(planned, Candidate) else None
                self.study.optimize(functools.partial(self.objective, planned=cand), n_trials=1,
                                    catch=(MeasurementFailed,), callbacks=[self.callback],
                                    gc_after_trial=False)
            if self.heartbeats:
                self.fail_stale()
        except KeyboardInterrupt:
            return True
        finally:
            optuna.logging.set_verbosity(verbosity)
        return False


def tune(
    problem: Problem,
    budget_bytes: int,
    *,
    n_trials: int | None = None,
    total_trials: int | None = None,
    time_limit: float | str | None = DEFAULT_TIME_LIMIT,
    explore_front: bool = False,
    storage: str | None = None,
    study_name: str | None = None,
    seed: int = 0,
    out: str | Path | None = None,
    time_budget: float = DEFAULT_TIME_BUDGET,
    heartbeat: int = DEFAULT_HEARTBEAT,
    on_trial: OnTrial | None = None,
    on_confirm: Callable[[str], None] | None = None,
) -> TuneResult:
    """Find the fastest schedule of ``problem``'s step whose total memory fits.

    Candidates are sized by compiling them (cheap); only those that fit and
    that the calibrated cost model does not rule out are timed (about
    ``time_budget`` s each): the time goes near the answer (module doc).

    Args:
      problem: the training step (see ``autoremat.Problem``).
      budget_bytes: the memory budget, in bytes, for ``total_bytes`` -- per device
        when the problem's arguments are sharded over many (``autoremat._measure.mesh``).
      n_trials: measure exactly this many schedules in this call (duplicates
        do not count); ``None``: until the planner is done or ``time_limit``.
      total_trials: stop when the study holds this many measured schedules,
        counting every worker's; a worker waits for the last ones measured
        elsewhere (or for them to go stale and be retried) before it returns.
      time_limit: stop starting new compiles or trials after this long, from
        the call's start: seconds, or text such as ``"90s"``, ``"5m"``,
        ``"1.5h"`` (``None``: no limit). A trial under way finishes. A pick
        timed on short runs is then timed at full length (``autoremat._search.confirm``).
      explore_front: measure the whole front, not just near the fastest
        schedule that fits (no stop on predictions, no cut trials).
      storage: an Optuna storage URL; default ``sqlite:///runs/autoremat.db``.
      study_name: resume or create this study; default from the problem,
        device and budget, so running the same call again resumes.
      seed: the candidate pool's seed (offset by the trials already in the study).
      out: when given and a schedule fits, write it there (atomic YAML).
      time_budget: about how long timing one schedule may take, in seconds.
      heartbeat: seconds between a running trial's heartbeats (RDB storages);
        a trial silent for ``GRACE_INTERVALS * heartbeat`` is stale: failed
        and retried.
      on_trial: called as ``on_trial(study, frozen_trial)`` after each trial
        (``autoremat._search.study.MeasuredTrial.of(frozen_trial)`` reads it).
      on_confirm: called with one line before each full-length timing of a
        schedule timed on short runs (``autoremat._search.confirm``), and with one
        line per choice the study's probe checked (``autoremat._search.probe``).

    Returns:
      A ``TuneResult``; ``best`` is ``None`` when nothing measured fits.

    Raises:
      TuneError: the storage cannot be opened, ``out`` cannot be written, the
        named study was made for another problem, argument shapes, device or
        budget, or this is one of many processes (``jax.process_count() > 1``:
        tune on one host, load the schedule on all).
      ProblemError: the problem's step cannot be built.
    """
    import jax
    import optuna

    if jax.process_count() > 1:
        raise TuneError(
            f"jax.process_count() is {jax.process_count()} (this is process "
            f"{jax.process_index()}): tuning measures in one process; tune on one host on a "
            "mesh of the same per-device shape, then load the schedule on every host "
            "(autoremat.load_schedule)")
    limit = None if time_limit is None else parse_duration(time_limit, "time_limit")
    start = time.monotonic()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    info, built = _study_info(problem, budget_bytes, storage)
    storage_obj = open_storage(storage, heartbeat=heartbeat)
    name = study_name or default_study_name(problem, budget_bytes, info.device_kind or "")
    lock = StudyLock(storage_obj, name)
    study = open_study(storage_obj, name, info, lock, seed)
    refused = study_probe(study, lock, problem, info.platform or "", on_confirm)
    search = _Search(problem, info, study, storage_obj, lock, total_trials=total_trials,
                     time_budget=time_budget, heartbeat=heartbeat, on_trial=on_trial,
                     explore_front=explore_front, seed=seed, built=built, refused=refused)
    del built
    interrupted = search.run(n_trials, None if limit is None else
                             limit - (time.monotonic() - start))
    unconfirmed = "" if interrupted else confirm(study, problem, budget_bytes, time_limit=limit,
                                                 time_budget=time_budget, on_confirm=on_confirm)
    result = summarize(study, storage or DEFAULT_STORAGE, info=info, measured=search.measured,
                       interrupted=interrupted, unconfirmed=unconfirmed)
    if out is not None:
        _write_best(result, out)
    return result


def _study_info(problem: Problem, budget_bytes: int, storage: str | None,
                ) -> tuple[StudyInfo, tuple[str, Step, tuple[Any, ...]]]:
    """What the study is for, from the plain scan's arguments, and that build (its compile
    reuses it: the step is built once)."""
    env = environment()
    plain = Schedule.plain(problem.seq_len)
    try:
        step, args = problem.build(plain)
    except Exception as e:
        raise ProblemError(f"problem: {problem.name}: build(plain scan) failed: "
                           f"{one_line(e)}") from None
    devices, mesh = layout(args)
    info = StudyInfo(budget_bytes=budget_bytes, seq_len=problem.seq_len, problem=problem.name,
                     fingerprint=arguments_fingerprint(args), device_kind=env["device_kind"],
                     platform=env["platform"], storage=redact(storage or DEFAULT_STORAGE),
                     devices=devices, mesh=mesh)
    return info, (plain.key(), step, args)


def _write_best(result: TuneResult, out: str | Path) -> None:
    """Write the answer (atomic YAML); nothing when nothing fits."""
    if result.best is None or result.best_trial is None:
        return
    try:
        save_schedule(result.best, out)
    except OSError as e:
        raise TuneError(
            f"out: cannot write {str(out)!r} ({e.strerror or e}); the study is kept: "
            f"export trial {result.best_trial.number} to another file") from None
