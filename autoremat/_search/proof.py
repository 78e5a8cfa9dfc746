"""The proof of fit: before ``tune`` writes its pick, the pick runs once with only the
budget on the device.

Every figure the search compares with the budget is an estimate or a measurement of
the step alone; the proof asks the device itself. The pick (the executable the search
timed it with, else compiled again) is run once with a filler holding all of the
device's memory but the budget -- its arguments live, ``budget - arguments`` free
(``within.runs_within``; per device on a mesh). A pick that runs out of memory
so is marked (the study attr ``attrs.proof_key(number)``; ``MeasuredTrial.of`` reads it
as ``fit_proof_failed``, and ``Measurement.fits`` is then false), and the next fastest
is proved in turn, up to ``MAX_TRIES`` picks. One that passes records
``fit_proof_bytes`` (the budget), which the written schedule's ``meta``, ``autoremat
show`` and ``autoremat pareto`` report.

On a CPU there is no device memory to fill: the proof is skipped, and said.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from autoremat._errors import one_line
from autoremat._measure import device_memory, within
from autoremat._measure.measure import compile_schedule
from autoremat._measure.measurement import proof_attrs
from autoremat._measure.problem import Problem
from autoremat._measure.timing import Compiled
from autoremat._search.attrs import proof_key
from autoremat._search.study import MeasuredTrial, StudyInfo, choose
from autoremat._units import format_bytes

if TYPE_CHECKING:
    import optuna

#: At most this many picks are proved (each a compile and one run).
MAX_TRIES: Final = 3


def prove_fit(study: optuna.Study, problem: Problem, info: StudyInfo,
              on_line: Callable[[str], None] | None = None,
              compiled: Compiled | None = None) -> str:
    """Prove the study's pick fits its budget (``info``: what the study was made for) on
    the device (module doc). Returns one
    line saying what was proved ("" when nothing fits). ``compiled``: a schedule's
    executable at full length, run instead of compiling again when it is the pick's (the
    search keeps its best's: ``Worker.take_kept``)."""
    if not device_memory.meters():
        return "proof of fit: skipped (a CPU has no device memory to fill)"
    budget_bytes = info.budget_bytes
    for _ in range(MAX_TRIES):
        best = choose(study, info)
        if best is None:
            return "proof of fit: no pick left that fits"
        if best.measurement.fit_proof_bytes is not None:
            return _passed(best, budget_bytes)
        mine = compiled is not None and compiled.measurement.schedule_key == best.schedule.key()
        ok, why = _run(problem, best, budget_bytes, compiled if mine else None)
        if ok is None:
            return f"proof of fit: not run ({why})"
        study.set_user_attr(proof_key(best.number), proof_attrs(budget_bytes if ok else None,
                                                                "" if ok else why))
        if ok:
            return _passed(best, budget_bytes)
        if on_line is not None:
            on_line(f"proof of fit: trial {best.number} ({best.schedule.describe()}) ran out of "
                    f"memory with only {format_bytes(budget_bytes)} on the device; proving "
                    "the next fastest")
    return f"proof of fit: the {MAX_TRIES} fastest picks failed it; nothing is written"


def _passed(trial: MeasuredTrial, budget_bytes: int) -> str:
    return (f"proof of fit: trial {trial.number} ran once with only "
            f"{format_bytes(budget_bytes)} on the device (its arguments live, the rest free)")


def _run(problem: Problem, trial: MeasuredTrial, budget_bytes: int,
         compiled: Compiled | None) -> tuple[bool | None, str]:
    """Run the trial's schedule once within the budget: ``compiled``, else compiled now."""
    if compiled is None or compiled.executable is None:
        compiled = compile_schedule(problem, trial.schedule)
    executable, args = compiled.executable, compiled.args
    arguments = compiled.measurement.argument_bytes
    if executable is None or arguments is None:
        return None, f"it did not compile again: {compiled.measurement.reason or 'no sizes'}"

    def once() -> None:
        within.free_outputs(executable(*args))

    try:
        return within.runs_within(once, budget_bytes - arguments)
    except Exception as e:
        return None, f"it failed to run: {one_line(e)}"

