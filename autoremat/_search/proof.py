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

On a CPU there is no device memory to fill: the proof is skipped, and said. The outcome
is a record (``reports.ProofOfFit``), worded by the command line.
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
from autoremat._search.reports import ProofOfFit, ProofOutcome, ProofRetry, TuneEvent
from autoremat._search.study import StudyInfo, choose

if TYPE_CHECKING:
    import optuna

    from autoremat._search.study import MeasuredTrial

#: At most this many picks are proved (each a compile and one run).
MAX_TRIES: Final = 3


def prove_fit(study: optuna.Study, problem: Problem, info: StudyInfo,
              on_event: Callable[[TuneEvent], None] | None = None,
              compiled: Compiled | None = None) -> ProofOfFit:
    """Prove the study's pick fits its budget (``info``: what the study was made for) on
    the device (module doc); ``on_event`` hears of each pick that failed it
    (``ProofRetry``). ``compiled``: a schedule's executable at full length, run instead
    of compiling again when it is the pick's (the search keeps its answer's, ties
    broken as here: ``Worker.take_kept``)."""
    if not device_memory.meters():
        return ProofOfFit(ProofOutcome.SKIPPED)
    budget_bytes = info.budget_bytes
    for _ in range(MAX_TRIES):
        best = choose(study, info)
        if best is None:
            return ProofOfFit(ProofOutcome.NONE_FITS)
        if best.measurement.fit_proof_bytes is not None:
            return ProofOfFit(ProofOutcome.PASSED, best.number, budget_bytes)
        mine = compiled is not None and compiled.measurement.schedule_key == best.schedule.key()
        ok, why = _run(problem, best, budget_bytes, compiled if mine else None)
        if ok is None:
            return ProofOfFit(ProofOutcome.NOT_RUN, best.number, why=why)
        study.set_user_attr(proof_key(best.number), proof_attrs(budget_bytes if ok else None,
                                                                "" if ok else why))
        if ok:
            return ProofOfFit(ProofOutcome.PASSED, best.number, budget_bytes)
        if on_event is not None:
            on_event(ProofRetry(best.number, best.schedule, budget_bytes))
    return ProofOfFit(ProofOutcome.ALL_FAILED, tries=MAX_TRIES)


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

