"""The search: remat schedules of a problem under a memory budget, as an Optuna study.

``tune`` records every measured schedule as a trial of an Optuna study with
two objectives, ``total_bytes`` and ``step_seconds`` (``measure``); the
budget is a constraint, ``fit_bytes - budget <= 0`` (``Measurement.fit_bytes``: the
measured runtime peak where there is one; ``trial.set_constraint``, Optuna 5), so
the whole measured front stays available (``autoremat pareto``). The answer is the
fastest trial that fits
(``autoremat._search.study.choose``).

What gets measured is decided by ``autoremat._search.planning.planner.Planner``, not by a
sampler: the obvious candidates (``space.seeds``) are enqueued first, each
trial holding its schedule, and always measured (they calibrate the cost model); after
them the planner hands its candidate straight to the trial that measures it; candidates
are sized by compiling them (cheap), ranked by a time model calibrated on the
study's own trials (``predict``), and timed only when they fit and are not
dominated; a schedule whose first run is already clearly slower than the best
that fits is a *cut* trial (``cut_seconds``, no ``step_seconds``). The search
ends when nothing left is predicted to beat the best, after ``n_trials``
(exactly that many: past the planner's stop, dominated ones too), or at
``time_limit``.

Long problems (``T >= short_runs.MIN_SEQ_LEN`` with
``Problem.at_length``) are sized at full length but timed on short runs,
their full-length times predicted (``autoremat._search.short_runs``; the trial attr
``timed_seq_len`` says which); before answering, the pick is timed at full
length (``autoremat._search.confirm``) and the answer is the fastest measured.
On a GPU or TPU the answer then passes a proof of fit: it runs once with only the
budget on the device (``autoremat._search.proof``); one that fails it is not written,
the next fastest that passes is.

* A schedule is measured at most once per study: a trial whose schedule key
  was already measured (or is being measured by another worker) is pruned
  with ``user_attrs["duplicate_of"]``; it does not count towards ``n_trials``.
* A seed over the budget is a trial with values ``(total_bytes, inf)``, no
  ``step_seconds`` (other candidates over it are dropped when sized). One
  that fails to build/compile/run (or gives NaN) is a FAIL trial whose
  ``user_attrs["reason"]`` says why; the search goes on. One that failed to
  build or compile (``user_attrs["compile_failed"]``) does not count towards
  ``n_trials`` or ``total_trials``: it measured nothing.
* The choices marked risky on this platform (offload policies on a GPU or TPU,
  ``Schedule.checks``; XLA compiler options on a GPU, ``space.checks``) are probed
  on a small instance of the problem when the planner first proposes a schedule
  using them -- and each combination of them it proposes; those that fail or change
  the results are left out of the study's space, recorded in the study and in a
  cache beside the storage (``autoremat._search.probes``).
* A step that tags values with ``jax.ad_checkpoint.checkpoint_name`` gets policies over
  those tags offered per level beside the fixed ones (``autoremat._search.named_policies``).
* A layer stack (a short scan of heavy steps, ``autoremat._search.planning.presets``) is seeded
  with remat of each layer alone; the presets a user would pick are tried before any
  other candidate, and the study records what each tag costs (``NAME_COSTS``).
* A schedule compiled twice (sized, then re-timed, confirmed or proved; or in a resumed
  or repeated tune) is read back from JAX's persistent compilation cache beside the
  storage (``autoremat._measure.compile_cache``); ``TuneResult.compile_cache`` counts it.
* The trial's user attrs hold every figure (``Measurement.to_attrs``), the
  schedule and the model's ``predicted_seconds``; the study its
  ``StudyInfo``. The same study name resumes; Ctrl-C keeps finished trials.
* Many workers (``autoremat._search.storage``): ``autoremat tune`` started N times on
  one PostgreSQL URL (or one SQLite file on one machine) share one study;
  each plans from what every worker measured so far. A worker claims a
  schedule under ``StudyLock``, so no schedule is measured twice and, with
  ``total_trials``, the study ends with exactly that many measured trials. A
  trial whose worker died goes stale and is re-queued; with ``total_trials``
  a worker waits for trials still running elsewhere (or going stale) before
  it stops, so every worker ends on the same answer.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from autoremat._errors import BudgetError, ProblemError, TuneError, one_line
from autoremat._measure.breakdown import argument_parts
from autoremat._measure.compile_cache import persistent_cache
from autoremat._measure.device import arguments_fingerprint, environment
from autoremat._measure.mesh import layout
from autoremat._measure.peers import peers_of
from autoremat._measure.problem import Problem, Step
from autoremat._measure.timing import DEFAULT_TIME_BUDGET
from autoremat._schedules import plain, save_schedule
from autoremat._schedules.policy import Policy
from autoremat._search.attrs import DOT_FORMS, LAYER_STACK, NAME_COSTS
from autoremat._search.bound import Bound, BoundWatch, start_bound
from autoremat._search.confirm import confirm
from autoremat._search.named_policies import named_policies, step_costs
from autoremat._search.planning.layer_costs import LayerCosts
from autoremat._search.planning.presets import is_layer_stack
from autoremat._search.probes.cache import VerdictCache, cache_path, environment_key
from autoremat._search.probes.guard import ProbeGuard
from autoremat._search.probes.probe import RULES
from autoremat._search.proof import prove_fit
from autoremat._search.reports import TuneEvent
from autoremat._search.resume import default_study_name, open_study
from autoremat._search.storage import (
    DEFAULT_HEARTBEAT,
    DEFAULT_STORAGE,
    StudyLock,
    open_storage,
    optuna_verbosity,
    redact,
)
from autoremat._search.study import Overrun, StudyInfo, TuneResult, measured_trials, summarize
from autoremat._search.tune_log import LOGGER, TuneLog, log_result
from autoremat._search.worker import OnTrial, Worker
from autoremat._units import format_bytes, parse_bytes, parse_duration, parse_whole_seconds

#: ``tune``'s default time limit: the built-in problem at T=10^4 in under 2.5 minutes.
DEFAULT_TIME_LIMIT: Final = "2m"
#: The folder of compiled executables beside a study's storage (``compile_cache``).
COMPILE_CACHE_DIR: Final = "xla_cache"


def tune(
    problem: Problem,
    budget_bytes: int | str,
    *,
    n_trials: int | None = None,
    total_trials: int | None = None,
    time_limit: float | str | None = DEFAULT_TIME_LIMIT,
    explore_front: bool = False,
    storage: str | None = None,
    study_name: str | None = None,
    seed: int = 0,
    out: str | Path | None = None,
    time_budget: float | str = DEFAULT_TIME_BUDGET,
    heartbeat: int | str = DEFAULT_HEARTBEAT,
    on_trial: OnTrial | None = None,
    on_confirm: Callable[[TuneEvent], None] | None = None,
    on_bound: Callable[[Bound], None] | None = None,
    progress: bool = False,
) -> TuneResult:
    """Find the fastest schedule of ``problem``'s step whose total memory fits.

    Candidates are sized by compiling them (cheap); only those that fit and
    that the calibrated cost model does not rule out are timed (about
    ``time_budget`` s each): the time goes near the answer, and the memory each
    schedule saves is paid for in recomputation, which the timing measures.

    Each trial, each full-length timing and the answer are logged on the ``autoremat``
    logger (``logging``, level INFO: ``logging.basicConfig(level=logging.INFO)`` shows
    them).

    Args:
      problem: the training step (see ``autoremat.Problem``).
      budget_bytes: the memory budget for ``total_bytes``: bytes (an int), or text as
        ``autoremat tune --budget`` takes it (``"4GB"``, ``"512MiB"``;
        ``autoremat.parse_bytes``) -- per device when the problem's arguments are
        sharded over many. Under the step's arguments alone it is refused before
        anything compiles (``BudgetError``).
      n_trials: measure this many schedules in this call, fewer when a small
        space runs out of candidates (duplicates do not count); ``None``: until
        the planner is done or ``time_limit``.
      total_trials: stop when the study holds this many measured schedules,
        counting every worker's; a worker waits for the last ones measured
        elsewhere (or for them to go stale and be retried) before it returns.
      time_limit: stop starting new compiles or trials after this long, from
        the call's start: seconds, or text such as ``"90s"``, ``"5m"``,
        ``"1.5h"`` (``None``: no limit). A trial under way finishes. A pick
        timed on short runs is then timed at full length.
      explore_front: measure the whole front, not just near the fastest
        schedule that fits (no stop on predictions, no cut trials).
      storage: an Optuna storage URL; default ``sqlite:///runs/autoremat.db``.
      study_name: resume or create this study; default from the problem,
        device and budget, so running the same call again resumes.
      seed: the seed of the planner's random candidates (offset by the trials already
        in the study).
      out: when given and a schedule fits, write it there (atomic YAML).
      time_budget: about how long timing one schedule may take: seconds, or text as
        ``time_limit`` takes it (``"5s"``).
      heartbeat: whole seconds between a running trial's heartbeats (or text: ``"90s"``,
        ``"1m"``; RDB storages); a trial silent for three heartbeats is stale: failed
        and retried.
      on_trial: called as ``on_trial(study, frozen_trial)`` after each trial
        (``autoremat.MeasuredTrial.of(frozen_trial)`` reads it).
      on_confirm: called with a record of what the search is doing (``TuneEvent``):
        ``FullLengthTiming`` before each full-length timing of a schedule timed on short
        runs, ``ProbeChecked`` per risky choice (offload) the study checked on the problem
        before offering it, ``ProofRetry`` per pick that failed the proof of fit; the
        command line words them.
      on_bound: called with what scheduling can save at most, measured by two compiles
        before the search (the step as written and every long scan at its least memory).
        Where that is a negligible share of the step and neither ``n_trials`` nor
        ``total_trials`` asks for more, only the plain scan is timed (the answer where it
        fits; on an accelerator, what was timed while the bound compiled too); on a CPU,
        where even the least-memory schedule is over the budget then, nothing is timed.
      progress: draw a progress bar over the trials (tqdm; a widget in a notebook).

    Returns:
      A ``TuneResult``; ``best`` is ``None`` when nothing measured fits.

    Raises:
      BudgetError: the budget cannot be read, or is under the step's arguments alone
        (per device), which every schedule keeps: nothing can fit.
      TuneError: the storage cannot be opened, ``out`` cannot be written, the
        named study was made for another problem, argument shapes, device or
        budget.
      ProblemError: the problem's step cannot be built.
      LockstepLost: in a lockstep tune, another process of the job was lost (its
        message says which); the same call on every process resumes the study.

    With ``jax.process_count() > 1`` every process of the job makes this same call:
    process 0 decides and alone writes the study and ``out``, every process compiles and
    runs each schedule, and all return the same result.
    """
    import jax

    beat = parse_whole_seconds(heartbeat, "heartbeat")
    budget = parse_bytes(budget_bytes, "budget")
    log = TuneLog(n_trials if n_trials is not None else total_trials, progress, on_trial,
                  on_confirm)
    LOGGER.info("tuning %s under %s per device", problem.name, format_bytes(budget))
    search = functools.partial(
        _tune, budget_bytes=budget, n_trials=n_trials,
        total_trials=total_trials,
        limit=None if time_limit is None else parse_duration(time_limit, "time_limit"),
        explore_front=explore_front, storage=storage, study_name=study_name, seed=seed,
        out=out, time_budget=parse_duration(time_budget, "time_budget"),
        heartbeat=beat, on_trial=log.on_trial, on_confirm=log.on_confirm,
        on_bound=functools.partial(_log_bound, on_bound))
    try:
        if jax.process_count() > 1 and peers_of(problem) is None:  # every process runs this
            from autoremat._search.lockstep import in_lockstep

            result = in_lockstep(problem, beat, search)
        else:
            result = search(problem)
    finally:
        log.close()
    log_result(result)
    return result


def _tune(problem: Problem, *, budget_bytes: int, n_trials: int | None,
          total_trials: int | None, limit: float | None, explore_front: bool,
          storage: str | None, study_name: str | None, seed: int, out: str | Path | None,
          time_budget: float, heartbeat: int, on_trial: OnTrial | None,
          on_confirm: Callable[[TuneEvent], None] | None,
          on_bound: Callable[[Bound], None] | None) -> TuneResult:
    """``tune`` on its arguments read (a budget in bytes, seconds): from here the budget
    and the problem's facts travel in the study's ``StudyInfo``."""
    import optuna

    start = time.monotonic()
    with optuna_verbosity(optuna.logging.WARNING), persistent_cache(  # restored after
            compile_cache_folder(storage)) as cache_use:
        info, built = _study_info(problem, budget_bytes, storage)
        _refuse_under_arguments(info.budget_bytes, built[2], problem.arg_names)
        storage_obj = open_storage(storage, heartbeat=heartbeat)
        name = study_name or default_study_name(info)
        lock = StudyLock(storage_obj, name)
        costs = step_costs(built[1], built[2], problem.seq_len)  # one trace: tags, matmuls
        layers = LayerCosts(problem.seq_len, costs) if (
            costs is not None and is_layer_stack(problem.seq_len, costs)) else None
        study = open_study(storage_obj, name, info, lock, layer_stack=layers is not None)
        study.set_user_attr(LAYER_STACK, layers is not None)  # exports word layers, time steps
        if layers is not None and costs is not None and costs.tags:
            study.set_user_attr(NAME_COSTS, layers.table())
            study.set_user_attr(DOT_FORMS, {p: list(t) for p, t in costs.dot_forms.items()})
        named = named_policies({} if costs is None else costs.tags, info.platform or "")
        guard = _probe_guard(problem, info, study, lock, storage, on_confirm, named)
        search = Worker(problem, info, study, storage_obj, lock, total_trials=total_trials,
                        time_budget=time_budget, heartbeat=heartbeat, on_trial=on_trial,
                        explore_front=explore_front, seed=seed, built=built,
                        # in lockstep, no risky choice: its probe would run on process 0 alone
                        refused=guard.refused if peers_of(problem) is None else guard.labels,
                        guard=guard, named=named, layer_costs=layers)
        search.prefetch()  # the first compiles ahead, handed to the threads before the bound's
        # the bound's compiles after (the search reads it between trials); in lockstep the
        # followers compile only what a trial announces: no bound there
        pending = (start_bound(study, problem, built[1:], info.platform or "")
                   if peers_of(problem) is None else None)
        del built
        watch = BoundWatch(study, pending, info.budget_bytes, info.platform or "",
                           n_trials is None and total_trials is None, on_bound)
        interrupted = search.run(n_trials, None if limit is None else
                                 limit - (time.monotonic() - start), most=watch.cap)
        bound = watch.bound()  # waited for where the search ended before it
        search_measured, too_late = search.measured, search.too_late()
        unconfirmed = "" if interrupted else confirm(study, problem, info, time_limit=limit,
                                                     time_budget=time_budget, on_confirm=on_confirm)
        kept = search.take_kept()  # the answer's executable: the proof runs it
        del search  # its other executables: what they reserve on a device is not the pick's
        proof = None if interrupted else prove_fit(study, problem, info, on_confirm, kept)
        if kept is not None:
            kept.release()
        result = summarize(study, storage or DEFAULT_STORAGE, info=info, measured=search_measured,
                           interrupted=interrupted, unconfirmed=unconfirmed, proof=proof,
                           compile_cache=cache_use(), too_late=too_late)
        if limit is not None:
            result = replace(result, overrun=_overrun(study, limit, time.monotonic() - start,
                                                      search_measured, bound))
        if out is not None:
            _write_best(result, out)
        return result


def compile_cache_folder(storage: str | None) -> Path | None:
    """Where a study's compiled executables are kept (``compile_cache``): beside its
    SQLite file, else ``runs/`` (another storage); ``None``: an in-memory storage."""
    url = storage or DEFAULT_STORAGE
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if path in ("", ":memory:") or path.startswith("file::memory:"):
            return None
        return Path(path).parent / COMPILE_CACHE_DIR
    if url.startswith("sqlite:"):
        return None
    return Path("runs") / COMPILE_CACHE_DIR


def _study_info(problem: Problem, budget_bytes: int, storage: str | None,
                ) -> tuple[StudyInfo, tuple[str, Step, tuple[Any, ...]]]:
    """What the study is for, from the plain scan's arguments, and that build (its compile
    reuses it: the step is built once)."""
    env = environment()
    reference = plain(problem.seq_len)
    try:
        step, args = problem.build(reference)
    except Exception as e:
        raise ProblemError(f"problem: {problem.name}: build(plain scan) failed: "
                           f"{one_line(e)}") from e  # the user's traceback, for --debug
    devices, mesh = layout(args)
    info = StudyInfo(budget_bytes=budget_bytes, seq_len=problem.seq_len, problem=problem.name,
                     fingerprint=arguments_fingerprint(args), device_kind=env["device_kind"],
                     platform=env["platform"], storage=redact(storage or DEFAULT_STORAGE),
                     devices=devices, mesh=mesh, fuse_choice=problem.fuse_choice,
                     notes=problem.notes)
    return info, (reference.key(), step, args)


def _overrun(study: Any, limit: float, elapsed: float, measured: int,
             bound: Bound | None) -> Overrun | None:
    """The limit spent inside one compile: the bound's (nothing measured after it) or the
    last measured trial's outlasted the whole limit (``None`` when the call kept to it, or
    no compile did)."""
    if elapsed <= limit:
        return None
    if measured == 0:
        fresh = bound is not None and bound.seconds >= limit
        return Overrun(limit, elapsed, None, bound.seconds) if fresh and bound else None
    trials = measured_trials(study)
    last = max(trials, key=lambda t: t.number, default=None)
    seconds = None if last is None else last.measurement.timing.compile_seconds
    if last is None or seconds is None or seconds < limit:
        return None
    return Overrun(limit, elapsed, last.number, float(seconds))


def _log_bound(then: Callable[[Bound], None] | None, bound: Bound) -> None:
    LOGGER.info("scheduling can save at most %s (%.1f%%) of the step's %s (least-memory "
                "schedule %s: %s)", format_bytes(bound.saving), 100 * bound.share,
                format_bytes(bound.step_bytes), bound.least, format_bytes(bound.least_bytes))
    if then is not None:
        then(bound)


def _refuse_under_arguments(budget_bytes: int, args: tuple[Any, ...],
                            names: tuple[str, ...] | None) -> None:
    """A budget under the step's arguments (per device, as the device holds them) fits
    nothing: every schedule keeps them, and every total and runtime peak counts them.
    Refused before anything compiles."""
    parts = argument_parts(args, names)
    floor = sum(size for _, size in parts)
    if budget_bytes < floor:
        largest = ", ".join(f"{name} {format_bytes(size)}" for name, size in
                            sorted(parts, key=lambda p: -p[1])[:3])
        raise BudgetError(
            f"budget: nothing fits in {format_bytes(budget_bytes)} ({budget_bytes} bytes): "
            f"the step's arguments alone take {format_bytes(floor)} per device ({largest}), "
            "and every schedule keeps them; give a budget above that, with its unit (4GB)")


def _probe_guard(problem: Problem, info: StudyInfo, study: Any, lock: StudyLock,
                 storage: str | None, on_note: Callable[[TuneEvent], None] | None,
                 named: Mapping[str, Policy]) -> ProbeGuard:
    """The study's probe of risky choices, run as the planner first proposes each
    (``autoremat._search.probes.guard``), its verdicts cached beside the storage."""
    cache = VerdictCache(cache_path(storage), f"{environment_key()}|{RULES}",
                         f"{problem.name}|{info.fingerprint}")
    return ProbeGuard(problem, info.platform or "", study, lock, cache, on_note, named)


def _write_best(result: TuneResult, out: str | Path) -> None:
    """Write the answer (atomic YAML); nothing when nothing fits."""
    if result.best is None or result.best_trial is None:
        return
    try:
        save_schedule(result.best, out)
    except OSError as e:
        raise TuneError(
            f"out: cannot write {str(out)!r} ({e.strerror or e}); the study is kept: "
            f"export trial {result.best_trial.number} to another file") from None
