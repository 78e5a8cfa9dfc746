"""The study: search remat schedules of a problem under a memory budget.

``tune`` runs an Optuna study with two objectives, both measured by
``autoremat._measure.measure``: minimize ``total_bytes`` and minimize
``step_seconds``. The budget is a constraint, ``total_bytes - budget <= 0``,
set with ``trial.set_constraint("memory", ...)`` (Optuna 5), so the sampler
knows which trials are infeasible and the full Pareto front stays available
(``autoremat pareto``). The answer is the fastest trial that fits.

* The obvious candidates are enqueued first (``_space.seed_params``).
* A schedule is measured at most once per study: a trial whose schedule key
  was already measured (or is being measured by another worker) is pruned
  with ``user_attrs["duplicate_of"]``; it does not count towards ``n_trials``.
* A schedule over the budget is compiled and sized but not timed; its
  objective values are ``(total_bytes, inf)`` and ``step_seconds`` is ``None``.
* A schedule that fails to build/compile/run (or gives NaN) is a FAIL trial
  whose ``user_attrs["reason"]`` says why; the search goes on.
* Every figure is stored in the trial's user attrs (see ``Measurement``), the
  schedule too (``user_attrs["schedule"]``), and the study records
  ``budget_bytes``, ``problem``, ``seq_len``, ``fingerprint``, ``device_kind``.
* Storage: any Optuna storage URL; default an SQLite file
  ``runs/autoremat.db`` (``runs/`` is ignored by git). The same study name
  resumes the study; Ctrl-C keeps every finished trial.
* Many workers: ``autoremat tune`` started N times on one PostgreSQL URL (or
  one SQLite file on one machine) share one study. A worker claims a schedule
  under a lock held across processes (``_StudyLock``: a PostgreSQL advisory
  lock, or ``flock`` on ``<file>.lock`` for SQLite; the server or the kernel
  drops it when its holder dies), so no schedule is measured twice and, with
  ``total_trials``, the study ends with exactly that many measured trials.
* Crashes: RDB storages get a heartbeat (every ``heartbeat`` seconds; a trial
  silent for ``3 * heartbeat`` seconds is stale) and a retry callback: the
  stale trial is marked FAIL and re-queued (at most twice) with the same
  parameters, and whichever worker asks next measures it. With
  ``total_trials`` a worker waits for trials still running elsewhere (or going
  stale) before it stops, so every worker ends on the same, final answer.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from autoremat._atomic import atomic_write_text
from autoremat._budget import format_bytes
from autoremat._errors import TuneError as TuneError
from autoremat._problem import Problem
from autoremat._schedule import Schedule, save_schedule

RUN_DIR: Final = Path("runs")
DEFAULT_STORAGE: Final = "sqlite:///runs/autoremat.db"
LAST_STUDY_FILE: Final = RUN_DIR / "last_study.json"
_MAX_DUPLICATES_IN_A_ROW: Final = 50
DEFAULT_HEARTBEAT: Final = 60
#: A trial whose worker sent no heartbeat for this many intervals is stale.
GRACE_INTERVALS: Final = 3
MAX_RETRIES: Final = 2


class MeasurementFailed(RuntimeError):
    """A schedule failed to build, compile or run; the trial is marked FAIL."""


@dataclass(frozen=True)
class TuneResult:
    """What a ``tune`` call found.

    Attributes:
      study_name, storage: where the study lives (resume with the same pair).
      budget_bytes: the memory budget.
      best: the fastest feasible schedule, with ``meta`` filled in, or ``None``.
      best_attrs: that trial's measured figures (user attrs, plus ``number``).
      plain_attrs: the plain scan's figures when it was measured.
      smallest_attrs: the measured trial with the smallest ``total_bytes``.
      measured: how many schedules this call measured.
      n_trials: how many trials the study holds in all.
      interrupted: ``True`` when Ctrl-C stopped the search.
    """

    study_name: str
    storage: str
    budget_bytes: int
    best: Schedule | None
    best_attrs: dict[str, Any] | None
    plain_attrs: dict[str, Any] | None
    smallest_attrs: dict[str, Any] | None
    measured: int
    n_trials: int
    interrupted: bool = False


def redact(url: str) -> str:
    """A storage URL with any password replaced by ``***``."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def open_storage(url: str | None = None, *, heartbeat: int = DEFAULT_HEARTBEAT) -> Any:
    """An Optuna storage for ``url`` (default ``DEFAULT_STORAGE``).

    Every URL is an RDB (SQLAlchemy) URL, as in Optuna; the storage gets
    ``heartbeat_interval=heartbeat``, ``grace_period=GRACE_INTERVALS * heartbeat``
    and a retry of stale trials (``RetryStaleTrial``); the SQLite default
    creates ``runs/``. A URL that cannot be opened is a ``TuneError``.
    """
    import random
    import warnings

    import optuna
    import sqlalchemy.exc

    url = url or DEFAULT_STORAGE
    if not isinstance(url, str):
        raise TuneError(f"--storage: expected a storage URL string, got {url!r}")
    if isinstance(heartbeat, bool) or not isinstance(heartbeat, int) or heartbeat < 1:
        raise TuneError(f"--heartbeat: expected whole seconds >= 1, got {heartbeat!r}")
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if str(path) not in ("", ":memory:"):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except (OSError, ValueError) as e:
                raise TuneError(f"--storage: cannot create the folder of {str(path)!r} ({e})"
                                ) from None
    for attempt in range(6):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, heartbeat_interval=heartbeat,
                    grace_period=GRACE_INTERVALS * heartbeat, **_retry_callback(optuna))
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as e:
            # Workers starting together on an empty database race to create
            # Optuna's tables; the losers find them made on the next try.
            if attempt == 5:
                raise TuneError(f"--storage: cannot open {redact(url)}: {type(e).__name__}: "
                                f"{_one_line(e)}") from None
            time.sleep(0.2 * (attempt + 1) + random.random() * 0.2)
        except Exception as e:
            raise TuneError(
                f"--storage: cannot open {redact(url)}: {type(e).__name__}: {_one_line(e)}"
            ) from None
    raise AssertionError("unreachable")  # pragma: no cover


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _retry_callback(optuna: Any) -> dict[str, Any]:
    """``RetryStaleTrial`` under the keyword this Optuna takes.

    Optuna >= 4.9 names it ``heartbeat_stale_trial_callback``; older ones
    ``failed_trial_callback``.
    """
    import inspect

    params = inspect.signature(optuna.storages.RDBStorage).parameters
    key = ("heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params
           else "failed_trial_callback")
    return {key: RetryStaleTrial(max_retry=MAX_RETRIES)}


