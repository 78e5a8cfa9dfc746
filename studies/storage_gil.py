"""One trial's storage work as the search does it, before and after, beside tracing threads.

A tune's main thread records each trial in an Optuna SQLite study while compile threads
trace the next schedules in Python (``autoremat._search.planning.compile_pool``). SQLite
lets the GIL go on every statement and on every row it returns, and each time the main
thread waits for it back. This script times one trial's storage work, as the worker does
it, two ways in one process, in turn:

* **before**: the study read whole from the storage three times (the plan, the claim, the
  kept pick), a trial's attrs and params written by Optuna's own per-attr and per-param
  writers;
* **after**: the study read through Optuna's cache (``study.get_trials``: the trials not
  finished and those added since) twice, the attrs and params in one transaction each
  (``autoremat._search.storage.set_user_attrs`` and ``set_params``), the constraint set
  before the figures.

Both ask and tell a trial the same way. Each is timed alone, then beside threads tracing a
small step (``jax.jit(...).lower``) in a loop, in a study already holding ``--trials``
trials of some 45 attrs each (a seed tune's) -- at Python's switch interval (5 ms) and
at a tenth of it: each time SQLite lets the GIL go, the main thread waits up to the
interval to have it back. (The shorter interval is not the search's: on a TPU it gave the
main thread's storage work what it took from the compile threads' Python,
``studies/results/tune_time_v5e_workers.md``.)

Run it anywhere (no device needed): ``python studies/storage_gil.py``; it writes
``studies/results/storage_gil.md``. What the change did to whole tunes on a TPU:
``studies/results/tune_time_v5e_workers.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autoremat._atomic import atomic_write_text
from autoremat._search.storage import set_params, set_user_attrs

RESULTS = Path(__file__).parent / "results" / "storage_gil.md"
#: A measured trial's figures: some 40 attrs (``Measurement.to_attrs``).
FIGURES = {f"figure_{i}": i * 1.5 for i in range(40)}
#: A claim's attrs.
CLAIM = {"schedule_key": "k", "schedule": {"kind": "nested"}, "describe": "d", "measuring": True}


def _params() -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    return {**{f"d{i}": (1, IntDistribution(1, 10)) for i in range(6)},
            "kind": ("nested", CategoricalDistribution(["nested", "binomial"]))}


def _old_attrs(trial: Any, attrs: dict[str, Any]) -> None:
    """Optuna's own writer, one attr at a time (in one session, as before)."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    backend = trial.storage._backend
    with _create_scoped_session(backend.scoped_session) as session:
        for key, value in attrs.items():
            backend._set_trial_attr_without_commit(session, models.TrialUserAttributeModel,
                                                   trial._trial_id, key, value)


def _old_params(trial: Any, params: dict[str, Any]) -> None:
    """Optuna's own writer, one param a transaction (as before)."""
    for name, (value, distribution) in params.items():
        trial.storage.set_trial_param(trial._trial_id, name,
                                      distribution.to_internal_repr(value), distribution)


def _trial(study: Any, raw: Any, study_id: int, after: bool) -> None:
    """One trial's storage work (module doc)."""
    trial = study.ask()
    read = ((lambda: study.get_trials(deepcopy=False)) if after
            else (lambda: raw.get_all_trials(study_id, deepcopy=False)))
    read()  # the plan
    read()  # the claim
    (set_user_attrs if after else _old_attrs)(trial, CLAIM)
    (set_params if after else _old_params)(trial, _params())
    if after:
        trial.set_constraint("memory", -1.0)
    (set_user_attrs if after else _old_attrs)(trial, FIGURES)
    if not after:
        read()  # the kept pick
        trial.set_constraint("memory", -1.0)
    study.tell(trial, [1.0, 2.0])


def _tracing(stop: threading.Event) -> None:
    """Lower a small step again and again (a compile thread's Python)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((8, 8))
    while not stop.is_set():
        jax.jit(lambda a: jnp.tanh(a @ a).sum()).lower(x)


def measure(trials: int, threads: int, repeats: int,
            interval: float | None = None) -> dict[str, list[float]]:
    """Seconds of one trial's storage work, before and after, in turn; ``interval``:
    Python's switch interval meanwhile (``None``: as it is)."""
    import optuna

    with _switch_interval(interval):
        return _measure(optuna, trials, threads, repeats)


@contextlib.contextmanager
def _switch_interval(interval: float | None) -> Iterator[None]:
    before = sys.getswitchinterval()
    if interval is not None:
        sys.setswitchinterval(interval)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _measure(optuna: Any, trials: int, threads: int, repeats: int) -> dict[str, list[float]]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with tempfile.TemporaryDirectory() as folder:
        raw = optuna.storages.RDBStorage(f"sqlite:///{folder}/study.db")
        study = optuna.create_study(storage=raw, directions=["minimize", "minimize"])
        study_id = raw.get_study_id_from_name(study.study_name)
        for _ in range(trials):
            _trial(study, raw, study_id, after=True)
        stop = threading.Event()
        workers = [threading.Thread(target=_tracing, args=(stop,), daemon=True)
                   for _ in range(threads)]
        for w in workers:
            w.start()
        out: dict[str, list[float]] = {"before": [], "after": []}
        try:
            for _ in range(repeats):
                for name in ("before", "after"):
                    t0 = time.perf_counter()
                    _trial(study, raw, study_id, after=name == "after")
                    out[name].append(time.perf_counter() - t0)
        finally:
            stop.set()
            for w in workers:
                w.join()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=13, help="trials in the study first (13)")
    p.add_argument("--repeats", type=int, default=5, help="trials timed each way (5)")
    p.add_argument("--threads", default="0,1,2", help="tracing threads beside (0,1,2)")
    p.add_argument("--switch", default="0.005,0.0005",
                   help="Python's switch intervals, seconds (Python's own: 0.005)")
    args = p.parse_args()
    import os

    rows = []
    for n in (int(x) for x in args.threads.split(",")):
        for interval in (float(x) for x in args.switch.split(",")):
            got = measure(args.trials, n, args.repeats, interval)
            before, after = (statistics.median(got[k]) for k in ("before", "after"))
            rows.append(f"| {n} | {interval * 1e3:g} ms | {before * 1e3:.0f} ms | "
                        f"{after * 1e3:.0f} ms | **{after / before:.2f}** |")
            print(rows[-1], flush=True)
    import jax
    import optuna
    import sqlalchemy

    text = "\n".join([
        "# One trial's storage work beside tracing threads (`studies/storage_gil.py`)", "",
        f"`python studies/storage_gil.py` on {os.cpu_count()} cores, jax {jax.__version__}, "
        f"optuna {optuna.__version__}, SQLAlchemy {sqlalchemy.__version__}; a study of "
        f"{args.trials} trials first; the median of {args.repeats} trials each way, in turn. "
        "*before*: the whole study read three times, Optuna's per-attr and per-param writers; "
        "*after*: the study read through Optuna's cache twice, attrs and params in one "
        "transaction each (the module doc says what each does). *switch interval*: Python's "
        "(`sys.setswitchinterval`) while it runs: 5 ms is Python's own.", "",
        "| tracing threads | switch interval | before | after | after / before |",
        "|---|---|---|---|---|", *rows, ""])
    atomic_write_text(RESULTS, text)


if __name__ == "__main__":
    main()
