"""What ``tune`` reports as records, worded by the command line (``autoremat._cli.printing``):
its progress while it runs (``TuneEvent``, handed to ``tune(on_confirm=...)``) and the proof
of fit's outcome (``ProofOfFit``, ``TuneResult.proof``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from autoremat._schedules.base import Schedule
from autoremat._search.probes.probe import ProbeVerdict


@dataclass(frozen=True)
class FullLengthTiming:
    """A pick timed on short runs is about to be timed at full length
    (``autoremat._search.confirm``).

    Attributes:
      trial: its trial number; schedule: its schedule.
      seq_len: the full length it is timed at.
      predicted_seconds: its step time predicted from the short runs.
      short_seq_len: the length of those runs.
    """

    trial: int
    schedule: Schedule
    seq_len: int
    predicted_seconds: float
    short_seq_len: int | None


@dataclass(frozen=True)
class ProbeChecked:
    """The study's probe checked a risky choice, or a combination of them (``label``;
    ``autoremat._search.probes``): its verdict."""

    label: str
    verdict: ProbeVerdict


@dataclass(frozen=True)
class ProofRetry:
    """The pick (``trial``, ``schedule``) ran out of memory with only ``budget_bytes`` on
    the device: the next fastest is proved (``autoremat._search.proof``)."""

    trial: int
    schedule: Schedule
    budget_bytes: int


#: What ``tune`` tells ``on_confirm`` while it runs.
TuneEvent = FullLengthTiming | ProbeChecked | ProofRetry


class ProofOutcome(enum.Enum):
    """How the proof of fit ended (``autoremat._search.proof``)."""

    PASSED = "passed"  # the pick ran once with only the budget on the device
    SKIPPED = "skipped"  # no device memory to fill (a CPU)
    NONE_FITS = "none fits"  # no pick left that fits
    NOT_RUN = "not run"  # the pick could not be compiled or run again (``why``)
    ALL_FAILED = "all failed"  # the ``tries`` fastest picks ran out of memory


@dataclass(frozen=True)
class ProofOfFit:
    """The proof of fit's outcome.

    Attributes:
      outcome: how it ended.
      trial: the pick that passed (``PASSED``) or was not run (``NOT_RUN``).
      budget_bytes: the budget it ran within (``PASSED``).
      why: why it was not run (``NOT_RUN``).
      tries: the picks that failed it (``ALL_FAILED``).
    """

    outcome: ProofOutcome
    trial: int | None = None
    budget_bytes: int | None = None
    why: str = ""
    tries: int = 0