class RetryStaleTrial:
    """Re-queue a trial whose worker died (stale heartbeat), at most ``max_retry`` times.

    Like Optuna's ``RetryHeartbeatStaleTrialCallback`` (same ``system_attrs``
    ``failed_trial`` / ``retry_history``), but the copy drops the dead
    worker's ``measuring`` claim and records ``retry_of`` and why, so it is
    claimed afresh by whichever worker runs it.
    """

    def __init__(self, max_retry: int = MAX_RETRIES) -> None:
        self.max_retry = max_retry

    def __call__(self, study: Any, trial: Any) -> None:
        import optuna

        history = [*trial.system_attrs.get("retry_history", []), trial.number]
        if len(history) > self.max_retry:
            return
        system_attrs = {**trial.system_attrs, "failed_trial": history[0],
                        "retry_history": history}
        user_attrs = {k: v for k, v in trial.user_attrs.items() if k != "measuring"}
        user_attrs["retry_of"] = trial.number
        user_attrs["retry_reason"] = "its worker stopped sending heartbeats (killed or lost)"
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.WAITING, params=trial.params,
            distributions=trial.distributions, user_attrs=user_attrs, system_attrs=system_attrs,
        ))


class _StudyLock:
    """A lock on one study, held across processes while a worker claims a schedule.

    PostgreSQL: a session-level advisory lock on a connection of its own;
    SQLite (a file): ``flock`` on ``<file>.lock``. Both are released by the
    server or the kernel when the holder dies. Other storages (in-memory,
    one process) need none; other RDB servers get none (dedupe there is
    best-effort, as it is in plain Optuna).
    """

    def __init__(self, storage: Any, study_name: str) -> None:
        self._engine = None
        self._path: Path | None = None
        self._key = int.from_bytes(
            hashlib.sha256(f"autoremat:{study_name}".encode()).digest()[:8], "big", signed=True)
        self._conn: Any = None
        self._fd: int | None = None
        engine = getattr(storage, "engine", None)
        dialect = getattr(getattr(engine, "dialect", None), "name", "")
        if dialect == "postgresql":
            self._engine = engine
        elif dialect == "sqlite":
            database = engine.url.database  # type: ignore[union-attr]
            if database and database != ":memory:" and not database.startswith("file:"):
                self._path = Path(f"{database}.lock")

    def __enter__(self) -> _StudyLock:
        if self._engine is not None:
            import sqlalchemy

            self._conn = self._engine.connect()
            self._conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
            self._conn.commit()
        elif self._path is not None:
            import fcntl
            import os

            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                import sqlalchemy

                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
                conn.commit()
                conn.close()
            except Exception:
                conn.invalidate()  # the session ends, and the server drops the lock
        if self._fd is not None:
            import os

            fd, self._fd = self._fd, None
            os.close(fd)  # releases the flock


