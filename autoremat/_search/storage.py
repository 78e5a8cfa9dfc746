"""Where studies live: Optuna storages, stale-trial retries, and a lock across workers.

* Storage: any Optuna (SQLAlchemy) storage URL; default an SQLite file
  ``runs/autoremat.db`` (``runs/`` is ignored by git).
* Crashes: RDB storages get a heartbeat (every ``heartbeat`` seconds; a trial
  silent for ``GRACE_INTERVALS * heartbeat`` seconds is stale) and a retry
  callback (``RetryStaleTrial``): the stale trial is marked FAIL and re-queued
  (at most ``MAX_RETRIES`` times) with the same parameters.
* Many workers: a worker claims a schedule under ``StudyLock``, held across
  processes (a PostgreSQL advisory lock, or ``flock`` on ``<file>.lock`` for
  SQLite; the server or the kernel drops it when its holder dies).
* A trial's attrs are written together (``set_user_attrs``): one transaction of a few
  statements where the storage is Optuna's RDB storage. This is the one module that uses Optuna's
  internals (``OPTUNA_INTERNALS``); ``tests/test_storage.py`` fails when an Optuna
  moves one. Elsewhere the package uses Optuna's public API only.
* Optuna's log level is a process-wide setting: ``optuna_verbosity`` sets it for a
  block and restores the caller's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from autoremat._errors import TuneError, one_line
from autoremat._search.attrs import MEASURING, RETRY_OF, RETRY_REASON

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    import optuna
    import sqlalchemy
    from optuna.distributions import BaseDistribution
    from optuna.storages import BaseStorage, RDBStorage
    from optuna.trial import FrozenTrial

DEFAULT_STORAGE: Final = "sqlite:///runs/autoremat.db"
DEFAULT_HEARTBEAT: Final = 60
#: A trial whose worker sent no heartbeat for this many intervals is stale.
GRACE_INTERVALS: Final = 3
MAX_RETRIES: Final = 2
#: The Optuna internals ``set_user_attrs`` and ``set_params`` use (Optuna 5.0-5.1), each
#: checked by ``missing_internals``; where one is missing they write one by one.
OPTUNA_INTERNALS: Final = (
    "optuna.storages._rdb.models.TrialUserAttributeModel.where_trial_id",
    "optuna.storages._rdb.storage._create_scoped_session",
    "optuna.storages._rdb.models.TrialModel.find_or_raise_by_id",
    "Study.storage._backend (the RDB storage under Optuna's cache)",
    "Trial._cached_frozen_trial",
    "Trial._trial_id",
    "optuna.storages._rdb.models.TrialParamModel",
)


def redact(url: str) -> str:
    """A storage URL with any password replaced by ``***``."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


@contextlib.contextmanager
def optuna_verbosity(level: int) -> Iterator[None]:
    """Optuna's log level set to ``level`` (``optuna.logging.WARNING``, ...) for the
    block, and set back to the caller's after it, however the block ends."""
    import optuna

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(level)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def sqlite_file(url: str) -> Path | None:
    """The file an SQLite URL names (``sqlite:///runs/autoremat.db``: ``runs/autoremat.db``,
    relative to the current folder); ``None`` for an in-memory or another database."""
    if not url.startswith("sqlite:///"):
        return None
    name = url.removeprefix("sqlite:///").split("?", 1)[0]
    return None if name in ("", ":memory:") else Path(name)


def open_storage(url: str | None = None, *, heartbeat: int = DEFAULT_HEARTBEAT) -> RDBStorage:
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
        raise TuneError(f"storage: expected a storage URL string, got {url!r}")
    if isinstance(heartbeat, bool) or not isinstance(heartbeat, int) or heartbeat < 1:
        raise TuneError(f"heartbeat: expected whole seconds >= 1, got {heartbeat!r}")
    path = sqlite_file(url)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (OSError, ValueError) as e:
            raise TuneError(f"storage: cannot create the folder of {str(path)!r} ({e})"
                            ) from None
    for attempt in range(6):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, heartbeat_interval=heartbeat,
                    grace_period=GRACE_INTERVALS * heartbeat, **_retry_callback())
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as e:
            # Workers starting together on an empty database race to create
            # Optuna's tables; the losers find them made on the next try.
            if attempt == 5:
                raise TuneError(f"storage: cannot open {redact(url)}: {one_line(e)}") from None
            time.sleep(0.2 * (attempt + 1) + random.random() * 0.2)
        except Exception as e:
            raise TuneError(
                f"storage: cannot open {redact(url)}: {one_line(e)}"
            ) from None
    raise AssertionError("unreachable")  # pragma: no cover


