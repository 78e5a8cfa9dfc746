"""The names autoremat writes into a study, in one place: each trial's user attrs (besides
its ``Measurement.to_attrs`` figures) and the keys a tuned schedule's ``meta`` records.

A trial that measured a schedule holds ``SCHEDULE`` (``Schedule.to_data``), ``SCHEDULE_KEY``,
``DESCRIBE`` and ``MEASURED`` (and ``COMPILE_FAILED`` when its build or compile failed:
it measured nothing and is not one of ``n_trials``); while a worker measures it,
``MEASURING`` (its claim). A trial pruned as a repeat holds ``DUPLICATE_OF``; one pruned
because the study had its ``total_trials``, ``TOTAL_REACHED``; a re-queued trial of a dead
worker ``RETRY_OF`` and ``RETRY_REASON``. A trial enqueued before it runs (a seed, a retry)
holds ``SCHEDULE``: the worker that takes it measures that schedule.
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
RETRY_OF: Final = "retry_of"
RETRY_REASON: Final = "retry_reason"

#: What a tuned schedule's ``meta`` says it was tuned for and where it came from
#: (``study.trial_schedule`` writes them; the measured figures come with them,
#: ``autoremat._measure.breakdown.KEYS`` and the step and compile times).
TUNED_FOR: Final = ("problem", "seq_len", "fingerprint", "device_kind", "platform", "jax_version",
                    "flax_version", "budget_bytes", "study_name", "trial", "storage", "date")
#: The timing figures a tuned schedule's ``meta`` records.
TIMING: Final = ("step_seconds", "compile_seconds", "timed_seq_len", "extrapolated_seconds")
