"""What a planner's models say of a candidate: its time, its bytes, what to do with it.

The time model (``predict.TimeModel``, calibrated on the study's own timed trials) and
the memory model (``MemoryModel``) predict; ``untimed``'s pure rules decide on their
figures and the ``Standings``. The stop rule: a candidate predicted slower than the best
measured schedule that fits by ``STOP_RATIO``, widened by twice the time model's
leave-one-out error (a model off by 15% must not rule out a schedule predicted 20%
slower), up to ``MAX_STOP``, is not worth timing -- nor is anything ranked after it.

One function orders the screening rules (``screening.next_action``: a candidate's next
action from its facts); ``Judge.facts`` gives a candidate's facts in a round (``Round``:
what the caller knows), read from the models as the rules ask, so a rule not reached
costs nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from autoremat._measure.measurement import ERROR
from autoremat._search.planning import untimed
from autoremat._search.planning.candidates import Candidate, Verdict
from autoremat._search.planning.memory_model import MemoryModel
from autoremat._search.planning.predict import TimeModel
from autoremat._search.planning.presets import Presets
from autoremat._search.planning.standings import Standings

#: Stop when the best prediction left is this much slower than the best measured
#: (at least; ``Judge.stop_ratio`` widens it by the model's error, up to ``MAX_STOP``).
STOP_RATIO: Final = 1.15
MAX_STOP: Final = 1.6


@dataclass(frozen=True)
class Round:
    """What the caller of a round of screening knows that the judge does not.

    Attributes:
      explore: no stop on the predicted ratio, no skip on a guessed domination, no patience.
      dominated_too: a dominated candidate may be timed (a caller that must measure a
        given number).
      time_left: seconds left to start a compile or a timing (``None``: no limit).
      compile_cost: seconds of one compile (at unroll 1).
      compile_cost_of: seconds of a candidate's own compile (``None``: ``compile_cost``).
      timing_cost: seconds to time a candidate predicted at the seconds given (``None``:
        a timing always fits).
      twin: what to compile in a candidate's place (``OffloadTwins.first``; ``None``: the
        candidate itself).
      own_left: compiles of the planner's own left (``None``: the standings' patience,
        once the model is calibrated).
    """

    explore: bool = False
    dominated_too: bool = False
    time_left: float | None = None
    compile_cost: float = 0.0
    compile_cost_of: Callable[[Candidate], float] | None = None
    timing_cost: Callable[[Candidate, float], float] | None = None
    twin: Callable[[Candidate], Candidate | None] | None = None
    own_left: int | None = None


class CandidateFacts:
    """``screening.Facts`` of one candidate in one round, read from the judge when first
    asked (``next_action`` reads few of them). ``target``: the candidate to act on -- its twin,
    where one was found in its place."""

    def __init__(self, judge: Judge, cand: Candidate, predicted: float, rnd: Round) -> None:
        self._judge, self._cand, self._predicted, self._round = judge, cand, predicted, rnd
        self.target = cand

    @functools.cached_property
    def preset(self) -> bool:
        return self._judge.first(self._cand) is not None

    @functools.cached_property
    def preset_over(self) -> bool:
        return self._judge.preset_over(self._cand)

    @property
    def compiled(self) -> bool:
        return self._cand.compiled is not None

    @property
    def failed(self) -> bool:
        sized = self._cand.sized
        return sized is not None and sized.status == ERROR

    @property
    def executable(self) -> bool:
        return self._cand.compiled is not None and self._cand.compiled.executable is not None

    @functools.cached_property
    def past_stop(self) -> bool:
        return self._judge.past_stop(self._predicted, explore=self._round.explore)

    @functools.cached_property
    def past_own_stop(self) -> bool:
        return self._judge.past_stop(self._predicted, self._cand, explore=self._round.explore)

    @functools.cached_property
    def patience_spent(self) -> bool:
        own = self._round.own_left
        if own is not None:
            return own <= 0
        judge = self._judge
        return (judge.calibrated() and not self._round.explore
                and judge.patience_left() <= 0)

    @functools.cached_property
    def twin_found(self) -> bool:
        twin = self._round.twin
        found = self._cand if twin is None else twin(self._cand)
        if found is None:
            return False
        self.target = found
        return True

    @functools.cached_property
    def surely_over(self) -> bool:
        return self._judge.surely_over(self.target)

    @functools.cached_property
    def dominated(self) -> bool:
        return not self._round.explore and self._judge.dominated(self.target, self._predicted)

    @property
    def early(self) -> bool:
        return self._cand.schedule.key() in self._judge.early

    @functools.cached_property
    def compile_fits(self) -> bool:
        left, cost_of = self._round.time_left, self._round.compile_cost_of
        if left is None:
            return True
        return left >= (self._round.compile_cost if cost_of is None else cost_of(self.target))

    @property
    def any_compile_fits(self) -> bool:
        left = self._round.time_left
        return left is None or left >= self._round.compile_cost

    @functools.cached_property
    def untimed(self) -> Verdict | None:
        return self._judge.untimed(self._cand, self._round.dominated_too)

    @functools.cached_property
    def timing_fits(self) -> bool:
        left, cost = self._round.time_left, self._round.timing_cost
        return left is None or cost is None or left >= cost(self._cand, self._predicted)


class Judge:
    """The models and the standings of one planner, asked of one candidate at a time.
    Its owner (the planner) feeds the models and the standings; the judge reads them."""

    def __init__(self, platform: str, standings: Standings, time_model: TimeModel,
                 memory_model: MemoryModel, explore_front: bool = False,
                 presets: Presets | None = None) -> None:
        """``platform``: where the study runs (``untimed.Reach``); ``explore_front``: every
        fitting schedule not dominated is timed (no timing competes with the best:
        ``rival``); ``presets``: a layer stack's presets, ranked first (``None``: not a
        layer stack)."""
        self._platform, self._standings = platform, standings
        self._time_model, self._memory_model = time_model, memory_model
        self._explore_front, self._presets = explore_front, presets
        self._early: dict[str, int] = {}

    @property
    def explore_front(self) -> bool:
        """Every fitting schedule not dominated is timed (no stop on predictions)."""
        return self._explore_front

    @property
    def time_model(self) -> TimeModel:
        """The step time model the judge predicts with (its owner fits it)."""
        return self._time_model

    @property
    def memory_model(self) -> MemoryModel:
        """The memory model the judge guesses sizes with (its owner feeds it)."""
        return self._memory_model

    @property
    def early(self) -> Mapping[str, int]:
        """key -> rank of the unrolls of the leader and its closest rivals, ranked after
        the presets and before the rest, by predicted time (``prefer``): where unrolling
        pays, it is found early."""
        return MappingProxyType(self._early)

    @property
    def budget_bytes(self) -> int:
        """The memory budget a schedule must fit (the standings')."""
        return self._standings.budget_bytes

    def total(self, cand: Candidate) -> float | None:
        """Total bytes: sized, else the memory model's guess (``None``: no guess yet)."""
        sized = cand.sized
        return sized.total_bytes if sized is not None else self._memory_model.predict(
            cand.structure)

    def predict(self, cand: Candidate) -> float | None:
        """Predicted step seconds (``None`` before any schedule was timed)."""
        return self._time_model.predict(cand.structure, float(self.total(cand) or 0))

    def calibrated(self) -> bool:
        """The stop rule applies: two timings fitted, one of them fits the budget."""
        return self._time_model.points >= 2 and self._standings.best is not None

    def stop_ratio(self, cand: Candidate | None = None) -> float:
        """``STOP_RATIO`` widened by twice the time model's median error, at most
        ``MAX_STOP``; for ``cand``, scaled by its distance to the nearest timed
        schedule (``TimeModel.nearest``): a neighbour of a timed one is predicted
        well, so it must be predicted within ``STOP_RATIO`` to be timed."""
        d = 1.0
        if cand is not None:
            d = self._time_model.nearest(cand.structure, float(self.total(cand) or 0))[0]
        return min(MAX_STOP, max(STOP_RATIO, 1.0 + 2.0 * self._time_model.error * d))

    def past_stop(self, predicted: float, cand: Candidate | None = None, *,
                  explore: bool = False) -> bool:
        """Predicted slower than the stop allows: not worth timing -- and, without
        ``cand``, nor anything ranked after it; with ``cand``, by its own ratio (near a
        timed schedule, narrower). Never while ``explore`` (no stop on the predicted
        ratio), nor before the model is ``calibrated``."""
        best = self._standings.best
        return (not explore and self.calibrated() and best is not None
                and predicted > self.stop_ratio(cand) * best[2])

    def stop_seconds(self) -> float | None:
        """The slowest step still worth timing (``None``: no best yet)."""
        best = self._standings.best
        return None if best is None else self.stop_ratio() * best[2]

    def rival(self) -> float | None:
        """The best step that fits, which a timing competes with (``timing.CUT_RATIO``,
        ``BEATEN``); ``None``: time in full (none yet, or the whole front wanted)."""
        best = self._standings.best
        return None if self._explore_front or best is None else best[2]

    def untimed(self, cand: Candidate, dominated: bool = False) -> Verdict | None:
        """Why ``cand``, compiled, is not timed (``untimed.untimed``; ``None``: it may be)."""
        assert cand.compiled is not None
        return untimed.untimed(cand.compiled, self.predict(cand),
                               self._standings.reach(self._platform), dominated)

    def dominated(self, cand: Candidate, predicted: float | None) -> bool:
        """A timed schedule needs no more memory and no more time (``untimed.dominated``)."""
        return untimed.dominated(self.total(cand), predicted, self._standings.timed.values())

    def over_at_runtime(self, cand: Candidate) -> bool:
        """Sized over the budget by more than a size overstated a run: its run would be
        over too (``untimed.over_at_runtime``)."""
        return untimed.over_at_runtime(None if cand.sized is None else self.total(cand),
                                       self._standings.reach(self._platform))

    def guessed_over(self, cand: Candidate) -> bool:
        """Over the budget by the memory model's guess, less the most a size overstated a
        run (``untimed.guessed_over``): likely not timed."""
        return untimed.guessed_over(self._memory_model.predict(cand.structure),
                                    self._standings.reach(self._platform))

    def surely_over(self, cand: Candidate) -> bool:
        """Not worth a compile: over the budget by the memory model's rule or far over it by
        its guess (``MemoryModel.far_over``) or, in a layer stack, by what the schedule
        keeps (``Presets.over``)."""
        return self._memory_model.surely_over(cand.structure) or self._memory_model.far_over(
            cand.structure, self.budget_bytes) or self.preset_over(cand)

    def facts(self, cand: Candidate, predicted: float, rnd: Round) -> CandidateFacts:
        """``cand``'s facts in a round (``next_action`` decides on them); ``predicted``: its
        step seconds as ranked."""
        return CandidateFacts(self, cand, predicted, rnd)

    def prefer(self, keys: list[str]) -> None:
        """Rank these candidates, in this order, after the presets and before the rest
        (``early``)."""
        self._early = {k: i for i, k in enumerate(keys)}

    def patience_left(self) -> int:
        """Compiles of the planner's own left before the best must improve
        (``Standings.patience_left``)."""
        return self._standings.patience_left()

    def preset_over(self, cand: Candidate) -> bool:
        """Over the budget by what the schedule keeps, in a layer stack (``Presets.over``;
        ``False``: not a layer stack)."""
        return self._presets is not None and self._presets.over(cand.schedule)

    def first(self, cand: Candidate) -> int | None:
        """The rank of a candidate tried before all others (a layer stack's preset)."""
        return None if self._presets is None else self._presets.priority(cand)

    def rank(self, candidates: Iterable[Candidate],
             compiled_first: bool = False) -> list[tuple[float, Candidate]]:
        """``candidates`` by predicted time (before any timing: fewest evaluations, the
        time model's prior), a layer stack's presets first in their order;
        ``compiled_first``: those already compiled first."""
        ranked = [(self.predict(c), c) for c in candidates]

        def order(pc: tuple[float, Candidate]) -> tuple[float, float, bool, float]:
            first = self.first(pc[1])
            return (math.inf if first is None else first,
                    self._early.get(pc[1].schedule.key(), math.inf),
                    compiled_first and pc[1].compiled is None, pc[0])

        return sorted(((p if p is not None else c.structure.evaluations, c) for p, c in ranked),
                      key=order)
