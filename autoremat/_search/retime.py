"""Before the search stops: its leader re-timed against its closest challengers, in turn.

A trial's step time is one timing (``timing.time_compiled``: a warm-up and a few runs of
that schedule, then the next schedule's), and on a busy CPU two timings of one step differ
by a few percent: schedules within that noise are ranked by it. The default tune of the
seed LSTM on a 2-core CPU so stopped with the plain scan as its pick, a nested seed timed
1% slower where, run in turn in one process, nested schedules take 0.93 of plain's time
(``studies/results/fresh_tunes.md``); and a plain scan in the lead has no neighbours to
search from.

So before the search stops (``Worker.run``), its leader -- the fastest timed schedule that
fits -- is run in turn with its closest challengers (``contenders``: up to ``CHALLENGERS``
timed schedules that fit within ``BAND`` of it, and the plain scan, the baseline the answer
is reported against, where it fits and was timed within ``PLAIN_BAND`` of it: its single
timing, the process's first, read slower than its runs in turn, and the answer's ``vs
plain`` with it: ``studies/results/fresh_tunes.md``), ``ROUNDS`` times each after a
warm-up each, in one process (``interleaved``), each run its real compiled step: what
the machine's drift does falls on all alike. Their figures (``paired``: the leader's
median, and each challenger's ratio to the leader round by round) replace the single
timings (the study attr ``retimed_key``, read by ``MeasuredTrial.of``); when a challenger leads
now, the planner goes on from it (its neighbours, its patience counted afresh). A group
is re-timed once: the search stops when its leader's closest challengers were re-timed
with it already.

Only where the noise asks for it (``in_doubt``): a challenger whose runs and the leader's
agree within ``timing.STEADY`` (a TPU's mostly do), or do not overlap the leader's, is
ranked by its own timing already; re-timing it would spend the time of a compile and a
few runs to confirm the order. One timed with a single run (no spread known) is in
doubt. The worker keeps the re-timing's cost back from the planner (``Clock.reserve``)
while a group is to be re-timed -- and, where the leader's own runs do not agree, before
any challenger is close (``to_reserve``), up to ``RESERVE_SHARE`` of the time limit -- so
the limit leaves time for it.

A schedule timed on a short run (``short_runs``) is re-timed on that short run, scaled
the same way; the time left must pay for the compiles and the runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from autoremat._measure import device_memory
from autoremat._measure.timing import STEADY, TIMING_GATE, Compiled, spread
from autoremat._search.arguments import SharedArguments
from autoremat._search.short_runs import ShortRuns
from autoremat._search.study import MeasuredTrial

#: Challengers timed within this fraction of the leader's step are re-timed with it.
BAND: Final = 0.10
#: At most this many challengers (the closest; the plain scan besides, ``PLAIN_BAND``).
CHALLENGERS: Final = 2
#: The plain scan timed within this fraction of the leader's step joins its re-timing: a
#: ratio its one timing may have moved (the answer's ``vs plain``); a leader far ahead of
#: it is ranked, and reported, by the single timings (plain's compile costs seconds).
PLAIN_BAND: Final = 1.0
#: Runs of each contender after its warm-up, in turn: the median of three.
ROUNDS: Final = 3
#: At most this share of the time limit is kept back for a re-timing no challenger asks
#: for yet (``to_reserve``'s ``[leader, leader]``).
RESERVE_SHARE: Final = 1 / 3


@dataclass(frozen=True)
class Retimed:
    """One contender's figures from the runs in turn: full-length seconds (the median,
    scaled from a short run's), the runs' own seconds (a short run's, as a trial's
    ``step_samples``), and the trials it ran beside."""

    step_seconds: float
    step_samples: tuple[float, ...]
    short_seconds: float | None
    beside: tuple[int, ...]

    def to_attrs(self) -> dict[str, Any]:
        """The study attr's value (``retimed_key``)."""
        return {"step_seconds": self.step_seconds, "step_samples": list(self.step_samples),
                "short_seconds": self.short_seconds, "retimed_with": list(self.beside)}


def contenders(trials: Sequence[MeasuredTrial], budget_bytes: int, plain_key: str,
               done: Sequence[frozenset[str]] = ()) -> list[MeasuredTrial]:
    """The leader and its closest challengers (module doc), leader first; ``[]`` when
    nothing is to re-time: no leader, no challenger within ``BAND`` whose order with the
    leader is ``in_doubt``, or this group (or one holding it) was re-timed already
    (``done``: the keys of each group re-timed).
    ``plain_key``: the plain scan's key, fused or not (``plain(T).key()``)."""
    fits = sorted((t for t in trials if t.measurement.fits(budget_bytes)
                   and t.measurement.step_seconds is not None),
                  key=lambda t: (t.measurement.step_seconds, t.number))
    if len(fits) < 2:
        return []
    leader, limit = fits[0], (1.0 + BAND) * (fits[0].measurement.step_seconds or 0.0)
    close = [t for t in fits[1:] if (t.measurement.step_seconds or 0.0) <= limit
             and in_doubt(leader, t)]
    chosen = close[:CHALLENGERS]
    plain = [t for t in fits[1:] if t.schedule.with_fuse(None).key() == plain_key
             and (t.measurement.step_seconds or 0.0)
             <= (1.0 + PLAIN_BAND) * (leader.measurement.step_seconds or 0.0)]
    if chosen and plain and plain[0] not in chosen:  # the baseline, in doubt or not
        chosen.append(plain[0])
    group = frozenset(t.schedule.key() for t in (leader, *chosen))
    if not chosen or any(group <= before for before in done):
        return []
    return [leader, *chosen]


