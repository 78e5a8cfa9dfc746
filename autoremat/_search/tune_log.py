"""What ``tune`` says while it runs, from Python: each trial, each full-length timing and
the answer on the ``autoremat`` logger (``logging``, level INFO: shown once the caller
configures logging, e.g. ``logging.basicConfig(level=logging.INFO)``), and, when asked
(``tune(..., progress=True)``), a tqdm bar over the trials (``tqdm.auto``: a widget in a
notebook). The command line draws its own bar (``autoremat._cli.printing``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from autoremat._search.attrs import COMPILE_FAILED
from autoremat._search.reports import TuneEvent
from autoremat._search.study import MeasuredTrial, TuneResult
from autoremat._units import format_bytes, format_seconds

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from autoremat._search.worker import OnTrial

#: The logger ``tune`` writes to.
LOGGER: Final = logging.getLogger("autoremat")


class TuneLog:
    """``tune``'s ``on_trial`` and ``on_confirm``: each logged, counted on the bar (when
    ``progress``), then handed to the caller's own."""

    def __init__(self, total: int | None, progress: bool, on_trial: OnTrial | None,
                 on_confirm: Callable[[TuneEvent], None] | None) -> None:
        self.bar: Any = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="tune", unit="schedule")
        self.caller_trial, self.caller_confirm = on_trial, on_confirm

    def on_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        done = MeasuredTrial.of(trial)
        if done is not None:
            m = done.measurement
            state = "cut" if m.cut else ("fits" if m.feasible else m.status)
            LOGGER.info("trial %d %s: %s, total %s, step %s", trial.number,
                        done.schedule.describe(), state, format_bytes(m.total_bytes),
                        format_seconds(m.step_seconds))
            if self.bar is not None and not trial.user_attrs.get(COMPILE_FAILED):
                self.bar.update(1)
                self.bar.set_postfix_str(f"last #{trial.number} {state}")
        if self.caller_trial is not None:
            self.caller_trial(study, trial)

    def on_confirm(self, event: TuneEvent) -> None:
        LOGGER.info("%s", event)
        if self.caller_confirm is not None:
            self.caller_confirm(event)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def log_result(result: TuneResult) -> None:
    """The answer, one line on the logger."""
    best = result.best_trial
    if best is None:
        LOGGER.info("study %r: nothing measured fits %s (%d schedules measured)",
                    result.study_name, format_bytes(result.budget_bytes), result.measured)
        return
    LOGGER.info("study %r: the pick is trial %d, %s: total %s, step %s (%d schedules "
                "measured)", result.study_name, best.number, best.schedule.describe(),
                format_bytes(best.measurement.total_bytes),
                format_seconds(best.measurement.step_seconds), result.measured)