def default_study_name(problem: Problem, budget_bytes: int, device_kind: str) -> str:
    """``<problem name> on <device kind> under <budget>``."""
    return f"{problem.name} on {device_kind} under {budget_bytes}B"


def _study_attrs(
    problem: Problem, budget_bytes: int, fp: str, env: dict[str, str]
) -> dict[str, Any]:
    return {
        "budget_bytes": budget_bytes,
        "problem": problem.name,
        "seq_len": problem.seq_len,
        "fingerprint": fp,
        "device_kind": env["device_kind"],
        "platform": env["platform"],
    }


def load_study(storage: str | None = None, study_name: str | None = None) -> Any:
    """Open an existing study; defaults: the last one ``tune`` ran from this folder."""
    import optuna

    if study_name is None or storage is None:
        last = last_study()
        if last is None and study_name is None:
            raise TuneError(
                f"--study-name: none given and no {LAST_STUDY_FILE} from an earlier "
                "'autoremat tune' in this folder"
            )
        if last is not None:
            storage = storage or last["storage"]
            study_name = study_name or last["study_name"]
    storage_obj = open_storage(storage)
    try:
        return optuna.load_study(study_name=study_name, storage=storage_obj)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage_obj)]
        raise TuneError(
            f"--study-name: no study {study_name!r} in {redact(storage or DEFAULT_STORAGE)}; "
            f"studies there: {', '.join(repr(n) for n in names) or 'none'}"
        ) from None