def _retry_callback() -> dict[str, Any]:
    """``RetryStaleTrial`` under the keyword this Optuna takes.

    Optuna >= 4.9 names it ``heartbeat_stale_trial_callback``; older ones
    ``failed_trial_callback``.
    """
    import inspect

    import optuna

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

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        import optuna

        history = [*trial.system_attrs.get("retry_history", []), trial.number]
        if len(history) > self.max_retry:
            return
        system_attrs = {**trial.system_attrs, "failed_trial": history[0],
                        "retry_history": history}
        user_attrs = {k: v for k, v in trial.user_attrs.items() if k != MEASURING}
        user_attrs[RETRY_OF] = trial.number
        user_attrs[RETRY_REASON] = "its worker stopped sending heartbeats (killed or lost)"
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.WAITING, params=trial.params,
            distributions=trial.distributions, user_attrs=user_attrs, system_attrs=system_attrs,
        ))


class StudyLock:
    """A lock on one study, held across processes while a worker claims a schedule.

    PostgreSQL: a session-level advisory lock on a connection of its own;
    SQLite (a file): ``flock`` on ``<file>.lock``. Both are released by the
    server or the kernel when the holder dies. Other storages (in-memory,
    one process) need none; other RDB servers get none (dedupe there is
    best-effort, as it is in plain Optuna).
    """

    def __init__(self, storage: BaseStorage, study_name: str) -> None:
        self._engine: sqlalchemy.engine.Engine | None = None
        self._path: Path | None = None
        self._key = int.from_bytes(
            hashlib.sha256(f"autoremat:{study_name}".encode()).digest()[:8], "big", signed=True)
        self._conn: sqlalchemy.engine.Connection | None = None
        self._fd: int | None = None
        engine = getattr(storage, "engine", None)
        dialect = getattr(getattr(engine, "dialect", None), "name", "")
        if dialect == "postgresql":
            self._engine = engine
        elif dialect == "sqlite":
            database = engine.url.database if engine is not None else None
            if database and database != ":memory:" and not database.startswith("file:"):
                self._path = Path(f"{database}.lock")

    def __enter__(self) -> StudyLock:
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


