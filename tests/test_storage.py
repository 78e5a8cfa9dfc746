"""``autoremat._search.storage``: a trial's attrs written together, and read back as written."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import sqlalchemy

from autoremat._search.storage import set_user_attrs

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
