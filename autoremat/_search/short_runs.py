"""Timing a long problem on short runs, and predicting its full-length step time.

A training step at ``T = 10^6`` takes minutes, so a search that times every
candidate at full length can afford one or two. Memory is not the problem:
compiling at full length is cheap (seconds) and sizes a schedule exactly.
Time is: it has to be measured. So the tuner compiles each candidate at full
``T`` for its bytes, and times it on the first ``T'`` steps of the data
(``Problem.at_length``), where ``T' = Schedule.timing_length(T, SHORT_SEQ_LEN)``
keeps the schedule's structure -- the same inner levels with fewer outer
chunks (nested), at least eight steps per snapshot (binomial). The full-length
time is the short run's scaled by the work of a step -- the step evaluations
of ``bounds.cost`` (exact for every kind), a backward one weighted more
(``work``)::

    predicted(T) = measured(T') * work(T) / work(T')

For a nested schedule of whole chunks the work is linear in ``T`` (the ratio
is ``T / T'``); for binomial the re-runs grow faster than ``T``.

What a short run cannot see -- work that does not grow with ``T`` (the
optimizer update, launching the step), a longer outer stack, cache effects of
a larger input -- is the prediction's error. The tuner therefore times its
pick at full length before answering (``autoremat._search.confirm``) and records
both figures, and ``studies/bench_tune.py`` reports the error.

A problem below ``MIN_SEQ_LEN`` steps, one without ``at_length``, or a
schedule whose structure needs more than half of ``T`` is timed at full length
(``Measurement.timed_seq_len == T``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Final

from autoremat._errors import ProblemError
from autoremat._measure.measure import Compiled, compile_schedule
from autoremat._measure.measurement import ERROR, OK, Measurement
from autoremat._measure.problem import Problem
from autoremat._measure.timing import time_compiled
from autoremat._schedules.base import Schedule

#: The length a short run aims at: about half a second a step for the seed's LSTM on
#: a CPU. Its step time per step is the full run's (measured at T'=1000-20000 for
#: T=10^6: 131-169 us a step, no trend, no fixed part above the noise).
SHORT_SEQ_LEN: Final = 4_000
#: Problems from this length on are timed on short runs; shorter ones at full length.
MIN_SEQ_LEN: Final = 20_000
#: A short run's timed runs after its warm-up: the median of three (more would cost
#: as much as another candidate; the run-to-run noise is small against the
#: machine's drift, which the confirmation at full length sees).
SHORT_REPEATS: Final = 3
#: A short run must be at most this fraction of ``T`` to be worth predicting from.
MAX_FRACTION: Final = 0.5
#: A backward step's cost beyond one forward evaluation, in forward evaluations: the
#: seed LSTM's at T=10^5 on a CPU (binomial, where it matters: the forward re-runs
#: grow faster than ``T``) is 2 to 3.
BACKWARD_EXTRA: Final = 2.0


def timed_length(problem: Problem, schedule: Schedule) -> int:
    """The ``T'`` to time ``schedule`` at: ``problem.seq_len`` or a shorter run."""
    seq_len = problem.seq_len
    if problem.at_length is None or seq_len < MIN_SEQ_LEN:
        return seq_len
    short = schedule.timing_length(seq_len, SHORT_SEQ_LEN)
    return short if short <= MAX_FRACTION * seq_len else seq_len


def work(schedule: Schedule, seq_len: int) -> float:
    """A step's work in forward-step units: every evaluation of ``bounds.cost`` (the
    forward sweep, re-runs, and the ``T`` backward steps) plus ``BACKWARD_EXTRA``
    per backward step, which costs more than a forward one (its VJP and the
    restores' bookkeeping)."""
    return schedule.cost(seq_len).evaluations + BACKWARD_EXTRA * seq_len


def scale(schedule: Schedule, seq_len: int, timed_len: int) -> float:
    """``work(T) / work(T')``: full-length seconds per short-run second (``T / T'``
    for a nested schedule of whole chunks, whose work is linear in ``T``)."""
    return work(schedule, seq_len) / work(schedule, timed_len)