def set_user_attrs(trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
    """``trial.set_user_attr`` of each of ``attrs``, in one transaction where the study's
    storage is Optuna's RDB storage: there each ``set_user_attr`` is a transaction and a
    commit of its own, and a measured trial writes some 40 (seconds of a tune on a slow
    disk; one transaction writes them in the time of about two). Elsewhere, or where this
    Optuna lacks one of ``OPTUNA_INTERNALS``, one by one. What the trial's ``user_attrs``
    read back is the same either way.

    The transaction reads the trial and its attrs once and adds the new ones together:
    three statements where Optuna's own writer issues two for each attr. On an
    accelerator each statement lets the compile threads take the interpreter, and the
    main thread waits for it back (``studies/results/storage_gil.md``)."""
    write = _rdb_writer(trial)
    if write is None:
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return
    write(dict(attrs))


def set_params(trial: optuna.Trial, params: Mapping[str, tuple[Any, BaseDistribution]]) -> None:
    """Record each ``(value, distribution)`` of ``params`` as the running trial's Optuna
    param, as ``trial.suggest_*`` does (storage, then the trial's cached copy), without
    sampling; in one transaction as ``set_user_attrs``. One another trial holds with
    another distribution is left out, and all where this Optuna lacks ``Trial._trial_id``
    or ``Trial._cached_frozen_trial``: a view for Optuna's tools the search never reads."""
    trial_id = getattr(trial, "_trial_id", None)
    cached = getattr(trial, "_cached_frozen_trial", None)
    storage = getattr(trial, "storage", None)
    if not isinstance(trial_id, int) or cached is None or storage is None:
        return
    write = _rdb_params_writer(trial)
    if write is not None:
        written = write(params)
    else:
        written = set()
        for name, (value, distribution) in params.items():
            try:
                storage.set_trial_param(trial_id, name, distribution.to_internal_repr(value),
                                        distribution)
            except ValueError:
                continue
            written.add(name)
    for name in written:
        cached.distributions[name], cached.params[name] = params[name][1], params[name][0]


def missing_internals(trial: optuna.Trial) -> list[str]:
    """Those of ``OPTUNA_INTERNALS`` that this Optuna lacks, for a trial of a study on an
    RDB storage (``[]``: ``set_user_attrs`` writes in one transaction)."""
    try:
        from optuna.storages._rdb import models
        from optuna.storages._rdb import storage as rdb
    except ImportError:
        return [OPTUNA_INTERNALS[0], OPTUNA_INTERNALS[1]]
    storage = getattr(trial, "storage", None)
    found = {
        OPTUNA_INTERNALS[0]: hasattr(getattr(models, "TrialUserAttributeModel", None),
                                     "where_trial_id"),
        OPTUNA_INTERNALS[1]: hasattr(rdb, "_create_scoped_session"),
        OPTUNA_INTERNALS[2]: hasattr(getattr(models, "TrialModel", None), "find_or_raise_by_id"),
        OPTUNA_INTERNALS[3]: isinstance(getattr(storage, "_backend", None), rdb.RDBStorage),
        OPTUNA_INTERNALS[4]: getattr(trial, "_cached_frozen_trial", None) is not None,
        OPTUNA_INTERNALS[5]: isinstance(getattr(trial, "_trial_id", None), int),
        OPTUNA_INTERNALS[6]: hasattr(models, "TrialParamModel"),
    }
    return [name for name, ok in found.items() if not ok]


def _rdb_backend(trial: optuna.Trial) -> Any:
    """The RDB storage under ``trial``'s cache; ``None``: none, or an internal missing."""
    from optuna.storages import RDBStorage

    storage = getattr(trial, "storage", None)
    backend = getattr(storage, "_backend", storage)
    if not isinstance(backend, RDBStorage) or missing_internals(trial):
        return None
    return backend


def _rdb_writer(trial: optuna.Trial) -> Any:
    """A function writing a mapping of user attrs to ``trial`` in one transaction, in one
    of Optuna's sessions, with Optuna's models and its check that the trial is not
    finished; ``None`` where the storage is not an RDB storage or this Optuna lacks one of
    ``OPTUNA_INTERNALS``."""
    backend = _rdb_backend(trial)
    if backend is None:
        return None
    import sqlalchemy
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    cached = trial._cached_frozen_trial
    trial_id = trial._trial_id

    def write(attrs: dict[str, Any]) -> None:
        with _create_scoped_session(backend.scoped_session) as session:
            row = models.TrialModel.find_or_raise_by_id(trial_id, session)
            backend.check_trial_is_updatable(trial_id, row.state)  # as Optuna's writer
            held = {a.key: a for a in models.TrialUserAttributeModel.where_trial_id(
                trial_id, session)}
            new = []
            for key, value in attrs.items():
                text = json.dumps(value)  # Optuna's encoding of a user attr
                if key in held:
                    held[key].value_json = text
                else:
                    new.append({"trial_id": trial_id, "key": key, "value_json": text})
            if new:  # one statement of many rows: the ORM would send one a row
                session.execute(sqlalchemy.insert(models.TrialUserAttributeModel).values(new))
        cached.user_attrs.update(attrs)  # as ``Trial.set_user_attr`` keeps it

    return write


def _rdb_params_writer(trial: optuna.Trial) -> Any:
    """A function recording params in one transaction of four statements (Optuna's: three
    a param, each its own commit), returning the names written (``None``: no
    ``_rdb_backend``). As Optuna's, a name the trial holds is kept, and one another trial
    holds with an incompatible distribution is left out."""
    backend = _rdb_backend(trial)
    if backend is None:
        return None
    import sqlalchemy
    from optuna.distributions import (
        check_distribution_compatibility,
        distribution_to_json,
        json_to_distribution,
    )
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    trial_id = trial._trial_id
    model = models.TrialParamModel

    def write(params: Mapping[str, tuple[Any, BaseDistribution]]) -> set[str]:
        with _create_scoped_session(backend.scoped_session) as session:
            row = models.TrialModel.find_or_raise_by_id(trial_id, session)
            backend.check_trial_is_updatable(trial_id, row.state)
            own = {n for (n,) in session.query(model.param_name).filter(
                model.trial_id == trial_id)}
            held = dict(session.query(model.param_name, sqlalchemy.func.min(
                model.distribution_json)).join(models.TrialModel).filter(
                models.TrialModel.study_id == row.study_id,
                model.param_name.in_(list(params))).group_by(model.param_name))
            rows: list[dict[str, Any]] = []
            for name, (value, distribution) in params.items():
                if name in own:
                    continue
                if name in held:
                    try:
                        check_distribution_compatibility(json_to_distribution(held[name]),
                                                         distribution)
                    except ValueError:
                        continue
                rows.append({"trial_id": trial_id, "param_name": name,
                             "param_value": distribution.to_internal_repr(value),
                             "distribution_json": distribution_to_json(distribution)})
            if rows:
                session.execute(sqlalchemy.insert(model).values(rows))
        return {r["param_name"] for r in rows}

    return write
