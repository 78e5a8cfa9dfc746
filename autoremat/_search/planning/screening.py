"""The one order of the screening rules: a candidate's next action from its facts.

``next_action`` decides what a planner does next with one candidate -- stop the round,
skip it (for good, with a ``Verdict``, or for now), compile it, time it, or record its
failure -- from its ``Facts`` alone: a pure function, the rules in one place and one
order. The judge (``judge.Judge.facts``) reads a candidate's facts from its models as the
rules ask for them; the planner's ranking (``Planner.choose``), the compiles ahead
(``ahead.upcoming``) and the device's choice while a compile runs (``ahead.meanwhile``) all
ask it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Protocol

from autoremat._search.planning.candidates import Verdict


class Action(enum.Enum):
    """A candidate's next step in a round of screening (``next_action``)."""

    STOP = "stop"  # nothing ranked after it is worth it either: the round ends
    SKIP = "skip"  # not this one (``Decision.verdict``: for good, and why)
    COMPILE = "compile"  # compile and size it (the caller probes its risky choices first)
    TIME = "time"  # time it
    FAIL = "fail"  # it failed to build or compile: recorded as a failed trial


@dataclass(frozen=True)
class Decision:
    """``next_action``'s answer; ``verdict``: why a skipped candidate is set aside for good
    (``None``: it may come up again)."""

    action: Action
    verdict: Verdict | None = None


class Facts(Protocol):
    """What ``next_action`` reads of one candidate, each read only where a rule asks.

    ``preset``: a layer stack's preset (tried before all others, whatever the time model
    says); ``preset_over``: over the budget by what it keeps; ``compiled``: sized;
    ``failed``: its build or compile failed; ``executable``: it has one to run;
    ``early``: an unroll of the leader or a close rival, ranked before the rest out of
    predicted order (``Judge.early``); ``past_stop``: predicted past the stop
    (``Judge.past_stop``), so is all ranked after it (but an early one's);
    ``past_own_stop``: past its own, narrower stop near a timed schedule;
    ``patience_spent``: no compile more of the planner's own (``standings.PATIENCE``);
    ``twin_found``: something to compile in its place (itself, or its offload's twin:
    ``offload_twins``); ``surely_over``: over the budget before a compile;
    ``dominated``: dominated by the memory model's guess; ``compile_fits``: the time
    left pays for its compile (``Clock.compile_cost_of``: by its unroll);
    ``any_compile_fits``: the time left pays for a compile at unroll 1; ``untimed``:
    why, sized, it is not timed
    (``untimed.untimed``); ``timing_fits``: the time left pays for its timing."""

    @property
    def preset(self) -> bool: ...
    @property
    def preset_over(self) -> bool: ...
    @property
    def compiled(self) -> bool: ...
    @property
    def failed(self) -> bool: ...
    @property
    def executable(self) -> bool: ...
    @property
    def early(self) -> bool: ...
    @property
    def past_stop(self) -> bool: ...
    @property
    def past_own_stop(self) -> bool: ...
    @property
    def patience_spent(self) -> bool: ...
    @property
    def twin_found(self) -> bool: ...
    @property
    def surely_over(self) -> bool: ...
    @property
    def dominated(self) -> bool: ...
    @property
    def compile_fits(self) -> bool: ...
    @property
    def any_compile_fits(self) -> bool: ...
    @property
    def untimed(self) -> Verdict | None: ...
    @property
    def timing_fits(self) -> bool: ...


_SKIP: Final = Decision(Action.SKIP)


def next_action(f: Facts) -> Decision:
    """The screening rules, in their one order (the planner's module doc says why each).

    A preset is compiled, then timed, whatever is predicted (skipped where it keeps more
    than fits, or no compile fits in the time left). Any other: past the stop, the round
    ends (an early one, ranked out of predicted order, is skipped); past its own stop,
    skipped. Not yet compiled: skipped when the patience is spent, when its twin decided
    it, when surely over or dominated by the guess; the round ends
    when no compile fits in the time left; one whose own, dearer compile (unrolled) does
    not fit is skipped for good; else compiled. Compiled: a failure
    is recorded; one ``untimed`` rules out is skipped for good; the round ends when its
    timing does not fit in the time left; else timed."""
    if f.preset:
        if not f.compiled:
            if f.preset_over:
                return Decision(Action.SKIP, Verdict.SURELY_OVER)
            return Decision(Action.COMPILE) if f.compile_fits else _SKIP
        if f.failed:
            return Decision(Action.FAIL)
        if not f.executable:
            return Decision(Action.SKIP, Verdict.NO_EXECUTABLE)
        return Decision(Action.TIME)
    if f.past_stop:
        return _SKIP if f.early else Decision(Action.STOP)
    if f.past_own_stop:
        return _SKIP
    if not f.compiled:
        if f.patience_spent or not f.twin_found:
            return _SKIP
        if f.surely_over:
            return Decision(Action.SKIP, Verdict.SURELY_OVER)
        if f.dominated:
            return _SKIP
        if f.compile_fits:
            return Decision(Action.COMPILE)
        return Decision(Action.SKIP, Verdict.TOO_LATE) if f.any_compile_fits else Decision(
            Action.STOP)
    if f.failed:
        return Decision(Action.FAIL)
    verdict = f.untimed
    if verdict is not None:
        return Decision(Action.SKIP, verdict)
    return Decision(Action.TIME) if f.timing_fits else Decision(Action.STOP)
