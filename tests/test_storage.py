"""``autoremat._search.storage``: a trial's attrs written together, and read back as written;
the Optuna internals that needs, where this Optuna keeps them; Optuna's log level restored."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import sqlalchemy

from autoremat._search.storage import (
    OPTUNA_INTERNALS,
    missing_internals,
    optuna_verbosity,
    set_user_attrs,
    trials_of,
)

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
    assert len(OPTUNA_INTERNALS) == 6


def test_an_in_memory_trial_lacks_the_rdb_backend() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    missing = missing_internals(optuna.create_study().ask())
    assert missing == [name for name in OPTUNA_INTERNALS if name.startswith("Study.storage")]


def test_trials_are_read_from_the_storage_itself(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    mine = optuna.create_study(storage=url, study_name="s")
    other = optuna.create_study(storage=url, study_name="t")
    other.tell(other.ask(), 1.0)
    theirs = optuna.load_study(study_name="s", storage=url)  # another worker's
    theirs.tell(theirs.ask(), 2.0)
    storage = optuna.storages.RDBStorage(url)
    assert [t.values for t in trials_of(storage, mine)] == [[2.0]]


def test_optunas_log_level_is_set_for_the_block_and_restored() -> None:
    optuna.logging.set_verbosity(optuna.logging.INFO)
    with optuna_verbosity(optuna.logging.ERROR):
        assert optuna.logging.get_verbosity() == optuna.logging.ERROR
    assert optuna.logging.get_verbosity() == optuna.logging.INFO
    with pytest.raises(KeyError), optuna_verbosity(optuna.logging.ERROR):
        raise KeyError("x")
    assert optuna.logging.get_verbosity() == optuna.logging.INFO
    optuna.logging.set_verbosity(optuna.logging.WARNING)