@dataclass
class ShortRuns:
    """Times schedules of ``problem`` (module doc); the short problems are built once.
    When ``problem.at_length`` refuses (``ProblemError``: a ``Problem.from_loss``
    whose scan length does not follow its batch) every schedule is timed at full
    length, with one warning."""

    problem: Problem
    _at: dict[int, Problem] = field(default_factory=dict)
    _refused: bool = False

    def length(self, schedule: Schedule) -> int:
        """The ``T'`` ``schedule`` is timed at (``problem.seq_len``: full length)."""
        return self.problem.seq_len if self._refused else timed_length(self.problem, schedule)

    def scale(self, schedule: Schedule) -> float:
        """Full-length seconds per second of ``schedule``'s timing run (1.0: full length)."""
        n = self.length(schedule)
        return scale(schedule, self.problem.seq_len, n) if n < self.problem.seq_len else 1.0

    def timing_cost(self, schedule: Schedule, predicted: float, time_budget: float) -> float:
        """Seconds to time ``schedule`` predicted at ``predicted`` full-length seconds: a
        warm-up, then 3 runs -- or the warm-up alone, when longer than ``time_budget`` --
        of its timing run (``scale``)."""
        run = predicted / self.scale(schedule)
        return run if run > time_budget else run + max(3 * run, time_budget)

    def _short(self, n: int) -> Problem | None:
        """The problem on the first ``n`` steps; ``None`` once ``at_length`` refused."""
        if n not in self._at and not self._refused:
            try:
                self._at[n] = self.problem.at_length(n)  # type: ignore[misc]  # timed_length
            except ProblemError as e:
                self._refused = True
                warnings.warn(f"{e}; every schedule is timed at full length",
                              RuntimeWarning, stacklevel=3)
        return self._at.get(n)

    def compiled_run(self, schedule: Schedule) -> tuple[Compiled, float]:
        """``schedule`` compiled for its timing run (at full length, or on its short run)
        and that run's ``scale`` (1.0: full length); not sized against a budget."""
        n = self.length(schedule)
        problem = self._short(n) if n < self.problem.seq_len else None
        if problem is None:
            return compile_schedule(self.problem, schedule), 1.0
        return compile_schedule(problem, schedule), scale(schedule, self.problem.seq_len, n)

    def time(self, schedule: Schedule, sized: Compiled, *, budget_bytes: int | None,
             time_budget: float, best: float | None) -> Measurement:
        """Time ``sized`` (``schedule`` compiled at full length: its bytes) -- at full
        length, or on a short run whose times are scaled to full length. ``best`` (the
        best step, ``timing.time_compiled``'s) is in full-length seconds."""
        seq_len = self.problem.seq_len
        n = self.length(schedule)
        problem = self._short(n) if n < seq_len and sized.executable is not None else None
        if problem is None:
            m = time_compiled(sized, budget_bytes=budget_bytes, time_budget=time_budget,
                              best=best)
            ran = m.step_seconds is not None or m.cut_seconds is not None
            return replace(m, timing=replace(m.timing, timed_seq_len=seq_len)) if ran else m
        full = sized.measurement
        sized.release()  # the bytes are known; the full-length executable is not run
        k = scale(schedule, seq_len, n)
        short = compile_schedule(problem, schedule)
        m = time_compiled(short, time_budget=time_budget, max_repeats=SHORT_REPEATS,
                          best=None if best is None else best / k)
        short.release()
        if m.status != OK:
            return replace(full, status=ERROR, reason=f"at T'={n}: {m.reason}",
                           timing=replace(full.timing, loss=m.timing.loss), failure=m.failure)
        t = m.timing
        measured = t.step_seconds if t.step_seconds is not None else t.cut_seconds
        return replace(full, timing=replace(
            full.timing, loss=t.loss, step_samples=t.step_samples, timed_seq_len=n,
            short_seq_len=n, short_seconds=measured,
            step_seconds=None if t.step_seconds is None else t.step_seconds * k,
            cut_seconds=None if t.cut_seconds is None else t.cut_seconds * k))
