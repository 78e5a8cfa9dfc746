"""The names autoremat writes into a study, in one place: each trial's user attrs (besides
its ``Measurement.to_attrs`` figures) and the study's own (besides ``StudyInfo``'s fields).
The keys a tuned schedule's ``meta`` records live with the first stage that reads them
(``autoremat._measure.stale``).

A trial that measured a schedule holds ``SCHEDULE`` (``Schedule.to_data``), ``SCHEDULE_KEY``,
``DESCRIBE`` and ``MEASURED`` (and ``COMPILE_FAILED`` when its build or compile failed:
it measured nothing and is not one of ``n_trials``); while a worker measures it,
``MEASURING`` (its claim). A trial pruned as a repeat holds ``DUPLICATE_OF``; one pruned
because the study had its ``total_trials``, ``TOTAL_REACHED``; one pruned because the
enqueued trial its worker expected went to another worker, ``WAITING_TAKEN``; a re-queued
trial of a dead worker ``RETRY_OF`` and ``RETRY_REASON``. A trial enqueued before it runs (a seed, a retry)
holds ``SCHEDULE``: the worker that takes it measures that schedule.

The study holds, besides ``StudyInfo``: the probe's outcome (``PROBE``), whether its scan is
a layer stack (``LAYER_STACK``) and its tags' costs (``NAME_COSTS``), and per trial its
re-timing beside the leader (``retimed_key``), its full-length confirmation
(``confirmed_key``) and its proof of fit (``proof_key``).
"""

from __future__ import annotations

from typing import Final

SCHEDULE: Final = "schedule"
SCHEDULE_KEY: Final = "schedule_key"
DESCRIBE: Final = "describe"
MEASURED: Final = "measured"
MEASURING: Final = "measuring"
PREDICTED_SECONDS: Final = "predicted_seconds"
COMPILE_FAILED: Final = "compile_failed"
DUPLICATE_OF: Final = "duplicate_of"
TOTAL_REACHED: Final = "total_reached"
WAITING_TAKEN: Final = "waiting_taken"
RETRY_OF: Final = "retry_of"
RETRY_REASON: Final = "retry_reason"
#: Study user attr of a layer stack with ``checkpoint_name`` tags: what each tag costs
#: (``presets.LayerCosts.table``: bytes per layer and over all, recompute FLOPs per layer).
NAME_COSTS: Final = "name_costs"
#: Study user attr: ``True`` where the tuner took the scan for a layer stack (a short scan of
#: heavy steps, ``planning.presets.is_layer_stack``), ``False`` for a recurrence over time
#: steps; a study without it is a layer stack where it holds ``NAME_COSTS``.
LAYER_STACK: Final = "layer_stack"
#: Study user attr beside it: the dots policies that keep exactly some of those tags
#: (``checkpoint_names.dot_forms``: policy -> the tags), so an export can write them by name.
DOT_FORMS: Final = "dot_forms"

#: The study attr holding the probe's outcome (``autoremat._search.probes.probe``): choice
#: label -> one line.
PROBE: Final = "probe"


def confirmed_key(number: int) -> str:
    """The study attr holding trial ``number``'s full-length timing (``Measurement``
    attrs, ``autoremat._search.confirm``); a finished trial's own attrs cannot change."""
    return f"confirmed:{number}"


def retimed_key(number: int) -> str:
    """The study attr holding trial ``number``'s figures from runs in turn with the search's
    leader or its challengers (``autoremat._search.retime``); they replace its own timing."""
    return f"retimed:{number}"


def proof_key(number: int) -> str:
    """The study attr holding trial ``number``'s proof of fit (``autoremat._search.proof``):
    its ``Measurement.proof_attrs``."""
    return f"fit_proof:{number}"