def to_reserve(trials: Sequence[MeasuredTrial], budget_bytes: int, plain_key: str,
               done: Sequence[frozenset[str]] = ()) -> list[MeasuredTrial]:
    """The group whose re-timing the search keeps time back for: ``contenders`` where
    there are some; else, where the leader's own runs do not agree (two or more, wider
    than ``STEADY`` of their median: a busy CPU's) and another schedule that fits was
    timed, the leader and one challenger like it (``[leader, leader]``), so the time is
    there when a challenger comes close; ``[]``: none (a TPU's runs agree; one run: a
    long step, its noise small against it; no other timed: no field yet)."""
    group = contenders(trials, budget_bytes, plain_key, done)
    if group:
        return group
    fits = sorted((t for t in trials if t.measurement.fits(budget_bytes)
                   and t.measurement.step_seconds is not None),
                  key=lambda t: (t.measurement.step_seconds, t.number))
    if len(fits) < 2:
        return []  # no field yet: nothing may come close (a layer stack's cut presets)
    leader, runs = fits[0], _scaled(fits[0])
    if len(runs) < 2 or spread(runs) <= 2 * STEADY or any(
            leader.schedule.key() in before for before in done):
        return []
    return [leader, leader]


def in_doubt(leader: MeasuredTrial, other: MeasuredTrial) -> bool:
    """The two trials' own runs do not settle which is faster: either was timed with one
    run (no spread known), or the runs of one of them do not agree within ``STEADY`` of
    their median (their range, ``timing.spread``, over twice that) and the other's fastest
    run is no slower than the leader's slowest (each trial's runs scaled to its step time:
    a short run's are)."""
    runs = [_scaled(t) for t in (leader, other)]
    if any(len(r) < 2 for r in runs):
        return True
    if max(spread(r) for r in runs) <= 2 * STEADY:
        return False
    return min(runs[1]) <= max(runs[0])


def _scaled(t: MeasuredTrial) -> list[float]:
    """The trial's runs in its step time's units (a short run's scaled to full length)."""
    samples, seconds = t.measurement.step_samples, t.measurement.step_seconds or 0.0
    mid = statistics.median(samples) if samples else 0.0
    return [x * seconds / mid for x in samples] if mid > 0 else []


def retime_cost(short: ShortRuns, group: Sequence[MeasuredTrial], compile_seconds: float) -> float:
    """About how long re-timing ``group`` takes: a compile and ``ROUNDS + 1`` runs each."""
    return sum(compile_seconds + (ROUNDS + 1) * (t.measurement.step_seconds or 0.0)
               / short.scale(t.schedule) for t in group)


def retime_group(short: ShortRuns, group: Sequence[MeasuredTrial],
           kept: Compiled | None = None) -> tuple[dict[int, Retimed], dict[str, Compiled]]:
    """Run ``group``'s schedules in turn (module doc): each trial's new figures, and the
    full-length executables compiled for it (the caller keeps or releases them; ``kept``,
    one compiled before at full length, is run instead of compiling it again). Empty when
    one of them fails to compile again."""
    runs: list[tuple[Compiled, float]] = []
    for t in group:
        if (kept is not None and kept.measurement.schedule_key == t.schedule.key()
                and short.length(t.schedule) == short.problem.seq_len):
            runs.append((kept, 1.0))
        else:
            runs.append(short.compiled_run(t.schedule))
    full = {c.measurement.schedule_key: c for c, k in runs if k == 1.0 and c is not kept}
    if any(c.executable is None for c, _ in runs):
        for c, _ in runs:
            if c is not kept:
                c.release()
        return {}, {}
    shared = SharedArguments()  # a big model's arguments once on the device, not per contender
    for c, _ in runs:
        shared.share(c)
    samples = interleaved([c for c, _ in runs], ROUNDS)
    for c, k in runs:
        if k != 1.0:
            c.release()
    numbers = tuple(t.number for t in group)
    out = {}
    for t, (_, k), runs_s, seconds in zip(group, runs, samples, paired(samples), strict=True):
        out[t.number] = Retimed(seconds * k, tuple(runs_s), None if k == 1.0 else seconds,
                                tuple(n for n in numbers if n != t.number))
    return out, full


def paired(samples: Sequence[Sequence[float]]) -> list[float]:
    """Each contender's seconds from its runs in turn: the leader's (the first) median;
    another's, that median times the median of its run's ratio to the leader's run of
    the same round -- a load that comes and goes between rounds falls on both runs of a
    pair alike, where it would move one median and not the other."""
    lead = statistics.median(samples[0])
    return [lead] + [lead * statistics.median(x / y for x, y in zip(s, samples[0], strict=True))
                     for s in samples[1:]]


def interleaved(runs: Sequence[Compiled], rounds: int) -> list[list[float]]:
    """Each compiled step's wall seconds (ended by ``block_until_ready``) over ``rounds``
    runs in turn, after a warm-up each; every other round in the reverse order, so no
    schedule always runs after the same one."""
    import jax

    times: list[list[float]] = [[] for _ in runs]
    # no compile thread traces, nor writes a cache entry, meanwhile
    with device_memory.MEASURE_LOCK, TIMING_GATE.timing():
        for c in runs:
            jax.block_until_ready(c.executable(*c.args))
        for r in range(rounds):
            order = list(range(len(runs)))[::-1 if r % 2 else 1]
            for i in order:
                c = runs[i]
                t0 = time.perf_counter()
                jax.block_until_ready(c.executable(*c.args))
                times[i].append(time.perf_counter() - t0)
    return times
