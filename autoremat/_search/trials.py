"""A study's measured trials and the answer among them: ``MeasuredTrial`` (a finished
trial's schedule and figures), the fastest that fits, ties within the measured noise going
to the least memory (the plain scan last), and why a pick is fused or unfused.
``autoremat._search.study`` reads a study into these. Also how a worker reads a study's
trials to claim and count (``is_measured``, ``is_claimed``, ``find_measured``, ``progress``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from autoremat._measure.measurement import Measurement
from autoremat._measure.timing import spread
from autoremat._schedules import from_data, plain
from autoremat._schedules.base import Schedule
from autoremat._search.attrs import (
    COMPILE_FAILED,
    MEASURED,
    MEASURING,
    SCHEDULE,
    SCHEDULE_KEY,
    confirmed_key,
    proof_key,
    retimed_key,
)
from autoremat._units import format_bytes

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial


@dataclass(frozen=True)
class MeasuredTrial:
    """A finished trial that holds a measurement.

    Attributes:
      number: the Optuna trial number (``autoremat export NUMBER``).
      schedule: what was measured (no ``meta``; see ``trial_schedule``).
      measurement: the measured figures.
      runs: a re-timed trial's runs in seconds, its last ones in turn and its own first
        ones (``()``: not re-timed; ``all_runs`` is then its ``measurement.step_samples``).
        Their spread is the noise the tie rule reads (``tie_break``): on a busy CPU a few
        runs in turn agree closer than two timings of one step do, and the plain scan won
        by less than that (``studies/results/fresh_tunes.md``).
    """

    number: int
    schedule: Schedule
    measurement: Measurement
    runs: tuple[float, ...] = ()

    @property
    def all_runs(self) -> tuple[float, ...]:
        """``runs``, or the measurement's where none were kept apart."""
        return self.runs or self.measurement.step_samples

    @classmethod
    def of(cls, trial: FrozenTrial,
           study_attrs: Mapping[str, Any] | None = None) -> MeasuredTrial | None:
        """The trial's measurement, or ``None`` when it measured nothing (pruned, lost).
        ``study_attrs``: the study's, so a re-timing beside the search's leader and a
        full-length timing of a time predicted from a short run replace its timing."""
        attrs = trial.user_attrs
        if not attrs.get(MEASURED):
            return None
        m = Measurement.from_attrs(attrs)
        runs: tuple[float, ...] = ()
        retimed = (study_attrs or {}).get(retimed_key(trial.number))
        if retimed is not None:  # run in turn with the search's leader (``retime``)
            runs = (*retimed["step_samples"], *m.step_samples)
            m = replace(m, timing=replace(
                m.timing, step_seconds=retimed["step_seconds"],
                step_samples=tuple(retimed["step_samples"]),
                short_seconds=retimed["short_seconds"] if retimed["short_seconds"]
                is not None else m.timing.short_seconds))
        confirmed = (study_attrs or {}).get(confirmed_key(trial.number))
        if confirmed is not None:
            full = Measurement.from_attrs({**attrs, **confirmed})
            m = replace(full, timing=replace(full.timing, extrapolated_seconds=m.step_seconds))
        proof = (study_attrs or {}).get(proof_key(trial.number))
        if proof is not None:
            m = m.proved(proof)
        return cls(trial.number, from_data(attrs[SCHEDULE]), m, runs)


def fastest_fitting(trials: list[MeasuredTrial], budget_bytes: int,
                    seq_len: int) -> MeasuredTrial | None:
    """The trial ``tie_break`` picks (``None``: nothing fits)."""
    pick = tie_break(trials, budget_bytes, seq_len)
    return None if pick is None else pick.pick


@dataclass(frozen=True)
class Pick:
    """The answer among a study's trials, and the tie it won.

    Attributes:
      pick: the trial picked: the smallest of those tied with the fastest.
      fastest: the fastest trial that fits (``pick`` itself when no smaller one tied).
      noise: the spread of runs that made them a tie (``timing.spread``; the larger of
        the two trials', at most ``MAX_TIE``).
      fastest_is_plain: ``fastest`` is the plain scan (fused or not).
    """

    pick: MeasuredTrial
    fastest: MeasuredTrial
    noise: float = 0.0
    fastest_is_plain: bool = False

    @property
    def tied(self) -> bool:
        """The pick is not the fastest: it won a tie on memory."""
        return self.pick.number != self.fastest.number

    @property
    def memory_ratio(self) -> float | None:
        """The fastest's memory over the pick's (``Measurement.fit_bytes``)."""
        mine, theirs = self.pick.measurement.fit_bytes, self.fastest.measurement.fit_bytes
        return None if not mine or theirs is None else theirs / mine


