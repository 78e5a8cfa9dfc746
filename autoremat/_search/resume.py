"""Opening a tune study: create it, or resume it after checking it was made for this run.

The first worker on a study name creates the study, records what it is for
(``StudyInfo``: problem, argument fingerprint, device, budget) and enqueues
the seed schedules (``space.seeds``: the obvious candidates, always
measured first). A later worker -- or a later ``tune`` resuming the study --
checks that what it records matches, so a study never mixes problems,
devices or budgets. The search itself is ``autoremat._search.tune``.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Final

from autoremat._errors import TuneError
from autoremat._search.attrs import SCHEDULE
from autoremat._search.space import seeds
from autoremat._search.storage import StudyLock
from autoremat._search.study import MATCHED_STUDY_ATTRS, StudyInfo

if TYPE_CHECKING:
    import optuna
    from optuna.storages import RDBStorage


#: The study's two objectives, as ``tune`` reports them: compiled total bytes, step seconds.
METRIC_NAMES: Final = ("total_bytes", "step_seconds")


def default_study_name(info: StudyInfo) -> str:
    """``<problem name> on <device kind> under <budget>``."""
    return f"{info.problem} on {info.device_kind or ''} under {info.budget_bytes}B"


def open_study(storage: RDBStorage, name: str, info: StudyInfo, lock: StudyLock,
               layer_stack: bool = False) -> optuna.Study:
    """Load or create the study; the first worker records ``info`` and enqueues the
    seed schedules (a ``layer_stack``'s: ``space.seeds``), the others check that ``info``
    matches what it recorded."""
    import optuna

    # Nothing is sampled (a trial measures what the planner chose, or the schedule it was
    # enqueued with): Optuna's default sampler, asked for no parameter, does nothing.
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True,
                                    directions=["minimize", "minimize"])
    attrs = info.to_attrs()
    with lock:  # one worker sets the study up; the others check what it set
        recorded = study.user_attrs
        for k in MATCHED_STUDY_ATTRS:
            if k in recorded and recorded[k] != attrs[k]:
                raise TuneError(
                    f"study_name: study {name!r} was run with {k}={recorded[k]!r}, "
                    f"this run has {attrs[k]!r}; use another study name"
                )
        if "budget_bytes" not in recorded:
            # Optuna's own tools (optuna-dashboard, plot_pareto_front) name the axes by these.
            with warnings.catch_warnings():  # experimental since Optuna 3.2; stable in use
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(list(METRIC_NAMES))
            for k, v in attrs.items():
                study.set_user_attr(k, v)
            if not study.trials:
                for schedule, _ in seeds(info.seq_len, info.platform or "",
                                         fuse=info.fuse_choice, layer_stack=layer_stack):
                    study.enqueue_trial({}, user_attrs={SCHEDULE: schedule.to_data()})
    return study