def last_study() -> dict[str, str] | None:
    """``{"storage", "study_name"}`` of the last ``tune`` run from this folder."""
    try:
        data = json.loads(LAST_STUDY_FILE.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and {"storage", "study_name"} <= data.keys():
        return {"storage": str(data["storage"]), "study_name": str(data["study_name"])}
    return None


def measured_trials(study: Any) -> list[Any]:
    """Finished trials that hold a measurement (COMPLETE, or FAIL with a reason)."""
    from optuna.trial import TrialState

    return [
        t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
        if t.user_attrs.get("measured")
    ]


def within_budget(trial: Any, budget_bytes: int) -> bool:
    """Measured, ran, and ``total_bytes <= budget_bytes``."""
    a = trial.user_attrs
    return bool(
        a.get("feasible") and a.get("step_seconds") is not None
        and a.get("total_bytes") is not None and a["total_bytes"] <= budget_bytes
    )


def choose(study: Any) -> Any | None:
    """The fastest trial within the study's budget (ties: less memory), or ``None``."""
    budget = study.user_attrs["budget_bytes"]
    fits = [t for t in measured_trials(study) if within_budget(t, budget)]
    if not fits:
        return None
    return min(fits, key=lambda t: (t.user_attrs["step_seconds"], t.user_attrs["total_bytes"],
                                    t.number))


def trial_schedule(study: Any, trial: Any) -> Schedule:
    """The trial's schedule, with ``meta`` recording what it was tuned for and measured."""
    a = trial.user_attrs
    s = study.user_attrs
    meta = {
        "problem": s.get("problem"),
        "seq_len": s.get("seq_len"),
        "fingerprint": s.get("fingerprint"),
        "device_kind": a.get("device_kind"),
        "platform": a.get("platform"),
        "jax_version": a.get("jax_version"),
        "flax_version": a.get("flax_version"),
        "budget_bytes": s.get("budget_bytes"),
        "total_bytes": a.get("total_bytes"),
        "temp_bytes": a.get("temp_bytes"),
        "step_seconds": a.get("step_seconds"),
        "compile_seconds": a.get("compile_seconds"),
        "study_name": study.study_name,
        "storage": redact(s.get("storage", "")),
        "trial": trial.number,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    return Schedule.from_data(a["schedule"]).with_meta(**meta)


def _sampler(optuna: Any, seed: int) -> Any:
    """TPE with the budget constraint (read from ``set_constraint``), 8 startup trials
    (the 4 enqueued candidates count), and a constant liar for parallel workers."""
    return optuna.samplers.TPESampler(seed=seed % 2**32, n_startup_trials=8, constant_liar=True)


def _is_measured(t: Any) -> bool:
    from optuna.trial import TrialState

    return t.state in (TrialState.COMPLETE, TrialState.FAIL) and bool(t.user_attrs.get("measured"))


def _is_claimed(t: Any) -> bool:
    from optuna.trial import TrialState

    return t.state == TrialState.RUNNING and bool(t.user_attrs.get("measuring"))


def _find_measured(trials: list[Any], key: str, exclude: int) -> int | None:
    """The number of a trial that measured (or is measuring) ``key``, if any."""
    for t in trials:
        if t.number == exclude or t.user_attrs.get("schedule_key") != key:
            continue
        if _is_measured(t) or _is_claimed(t):
            return t.number
    return None


def _progress(trials: list[Any], exclude: int | None = None) -> tuple[int, int]:
    """``(measured, being measured)``: finished trials holding a measurement, and
    running trials that have claimed a schedule (not counting ``exclude``)."""
    done = sum(1 for t in trials if _is_measured(t))
    running = sum(1 for t in trials if t.number != exclude and _is_claimed(t))
    return done, running


def tune(
    problem: Problem,
    budget_bytes: int,
    *,
    n_trials: int = 30,
    total_trials: int | None = None,
    timeout: float | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    seed: int = 0,
    out: str | Path | None = None,
    time_budget: float = 5.0,
    heartbeat: int = DEFAULT_HEARTBEAT,
    on_trial: Callable[[Any, Any], None] | None = None,
) -> TuneResult:
    """Find the fastest schedule of ``problem``'s step whose total memory fits.

    Args:
      problem: the training step (see ``autoremat.Problem``).
      budget_bytes: the memory budget, in bytes, for ``total_bytes``.
      n_trials: schedules to measure in this call (duplicates do not count).
      total_trials: stop when the study holds this many measured schedules,
        counting every worker's (``None``: no such limit). A worker whose
        remaining slots are being measured by others waits for them (or for
        them to go stale and be retried) before it returns.
      timeout: stop starting new trials after this many seconds.
      storage: an Optuna storage URL; default ``sqlite:///runs/autoremat.db``.
      study_name: resume or create this study; default from the problem,
        device and budget, so running the same command again resumes.
      seed: the sampler's seed (offset by the trials already in the study).
      out: when given and a schedule fits, write it there (atomic YAML).
      time_budget: about how long timing one schedule may take, in seconds.
      heartbeat: seconds between a running trial's heartbeats (RDB storages);
        a trial silent for ``GRACE_INTERVALS * heartbeat`` is stale: failed
        and retried.
      on_trial: called as ``on_trial(study, frozen_trial)`` after each trial.

    Returns:
      A ``TuneResult``; ``best`` is ``None`` when nothing measured fits.

    Raises:
      TuneError: the storage cannot be opened, or the named study was made
        for another problem, argument shapes, device or budget.
    """
    import optuna

    from autoremat._measure import ERROR, environment, fingerprint, measure
    from autoremat._problem import ProblemError
    from autoremat._space import seed_params, suggest

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    env = environment()
    try:
        _, args = problem.build(Schedule.plain(problem.seq_len))
    except Exception as e:
        raise ProblemError(
            f"--problem: {problem.name}: build(plain scan) failed: {type(e).__name__}: "
            f"{_one_line(e)}") from None
    fp = fingerprint(args)
    del args
    storage_url = storage or DEFAULT_STORAGE
    storage_obj = open_storage(storage_url, heartbeat=heartbeat)
    name = study_name or default_study_name(problem, budget_bytes, env["device_kind"])
    attrs = {**_study_attrs(problem, budget_bytes, fp, env), "storage": redact(storage_url)}
    lock = _StudyLock(storage_obj, name)

    try:
        study = optuna.load_study(study_name=name, storage=storage_obj)
        n_before = len(study.trials)
    except KeyError:
        study = optuna.create_study(
            study_name=name, storage=storage_obj, load_if_exists=True,
            directions=["minimize", "minimize"],
        )
        n_before = 0
    study.sampler = _sampler(optuna, seed + n_before)
    with lock:  # one worker sets the study up; the others check what it set
        user_attrs = study.user_attrs
        for k in ("budget_bytes", "problem", "fingerprint", "device_kind"):
            if k in user_attrs and user_attrs[k] != attrs[k]:
                raise TuneError(
                    f"--study-name: study {name!r} was run with {k}={user_attrs[k]!r}, "
                    f"this run has {attrs[k]!r}; use another --study-name"
                )
        if "budget_bytes" not in user_attrs:
            for k, v in attrs.items():
                study.set_user_attr(k, v)
            if not study.trials:
                for params in seed_params(problem.seq_len):
                    study.enqueue_trial(params, skip_if_exists=True)
    RUN_DIR.mkdir(exist_ok=True)
    atomic_write_text(LAST_STUDY_FILE, json.dumps({"storage": storage_url, "study_name": name}))

    raw = storage_obj if hasattr(storage_obj, "get_all_trials") else None

    def fresh_trials() -> list[Any]:
        """Every trial, read from the storage itself (not a cache)."""
        if raw is not None:
            return raw.get_all_trials(study._study_id, deepcopy=False)
        return study.get_trials(deepcopy=False)

    counts = {"measured": 0, "duplicates_in_a_row": 0, "attempts": 0}

    def claim(trial: optuna.Trial, key: str) -> None:
        """Claim ``key`` for this trial, or prune it (duplicate, or the total is reached)."""
        with lock:
            trials = fresh_trials()
            dup = _find_measured(trials, key, trial.number)
            if dup is not None:
                trial.set_user_attr("duplicate_of", dup)
                raise optuna.TrialPruned(f"schedule already measured in trial {dup}")
            if total_trials is not None:
                done, running = _progress(trials, exclude=trial.number)
                if done + running >= total_trials:
                    trial.set_user_attr("total_reached", total_trials)
                    raise optuna.TrialPruned(f"the study has its {total_trials} trials")
            trial.set_user_attr("measuring", True)

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        schedule = suggest(trial, problem.seq_len, env["platform"])
        key = schedule.key()
        trial.set_user_attr("schedule_key", key)
        trial.set_user_attr("schedule", schedule.to_data())
        trial.set_user_attr("describe", schedule.describe())
        claim(trial, key)
        m = measure(problem, schedule, budget_bytes=budget_bytes, time_budget=time_budget)
        for k, v in m.to_attrs().items():
            trial.set_user_attr(k, v)
        trial.set_user_attr("measured", True)
        if m.total_bytes is not None:
            trial.set_constraint("memory", float(m.total_bytes - budget_bytes))
        if m.status == ERROR or m.total_bytes is None:
            raise MeasurementFailed(m.reason)
        return float(m.total_bytes), (m.step_seconds if m.step_seconds is not None else math.inf)

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.user_attrs.get("measured"):
            counts["measured"] += 1
            counts["duplicates_in_a_row"] = 0
        elif "duplicate_of" in trial.user_attrs:
            counts["duplicates_in_a_row"] += 1
        if on_trial is not None:
            on_trial(study, trial)

    def fail_stale() -> None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)

    heartbeats = raw is not None and getattr(raw, "heartbeat_interval", None) is not None
    deadline = None if timeout is None else time.monotonic() + timeout
    max_attempts = n_trials * 10 + _MAX_DUPLICATES_IN_A_ROW
    interrupted = False
    verbosity = optuna.logging.get_verbosity()
    # A failed schedule is a FAIL trial with its reason in user_attrs (and on_trial);
    # Optuna's own warning would print the MeasurementFailed traceback.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        while (counts["measured"] < n_trials and counts["attempts"] < max_attempts
               and counts["duplicates_in_a_row"] < _MAX_DUPLICATES_IN_A_ROW):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            if total_trials is not None:
                if heartbeats:
                    fail_stale()
                done, running = _progress(fresh_trials())
                if done >= total_trials:
                    break
                if done + running >= total_trials:
                    if not heartbeats:
                        break
                    # Others are measuring the last slots: wait for them to finish or
                    # go stale (then their retry is ours to run).
                    time.sleep(min(1.0, heartbeat / 4) if left is None else
                               max(0.0, min(1.0, heartbeat / 4, left)))
                    continue
            counts["attempts"] += 1
            study.optimize(objective, n_trials=1, timeout=left, catch=(MeasurementFailed,),
                           callbacks=[callback], gc_after_trial=False)
        if heartbeats:
            fail_stale()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        optuna.logging.set_verbosity(verbosity)
    return _result(study, storage_url, counts["measured"], interrupted, out)