#: The widest band of noise that makes two step times a tie: a schedule this much slower
#: than the fastest is not picked for its memory, whatever its runs' spread.
MAX_TIE: Final = 0.05


def tie_break(trials: list[MeasuredTrial], budget_bytes: int, seq_len: int) -> Pick | None:
    """The fastest trial that fits and the one picked (``None``: nothing fits): among
    those timed at full length when there are any; of the trials whose step time lies
    within the measured noise of the fastest's (the larger ``timing.spread`` of the two
    trials' own runs, ``MeasuredTrial.runs``, at most ``MAX_TIE``), the one with the least
    memory, the plain scan
    last -- timings within their noise do not rank schedules, and the smaller one leaves
    the device's memory to the rest of the program."""
    fits = [t for t in trials if t.measurement.fits(budget_bytes)]
    full = [t for t in fits if not t.measurement.predicted(seq_len)]
    fastest = min(full or fits, key=lambda t: (t.measurement.step_seconds,
                                               t.measurement.total_bytes, t.number),
                  default=None)
    if fastest is None:
        return None
    plain_key = plain(seq_len).key()

    def is_plain(t: MeasuredTrial) -> bool:
        return t.schedule.with_fuse(None).key() == plain_key

    best = fastest.measurement.step_seconds or 0.0
    tied = []
    for t in full or fits:
        noise = min(MAX_TIE, max(spread(t.all_runs), spread(fastest.all_runs)))
        if (t.measurement.step_seconds or 0.0) <= (1.0 + noise) * best:
            tied.append((t, noise))
    pick, noise = min(tied, key=lambda tn: (is_plain(tn[0]), tn[0].measurement.fit_bytes or 0,
                                            tn[0].measurement.step_seconds, tn[0].number))
    return Pick(pick, fastest, noise if pick is not fastest else 0.0, is_plain(fastest))


def fuse_why(trials: list[MeasuredTrial], best: MeasuredTrial, budget_bytes: int,
             seq_len: int) -> str:
    """Why the answer is fused or unfused (``Schedule.fuse``, a choice of the search): the
    time against the best of the other choice that fits, or the budget none of it fit."""
    picked = best.schedule.fuse
    name, other = ("fused", "unfused") if picked else ("unfused", "fused")
    others = [t for t in trials if t.schedule.fuse is (not picked)]
    rival = fastest_fitting(others, budget_bytes, seq_len)
    if rival is not None:
        mine, theirs = best.measurement.step_seconds, rival.measurement.step_seconds
        return (f"{name}: faster than the best {other} schedule that fits "
                f"({(mine or 0) * 1e3:.4g} ms against {(theirs or 0) * 1e3:.4g} ms, "
                f"{rival.schedule.describe()})")
    if others:
        return (f"{name}: no {other} schedule measured fits the budget "
                f"({format_bytes(budget_bytes)}; {len(others)} measured)")
    return f"{name}: no {other} schedule was measured"


# -- a study's trials as a worker reads them (``autoremat._search.worker``) --


def is_measured(t: FrozenTrial) -> bool:
    """A finished trial (complete or failed) that holds a measurement."""
    from optuna.trial import TrialState

    return t.state in (TrialState.COMPLETE, TrialState.FAIL) and bool(t.user_attrs.get(MEASURED))


def is_claimed(t: FrozenTrial) -> bool:
    """A running trial that has claimed its schedule (``Worker.claim``)."""
    from optuna.trial import TrialState

    return t.state == TrialState.RUNNING and bool(t.user_attrs.get(MEASURING))


def find_measured(trials: list[FrozenTrial], key: str, exclude: int) -> int | None:
    """The number of a trial that measured (or is measuring) ``key``, if any."""
    for t in trials:
        if t.number == exclude or t.user_attrs.get(SCHEDULE_KEY) != key:
            continue
        if is_measured(t) or is_claimed(t):
            return t.number
    return None


def progress(trials: list[FrozenTrial], exclude: int | None = None) -> tuple[int, int]:
    """``(measured, being measured)``: finished trials holding a measurement (not a
    failed compile), and running trials that have claimed a schedule (not counting
    ``exclude``)."""
    done = sum(1 for t in trials if is_measured(t) and not t.user_attrs.get(COMPILE_FAILED))
    running = sum(1 for t in trials if t.number != exclude and is_claimed(t))
    return done, running
