"""One worker's search on an open study: plan a schedule, claim it, measure it, count.

``autoremat._search.tune`` opens the study and runs a ``Worker`` on it: each
measurement is one Optuna trial holding its schedule and figures; a schedule is
measured at most once per study (claimed under ``StudyLock`` across workers);
with ``total_trials`` a worker waits for the last trials measured elsewhere.
The module doc of ``tune`` says what the search does; this module is how.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

from autoremat._measure.failure import BUILD, COMPILE
from autoremat._measure.measurement import ERROR, Measurement
from autoremat._measure.problem import Problem, Step
from autoremat._measure.timing import Compiled
from autoremat._schedules import from_data, plain
from autoremat._schedules.base import Schedule
from autoremat._schedules.policy import Policy
from autoremat._search.attrs import (
    COMPILE_FAILED,
    DESCRIBE,
    DUPLICATE_OF,
    MEASURED,
    MEASURING,
    PREDICTED_SECONDS,
    SCHEDULE,
    SCHEDULE_KEY,
    TOTAL_REACHED,
    WAITING_TAKEN,
    retimed_key,
)
from autoremat._search.planning.candidates import Candidate, TooLate
from autoremat._search.planning.compile_pool import CompilePool
from autoremat._search.planning.layer_costs import LayerCosts
from autoremat._search.planning.planner import Planner
from autoremat._search.retime import RESERVE_SHARE, contenders, retime_cost, retime_group, to_reserve
from autoremat._search.short_runs import ShortRuns
from autoremat._search.storage import StudyLock, optuna_verbosity, set_params, set_user_attrs
from autoremat._search.study import MeasuredTrial, StudyInfo
from autoremat._search.trial_params import schedule_params
from autoremat._search.trials import (
    fastest_fitting,
    find_measured,
    is_claimed,
    is_measured,
    progress,
)

if TYPE_CHECKING:
    import optuna
    from optuna.storages import RDBStorage
    from optuna.trial import FrozenTrial

    from autoremat._search.probes.guard import ProbeGuard


_MAX_DUPLICATES_IN_A_ROW: Final = 50
#: Without ``n_trials``, at most this many (the planner or the time limit stops first).
_MAX_TRIALS: Final = 10_000
OnTrial = Callable[["optuna.Study", "FrozenTrial"], None]
#: What a worker does next (``Worker.next_step``).
NextStep = Literal["measure", "wait", "stop"]


class MeasurementFailed(RuntimeError):
    """A schedule failed to build, compile or run; the trial is marked FAIL."""


def compile_failed(m: Measurement) -> bool:
    """The schedule failed to build or compile, at full length or for its short run
    (``Measurement.failed_at``): nothing ran, nothing was measured."""
    return m.status == ERROR and m.failed_at in (BUILD, COMPILE)


class Worker:
    """One worker's search on an open study: claim a schedule, measure it, count.

    Attributes:
      measured: schedules this worker measured.
      duplicates_in_a_row: trials pruned as duplicates since the last measured one.
      attempts: trials started.
    """

    def __init__(self, problem: Problem, info: StudyInfo, study: optuna.Study,
                 storage: RDBStorage, lock: StudyLock, *, total_trials: int | None,
                 time_budget: float, heartbeat: int, on_trial: OnTrial | None,
                 explore_front: bool = False, seed: int = 0,
                 built: tuple[str, Step, tuple[Any, ...]] | None = None,
                 refused: frozenset[str] = frozenset(),
                 named: Mapping[str, Policy] | None = None,
                 layer_costs: LayerCosts | None = None,
                 guard: ProbeGuard | None = None) -> None:
        self.problem, self.info, self.study, self.lock = problem, info, study, lock
        self.short = ShortRuns(problem)  # times long problems on short runs
        self.planner = Planner(problem, info.budget_bytes, info.platform or "", self.short,
                               seed=seed + len(study.trials), explore_front=explore_front,
                               time_budget=time_budget, built=built, refused=refused,
                               named=dict(named or {}), layer_costs=layer_costs,
                               guard=guard,
                               compiles=CompilePool.for_problem(problem, info.budget_bytes,
                                                                info.platform or ""))
        self.total_trials, self.time_budget, self.heartbeat = total_trials, time_budget, heartbeat
        self.on_trial = on_trial
        self.storage = storage if hasattr(storage, "get_all_trials") else None
        self.heartbeats = getattr(self.storage, "heartbeat_interval", None) is not None
        self.measured = 0
        self.duplicates_in_a_row = 0
        self.attempts = 0
        self.kept: Compiled | None = None  # the answer's executable (``_keep_if_pick``)
        self.retimed: list[frozenset[str]] = []  # the keys of each group re-timed (``retime``)
        self.retiming = False  # the search re-times before it stops (``run``)
        self.limit: float | None = None  # ``run``'s time limit

    def prefetch(self) -> None:
        """The first schedules handed to the compile threads (if any) before ``run``."""
        self.planner.prefetch(first=self.waiting())

    def fresh_trials(self) -> list[FrozenTrial]:
        """Every trial as the storage holds it now. Optuna's cache of an RDB storage reads
        again each trial not finished (another worker's claim) and each added since, and
        keeps the finished ones, which no longer change: the whole study read each time, an
        attr a row, each row a wait for the GIL beside the compile threads
        (``studies/results/storage_gil.md``)."""
        return self.study.get_trials(deepcopy=False)

    def claim(self, trial: optuna.Trial, key: str,
              attrs: Mapping[str, Any]) -> list[FrozenTrial]:
        """Claim ``key`` for this trial, or prune it (duplicate, or the total is reached);
        either way the trial gets ``attrs`` (its schedule) with the outcome, in one write.
        Returns the study's trials as read for the claim."""
        import optuna

        with self.lock:
            trials = self.fresh_trials()
            dup = find_measured(trials, key, trial.number)
            if dup is not None:
                set_user_attrs(trial, {**attrs, DUPLICATE_OF: dup})
                raise optuna.TrialPruned(f"schedule already measured in trial {dup}")
            if self.total_trials is not None:
                done, running = progress(trials, exclude=trial.number)
                if done + running >= self.total_trials:
                    set_user_attrs(trial, {**attrs, TOTAL_REACHED: self.total_trials})
                    raise optuna.TrialPruned(f"the study has its {self.total_trials} trials")
            set_user_attrs(trial, {**attrs, MEASURING: True})
        return trials

    def objective(self, trial: optuna.Trial, planned: Candidate | None) -> tuple[float, float]:
        """Measure ``planned`` -- or, when Optuna handed this worker a trial enqueued
        before (a seed, or the retry of a trial whose worker died), the schedule that
        trial holds: claim it, size it (from the planner's screen when it has one) and, if
        it fits, time it; ``(total_bytes, step_seconds)``."""
        import optuna

        budget = self.info.budget_bytes
        enqueued = trial.user_attrs.get(SCHEDULE)
        if enqueued is not None:
            cand = self.planner.candidate(from_data(enqueued))
        elif planned is not None:
            cand = planned
        else:  # nothing planned, and the trial waiting for it was taken by another worker
            trial.set_user_attr(WAITING_TAKEN, True)
            raise optuna.TrialPruned("no schedule to measure")
        schedule, key = cand.schedule, cand.schedule.key()
        trials = self.claim(trial, key, {SCHEDULE_KEY: key, SCHEDULE: schedule.to_data(),
                                         DESCRIBE: schedule.describe()})
        set_params(trial, {name: (spec.value, spec.distribution()) for name, spec in
                           schedule_params(schedule, self.info.seq_len).items()})
        # the next candidates (the enqueued seeds first) compile while this one compiles
        # (the first seeds beside the plain scan, not the largest candidates: on a TPU
        # they ran out of memory beside it) and while it is timed
        self.planner.prefetch(exclude=key, first=self.waiting(trials))
        compiled = self.planner.take_compiled(cand)
        self.planner.prefetch()
        predicted = self.planner.predict(cand)
        m = self.short.time(schedule, compiled, budget_bytes=budget, time_budget=self.time_budget,
                            best=self.planner.rival())
        self.planner.record(schedule, m)
        # the constraint before the figures: Optuna reads the whole trial back to set it,
        # an attr a row, each row a wait for the GIL beside the compile threads
        size = m.size_bytes  # the runtime peak, else the estimate, or the compiler's (OOM)
        if size is not None:  # refused by the compiler: over, whatever the budget says
            over = float(size - budget)
            trial.set_constraint("memory", max(over, 1.0) if m.total_bytes is None else over)
        failed = {COMPILE_FAILED: True} if compile_failed(m) else {}  # not one of n_trials
        set_user_attrs(trial, {PREDICTED_SECONDS: predicted, **m.to_attrs(), **failed,
                               MEASURED: True})
        # the study as read for the claim, and this trial's figures as now written: the
        # pick the proof reads later (another worker's trials since are not waited for)
        self._keep_if_pick([compiled], [*self.measured_trials(trials),
                                        MeasuredTrial(trial.number, schedule, m)])
        if m.status == ERROR or size is None:
            raise MeasurementFailed(m.reason)
        seconds = m.step_seconds if m.step_seconds is not None else m.cut_seconds
        return float(m.total_bytes if m.total_bytes is not None else size), (
            seconds if seconds is not None else math.inf)

    def _keep_if_pick(self, compiled: list[Compiled],
                      measured: list[MeasuredTrial] | None = None) -> None:
        """Keep the executable of the study's answer as it stands (``trials.tie_break``, as
        the proof of fit picks: one compile less there, seconds on an accelerator) among
        ``measured`` (``None``: read now); release the rest of ``compiled`` and the one kept
        before. One is held at a time: each is a program (on a device, what it reserves)
        beside the schedules timed next."""
        if measured is None:
            measured = self.measured_trials(self.fresh_trials())
        pick = fastest_fitting(measured, self.info.budget_bytes, self.info.seq_len)
        held = ([self.kept] if self.kept is not None else []) + compiled
        self.kept = next((c for c in held if c.executable is not None and pick is not None
                          and c.measurement.schedule_key == pick.schedule.key()), None)
        for c in held:
            if c is not self.kept:
                c.release()

    def too_late(self) -> tuple[TooLate, ...]:
        """The candidates not compiled as their compile would end past the time limit."""
        return tuple(self.planner.too_late)

    def take_kept(self) -> Compiled | None:
        """The kept executable (``_keep_if_pick``), now the caller's to release."""
        kept, self.kept = self.kept, None
        return kept

    def waiting(self, trials: list[FrozenTrial] | None = None) -> list[Schedule]:
        """The schedules of the trials enqueued and not started (seeds, retries): measured
        before any the planner picks. Only where the planner has compile threads; from
        ``trials`` where the caller has just read the study, else read here."""
        from optuna.trial import TrialState

        if not self.planner.compiles_ahead:
            return []
        return [from_data(t.user_attrs[SCHEDULE]) for t in
                (self.fresh_trials() if trials is None else trials)
                if t.state == TrialState.WAITING and SCHEDULE in t.user_attrs]

    def callback(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Count the finished trial, then call ``on_trial``."""
        if trial.user_attrs.get(MEASURED):
            self.measured += not trial.user_attrs.get(COMPILE_FAILED)
            self.duplicates_in_a_row = 0
        elif DUPLICATE_OF in trial.user_attrs:
            self.duplicates_in_a_row += 1
        if self.on_trial is not None:
            self.on_trial(study, trial)

    def fail_stale(self) -> None:
        """Fail (and so re-queue) trials whose worker stopped sending heartbeats."""
        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)

    def next_step(self) -> NextStep:
        """With ``total_trials``: ``"stop"`` (reached), ``"wait"`` (others are measuring
        the last slots: wait for them to finish or go stale, then their retry is ours
        to run) or ``"measure"``."""
        if self.total_trials is None:
            return "measure"
        if self.heartbeats:
            self.fail_stale()
        done, running = progress(self.fresh_trials())
        if done >= self.total_trials:
            return "stop"
        if done + running >= self.total_trials:
            return "wait" if self.heartbeats else "stop"
        return "measure"

    def plan(self, deadline: float | None, explore: bool,
             dominated: bool = False) -> Candidate | Literal["enqueued"] | None:
        """The planner's next candidate; ``"enqueued"`` when a trial is already waiting (a
        seed or a retry: Optuna hands it to the next ``optimize``); ``None`` when there is
        nothing left worth measuring."""
        from optuna.trial import TrialState

        trials = self.fresh_trials()
        if any(t.state == TrialState.WAITING for t in trials):
            return "enqueued"
        measured = self.measured_trials(trials)
        self.planner.observe([(m.schedule, m.measurement) for m in measured],
                             {str(t.user_attrs.get(SCHEDULE_KEY)) for t in trials
                              if is_measured(t) or is_claimed(t)})
        if self.retiming:  # the re-timing the noise asks for is paid before the limit
            self.planner.reserve(self.retime_reserve(measured))
        return self.planner.next(deadline, explore=explore, dominated=dominated)

    def measured_trials(self, trials: list[FrozenTrial]) -> list[MeasuredTrial]:
        """The trials' measurements, with the study's re-timings (``retime``)."""
        attrs = self.study.user_attrs
        return [m for m in (MeasuredTrial.of(t, attrs) for t in trials) if m is not None]

    def contenders(self, measured: list[MeasuredTrial]) -> list[MeasuredTrial]:
        """The leader and the challengers it is to be re-timed with (``retime.contenders``:
        where their noise asks for it), not re-timed before; ``[]``: none."""
        return contenders(measured, self.info.budget_bytes, plain(self.problem.seq_len).key(),
                          self.retimed)

    def retime_reserve(self, measured: list[MeasuredTrial]) -> float:
        """Seconds to keep back for the re-timing the noise asks for (``retime.to_reserve``:
        one not asked for yet by a challenger, at most ``RESERVE_SHARE`` of the limit)."""
        group = to_reserve(measured, self.info.budget_bytes, plain(self.problem.seq_len).key(),
                           self.retimed)
        cost = self.retime_cost(group)
        if group and group[0] is group[-1] and self.limit is not None:  # anticipated
            cost = min(cost, RESERVE_SHARE * self.limit)
        return cost

    def retime_cost(self, group: list[MeasuredTrial]) -> float:
        """About how long re-timing ``group`` takes (0 for none)."""
        return retime_cost(self.short, group, self.planner.compile_cost()) if group else 0.0

    def retime(self, deadline: float | None) -> bool:
        """Before the search stops: its leader run in turn with its closest challengers
        (``autoremat._search.retime``), their figures written to the study; ``True`` when
        they ran (the planner looks again), ``False`` when there is nothing to re-time or
        the time left cannot pay for it."""
        group = self.contenders(self.measured_trials(self.fresh_trials()))
        if not group:
            return False
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left < self.retime_cost(group):
            return False
        self.retimed.append(frozenset(t.schedule.key() for t in group))
        figures, compiled = retime_group(self.short, group, self.kept)
        if not figures:
            return False
        for number, figure in figures.items():
            self.study.set_user_attr(retimed_key(number), figure.to_attrs())
        self.planner.observe([(t.schedule, t.measurement) for t in self.measured_trials(
            self.fresh_trials())])
        self._keep_if_pick(list(compiled.values()))
        return True

    def run(self, n_trials: int | None, time_limit: float | None,
            most: Callable[[int], int | None] | None = None) -> bool:
        """Measure schedules until the planner is done, ``n_trials`` are measured (then
        exactly that many: past the planner's stop, dominated ones too), ``most`` (asked
        before each trial with the number measured: the most to measure, if known) or
        the time limit; ``True`` when Ctrl-C stopped it."""
        import optuna

        deadline = None if time_limit is None else time.monotonic() + time_limit
        self.limit = time_limit
        cap = n_trials if n_trials is not None else _MAX_TRIALS
        max_attempts = cap * 10 + _MAX_DUPLICATES_IN_A_ROW
        # A failed schedule is a FAIL trial with its reason in user_attrs (and on_trial);
        # Optuna's own warning would print the MeasurementFailed traceback.
        with optuna_verbosity(optuna.logging.ERROR):
            try:
                while (self.measured < cap and self.attempts < max_attempts
                       and self.duplicates_in_a_row < _MAX_DUPLICATES_IN_A_ROW):
                    left = None if deadline is None else deadline - time.monotonic()
                    at_most = None if most is None else most(self.measured)
                    if (left is not None and left <= 0) or (at_most is not None
                                                            and self.measured >= at_most):
                        break
                    step = self.next_step()
                    if step == "stop":
                        break
                    if step == "wait":
                        pause = min(1.0, self.heartbeat / 4)
                        time.sleep(pause if left is None else max(0.0, min(pause, left)))
                        continue
                    exact = n_trials is not None or self.total_trials is not None
                    self.retiming = not exact and not self.planner.explore_front
                    planned = self.plan(deadline, self.planner.explore_front)
                    if planned is None and exact:
                        planned = self.plan(deadline, True, True)
                    if planned is None and self.retiming and self.retime(deadline):
                        continue  # the leader and its challengers re-timed: plan again
                    if planned is None:
                        break
                    self.attempts += 1
                    cand = planned if isinstance(planned, Candidate) else None
                    self.study.optimize(functools.partial(self.objective, planned=cand), n_trials=1,
                                        catch=(MeasurementFailed,), callbacks=[self.callback],
                                        gc_after_trial=False)
                if self.heartbeats:
                    self.fail_stale()
            except KeyboardInterrupt:
                return True
            finally:
                self.planner.close()  # what the compile threads took ahead is released
        return False