def summarize(study: Any, storage: str, *, out: str | Path | None = None) -> TuneResult:
    """The ``TuneResult`` of an existing study (nothing is measured)."""
    return _result(study, storage, 0, False, out)


def _result(study: Any, storage: str, measured: int, interrupted: bool,
            out: str | Path | None) -> TuneResult:
    budget = study.user_attrs["budget_bytes"]
    trials = measured_trials(study)
    best_trial = choose(study)
    best = trial_schedule(study, best_trial) if best_trial is not None else None
    if best is not None and out is not None:
        try:
            save_schedule(best, out)
        except OSError as e:
            raise TuneError(
                f"--out: cannot write {str(out)!r} ({e.strerror or e}); the study is kept: "
                f"'autoremat export {best_trial.number} --out FILE' writes this schedule"
            ) from None
    plain_key = Schedule.plain(study.user_attrs["seq_len"]).key()
    plain = next((t for t in trials if t.user_attrs.get("schedule_key") == plain_key), None)
    sized = [t for t in trials if t.user_attrs.get("total_bytes") is not None]
    smallest = min(sized, key=lambda t: t.user_attrs["total_bytes"]) if sized else None

    def attrs(t: Any) -> dict[str, Any] | None:
        return None if t is None else {**t.user_attrs, "number": t.number}

    return TuneResult(
        study_name=study.study_name, storage=storage, budget_bytes=budget, best=best,
        best_attrs=attrs(best_trial), plain_attrs=attrs(plain), smallest_attrs=attrs(smallest),
        measured=measured, n_trials=len(study.trials), interrupted=interrupted,
    )


def nothing_fits_message(result: TuneResult) -> str:
    """One line: the budget, and the smallest total measured with its schedule."""
    s = result.smallest_attrs
    if s is None:
        return (f"nothing fits in {format_bytes(result.budget_bytes)}: no schedule could be "
                "measured (see the trials' 'reason')")
    return (
        f"nothing fits in {format_bytes(result.budget_bytes)} ({result.budget_bytes} bytes): "
        f"the smallest total measured is {format_bytes(s['total_bytes'])} "
        f"({s['total_bytes']} bytes), trial {s['number']}: {s.get('describe', s['schedule_key'])}"
    )
