"""``autoremat._search.storage``: a trial's attrs written together, and read back as written;
the Optuna internals that needs, where this Optuna keeps them; Optuna's log level restored."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import sqlalchemy
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from autoremat._search.storage import (
    OPTUNA_INTERNALS,
    missing_internals,
    optuna_verbosity,
    set_params,
    set_user_attrs,
)
from autoremat._search.worker import Worker

ATTRS = {"schedule_key": "k", "status": "ok", "step_seconds": 0.25,
         "argument_parts": [["params", 12]], "feasible": True, "reason": ""}


def test_a_trials_attrs_are_one_commit_on_an_rdb_storage(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'a.db'}")
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    commits: list[int] = []
    sqlalchemy.event.listen(storage.engine, "commit", lambda _: commits.append(1))
    set_user_attrs(trial, ATTRS)
    assert len(commits) == 1  # one by one: one commit each
    assert trial.user_attrs == ATTRS  # the running trial sees them, as set_user_attr's
    study.tell(trial, 1.0)
    assert optuna.load_study(study_name="s", storage=storage).trials[0].user_attrs == ATTRS


def test_elsewhere_they_are_set_one_by_one() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()  # in memory: no transactions
    trial = study.ask()
    set_user_attrs(trial, ATTRS)
    study.tell(trial, 1.0)
    assert study.trials[0].user_attrs == ATTRS


def test_a_finished_trial_still_refuses_them(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'a.db'}"))
    trial = study.ask()
    study.tell(trial, 1.0)
    with pytest.raises(RuntimeError):  # as Optuna's set_user_attr
        set_user_attrs(trial, ATTRS)


def test_this_optuna_keeps_every_internal_the_one_transaction_uses(tmp_path: Path) -> None:
    # Fails when an Optuna moves one: set_user_attrs would then write one by one.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'a.db'}")
    assert missing_internals(study.ask()) == []
    assert len(OPTUNA_INTERNALS) == 7


def test_an_in_memory_trial_lacks_the_rdb_backend() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    missing = missing_internals(optuna.create_study().ask())
    assert missing == [name for name in OPTUNA_INTERNALS if name.startswith("Study.storage")]


def test_a_workers_reads_see_another_workers_claims_trials_and_ends(tmp_path: Path) -> None:
    # The worker reads through Optuna's cache: it must still see what another process
    # wrote after its last read -- a claim on a running trial, a new trial, an end.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    mine = optuna.create_study(storage=url, study_name="s")
    mine.tell(mine.ask(), 1.0)
    worker = SimpleNamespace(study=mine)
    theirs = optuna.load_study(study_name="s", storage=url)  # another worker's process
    running = theirs.ask()
    assert [t.state for t in Worker.fresh_trials(worker)] == [TrialState.COMPLETE,
                                                             TrialState.RUNNING]
    set_user_attrs(running, {"measuring": True})
    added = theirs.ask()
    (seen,) = [t for t in Worker.fresh_trials(worker) if t.number == running.number]
    assert seen.user_attrs == {"measuring": True}
    theirs.tell(running, 2.0)
    theirs.tell(added, 3.0)
    assert [t.values for t in Worker.fresh_trials(worker)] == [[1.0], [2.0], [3.0]]
    assert [t.number for t in mine.get_trials()] == [0, 1, 2]  # Optuna's own, deep copies


def test_a_trials_attrs_are_three_statements_however_many(tmp_path: Path) -> None:
    # Each statement lets another thread take the interpreter: a measured trial's forty
    # attrs were eighty statements, each a wait beside the compile threads.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'a.db'}")
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    set_user_attrs(trial, {"schedule_key": "old"})
    statements: list[str] = []
    sqlalchemy.event.listen(storage.engine, "before_cursor_execute",
                            lambda *a: statements.append(a[2]))
    many = {**ATTRS, **{f"figure_{i}": i for i in range(40)}}
    set_user_attrs(trial, many)
    assert len(statements) <= 4  # the trial, its attrs, the new ones; the one changed
    study.tell(trial, 1.0)
    assert optuna.load_study(study_name="s", storage=storage).trials[0].user_attrs == many


def _params_twice(study: optuna.Study) -> list[dict[str, object]]:
    """Two trials' params; the second's ``b`` is refused (another distribution)."""
    first, second = [{"a": (3, IntDistribution(1, 10)), "b": ("x", CategoricalDistribution(c))}
                     for c in (["x", "y"], ["x", "z"])]
    seen = []
    for params in (first, second):
        trial = study.ask()
        set_params(trial, params)
        seen.append(trial.params)
        study.tell(trial, 1.0)
    return [*seen, *(t.params for t in study.trials)]


def test_params_are_one_transaction_and_read_back_as_optunas_own(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'a.db'}")
    commits: list[int] = []
    sqlalchemy.event.listen(storage.engine, "commit", lambda _: commits.append(1))
    study = optuna.create_study(storage=storage, study_name="s")
    before = len(commits)
    trial = study.ask()
    asked = len(commits)
    set_params(trial, {"a": (3, IntDistribution(1, 10)), "c": (0.5, FloatDistribution(0, 1))})
    assert len(commits) - asked == 1 and asked > before
    study.tell(trial, 1.0)
    reference = _params_twice(optuna.create_study())  # in memory: Optuna's per-param path
    assert _params_twice(study) == [reference[0], reference[1],
                                    {"a": 3, "c": 0.5}, reference[2], reference[3]]
    assert reference[1] == {"a": 3}  # the refused one is left out there too


def test_optunas_log_level_is_set_for_the_block_and_restored() -> None:
    optuna.logging.set_verbosity(optuna.logging.INFO)
    with optuna_verbosity(optuna.logging.ERROR):
        assert optuna.logging.get_verbosity() == optuna.logging.ERROR
    assert optuna.logging.get_verbosity() == optuna.logging.INFO
    with pytest.raises(KeyError), optuna_verbosity(optuna.logging.ERROR):
        raise KeyError("x")
    assert optuna.logging.get_verbosity() == optuna.logging.INFO
    optuna.logging.set_verbosity(optuna.logging.WARNING)
