"""Compiles in parallel with timing (issue 47 item 3, ``autoremat._search.planning.compile_pool``).

On the CPU the rule gives one worker (no compile thread), so the tests ask for two
(``AUTOREMAT_COMPILE_WORKERS``). A *fake slow compiler* (a thread's real compile, held
back until a timing starts, recording where and when it ran) and a *fake timer* (a
made-up step time per schedule, no run) make the search deterministic: two searches
decide the same, and the events' order -- never their wall-clock times -- shows what
overlapped.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import autoremat._search.planning.clock as clock_module
import autoremat._search.planning.compile_pool as pool_module
import autoremat._search.planning.planner as plan_module
import autoremat._search.retime as retime_module
from autoremat._errors import TuneError
from autoremat._measure.measure import Compiled
from autoremat._measure.measurement import OK, OVER_BUDGET, Measurement
from autoremat._measure.problem import Problem
from autoremat._measure.timing import CUT_RATIO
from autoremat._schedules.base import Schedule
from autoremat._search.planning.compile_pool import WORKERS_ENV, CompilePool, compile_workers
from autoremat._search.short_runs import ShortRuns
from autoremat._search.study import load_study, measured_trials
from autoremat._search.tune import tune
from tests.tiny_problem import tiny

BUDGET = 2400  # the tiny plain scan needs ~2.6 KB: over


def test_the_pool_size_follows_the_host_cores_and_is_one_on_a_cpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert compile_workers("tpu", cores=2) == 1  # a 2-core machine: sequential
    assert compile_workers("tpu", cores=13) == 6  # the TPU v5e host
    assert compile_workers("gpu", cores=8) == 4
    assert compile_workers("tpu", cores=64) == 6  # at most MAX_WORKERS
    assert compile_workers("cpu", cores=64) == 1  # the timed step runs on those cores
    monkeypatch.setenv(WORKERS_ENV, "2")
    assert compile_workers("cpu") == 2
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(WORKERS_ENV, bad)
        with pytest.raises(TuneError, match=WORKERS_ENV):
            compile_workers("tpu")


class _Gate:
    """A fake compiler whose compiles finish only when the test opens their gate."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.made: list[Compiled] = []

    def __call__(self, schedule: Any) -> Compiled:
        self.started.setdefault(schedule, threading.Event()).set()
        self.gates[schedule].wait(timeout=30)
        compiled = Compiled(Measurement(str(schedule), OK), executable=object(), args=(1,))
        self.made.append(compiled)
        return compiled


def test_the_pool_holds_at_most_one_compile_per_thread_and_releases_what_is_not_taken(
        ) -> None:
    gate = _Gate()
    for key in "abc":
        gate.gates[key], gate.started[key] = threading.Event(), threading.Event()
    pool = CompilePool(gate, workers=3)  # two threads
    assert pool.threads == pool.capacity == 2
    assert pool.submit("a", "a") and pool.submit("b", "b")  # type: ignore[arg-type]
    assert not pool.submit("c", "c")  # type: ignore[arg-type]  # no room: at most two held
    gate.gates["a"].set()
    taken = pool.take("a")
    assert taken is not None and taken.executable is not None
    assert gate.started["b"].wait(timeout=30)
    pool.keep_only([])  # b is not wanted any more: released once compiled
    assert "b" not in pool and pool.room == 1  # still compiling: it holds its thread's slot
    gate.gates["b"].set()
    gate.gates["c"].set()
    pool.close(wait=True)
    assert pool.room == 0 and not pool.submit("c", "c")  # type: ignore[arg-type]
    assert (pool.submitted, pool.taken, pool.released, pool.cancelled) == (2, 1, 1, 0)
    assert [c.executable is None for c in gate.made] == [False, True]  # a: the caller's


def test_closing_does_not_wait_for_a_compile_and_it_is_released_when_done() -> None:
    gate = _Gate()
    gate.gates["a"], gate.started["a"] = threading.Event(), threading.Event()
    pool = CompilePool(gate, workers=2)
    assert pool.submit("a", "a")  # type: ignore[arg-type]
    assert gate.started["a"].wait(timeout=30)
    pool.close()  # "a" is still compiling (its gate is shut): not waited for
    gate.gates["a"].set()
    pool.wait()
    assert [c.executable for c in gate.made] == [None]
    assert (pool.submitted, pool.taken, pool.released, pool.cancelled) == (1, 0, 1, 0)


def test_one_worker_has_no_thread_and_takes_nothing_ahead() -> None:
    pool = CompilePool(lambda s: Compiled(Measurement("x", OK)), workers=1)
    assert pool.threads == pool.room == 0
    assert not pool.submit("x", "x")  # type: ignore[arg-type]
    assert pool.take("x") is None
    pool.close()


def test_a_thread_does_not_compile_under_another_jax_trace_context() -> None:
    """``jax.default_matmul_precision`` is set per thread: a thread would trace another
    program, so it hands the compile back (the main thread compiles it)."""
    import jax

    compiled: list[object] = []
    pool = CompilePool(lambda s: compiled.append(s) or Compiled(Measurement("x", OK)), 2)
    with jax.default_matmul_precision("float32"):
        assert pool.submit("a", "a")  # type: ignore[arg-type]
        assert pool.take("a") is None
    assert pool.submit("b", "b")  # type: ignore[arg-type]
    assert pool.take("b") is not None
    pool.close()
    assert compiled == ["b"] and (pool.taken, pool.cancelled) == (1, 1)


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_a_thread_builds_outside_a_measured_window_and_compiles_per_platform(
        platform: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build may put arrays on the device: it waits for ``device_memory.MEASURE_LOCK``
    (held while a warm-up's memory is read); a TPU compile takes no device memory and
    runs outside it, a GPU one (autotuning scratch) inside."""
    events: list[str] = []
    window = pool_module.device_memory.MEASURE_LOCK

    def build(schedule: Schedule) -> tuple[Any, tuple[Any, ...]]:
        events.append(f"build, window held: {window._is_owned()}")  # type: ignore[attr-defined]
        return (lambda: None), ()

    def fake_compile(problem: Problem, schedule: Schedule, **kw: Any) -> Compiled:
        events.append(f"compile, window held: {window._is_owned()}")  # type: ignore[attr-defined]
        return Compiled(Measurement("x", OK))

    monkeypatch.setattr(pool_module, "compile_schedule", fake_compile)
    problem = Problem(name="p", seq_len=4, build=build)
    pool = CompilePool(lambda s: pool_module.compile_quietly(problem, s, 1, platform), 2)
    with window:  # a warm-up being measured on the main thread
        assert pool.submit("s", "s")  # type: ignore[arg-type]
        events.append("window released")
    assert pool.take("s") is not None
    pool.close()
    assert events[0] == "window released"
    assert events[1:] == (["build, window held: True", "compile, window held: False"]
                          if platform == "tpu" else ["compile, window held: True"])


def test_a_trace_and_a_timing_hold_the_measure_lock_an_xla_compile_does_not() -> None:
    """A trace holds the GIL that a timed run waits for: lowering (any thread's) and
    timing hold ``device_memory.MEASURE_LOCK``, so a compile thread's trace never runs
    beside a timing; XLA's compile, outside the GIL, does."""
    import jax.numpy as jnp

    from autoremat._measure.measure import compile_step
    from autoremat._measure.timing import time_compiled

    lock = pool_module.device_memory.MEASURE_LOCK
    seen: dict[str, bool] = {}

    def step(x: Any) -> Any:
        seen.setdefault("traced", lock._is_owned())  # type: ignore[attr-defined]
        return x * 2.0

    compiled = compile_step(step, (jnp.ones(3),))
    assert compiled.executable is not None and seen == {"traced": True}
    assert not lock._is_owned()  # type: ignore[attr-defined]
    real = compiled.executable

    def timed_run(*a: Any) -> Any:
        seen["run"] = lock._is_owned()  # type: ignore[attr-defined]
        return real(*a)

    compiled.executable = timed_run
    m = time_compiled(compiled, time_budget=0.0, min_repeats=1, max_repeats=1)
    assert m.step_seconds is not None and seen["run"] is True


def test_a_compile_is_sized_behind_the_timing_gate_not_the_measure_lock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizing a compiled step (Python: the GIL kept) goes through ``TIMING_GATE.write``, so
    it waits for a step's timing to end but not for other threads' lowerings under
    ``device_memory.MEASURE_LOCK``: queued behind them, a compiled step waited seconds to
    be sized while the device waited for it."""
    import jax.numpy as jnp

    from autoremat._measure import measure as measure_module
    from autoremat._measure.timing import TIMING_GATE

    lock = pool_module.device_memory.MEASURE_LOCK
    seen: list[tuple[bool, bool]] = []
    real = measure_module.memory_parts

    def sizing(executable: Any) -> dict[str, int | None]:
        seen.append((lock._is_owned(), TIMING_GATE.writing()))  # type: ignore[attr-defined]
        return real(executable)

    monkeypatch.setattr(measure_module, "memory_parts", sizing)
    compiled = measure_module.compile_step(lambda x: x * 2.0, (jnp.ones(3),))
    assert compiled.executable is not None and compiled.measurement.total_bytes is not None
    assert seen == [(False, True)]


class Recorder:
    """The fake slow compiler and the fake timer of one search, and what they saw."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, str, str]] = []  # (what, schedule key, thread)
        self.cv = threading.Condition()
        self.timing = self.waiting = self.closing = False
        self.thread_made: list[Compiled] = []
        self.pools: list[CompilePool] = []
        self.planners: list[plan_module.Planner] = []
        self.seconds: dict[str, float] = {}  # the fake timer's figure of each key
        real_compile = plan_module.compile_schedule
        real_quietly = pool_module.compile_quietly
        real_for_problem = CompilePool.for_problem.__func__  # type: ignore[attr-defined]
        real_take, real_close = CompilePool.take, CompilePool.close
        real_submit = CompilePool.submit
        recorder = self

        def submit(pool: CompilePool, key: str, schedule: Schedule) -> bool:
            handed = real_submit(pool, key, schedule)
            if handed:
                recorder.note("submit", key)
            return handed

        def main_compile(problem: Problem, schedule: Schedule, **kw: Any) -> Compiled:
            recorder.note("compile start", schedule.key())
            compiled = real_compile(problem, schedule, **kw)
            recorder.note("compile end", schedule.key())
            return compiled

        def slow_compile(problem: Problem, schedule: Schedule, budget_bytes: int,
                         platform: str) -> Compiled:
            """The fake slow compiler of a compile thread: it is still compiling when the
            next timing starts (it waits for one, or for the planner to need it, or for the
            end of the search), then it compiles as on a TPU (build and lowering under
            the measure lock, XLA's compile outside it)."""
            with recorder.cv:
                recorder.cv.wait_for(lambda: recorder.timing or recorder.waiting
                                     or recorder.closing, timeout=60)
            recorder.note("compile start", schedule.key())
            compiled = real_quietly(problem, schedule, budget_bytes, "tpu")
            recorder.note("compile end", schedule.key())
            with recorder.cv:
                recorder.thread_made.append(compiled)
            return compiled

        def for_problem(cls: type[CompilePool], *a: Any) -> CompilePool:
            pool = real_for_problem(cls, *a)
            recorder.pools.append(pool)
            return pool

        def take(pool: CompilePool, key: str) -> Compiled | None:
            recorder.flag("waiting", True)
            try:
                return real_take(pool, key)
            finally:
                recorder.flag("waiting", False)

        def close(pool: CompilePool) -> None:
            recorder.flag("closing", True)
            real_close(pool)

        def planner_close(planner: plan_module.Planner) -> None:
            recorder.planners.append(planner)
            real_planner_close(planner)

        real_planner_close = plan_module.Planner.close
        monkeypatch.setattr(plan_module, "compile_schedule", main_compile)
        monkeypatch.setattr(pool_module, "compile_quietly", slow_compile)
        monkeypatch.setattr(CompilePool, "for_problem", classmethod(for_problem))
        monkeypatch.setattr(CompilePool, "take", take)
        monkeypatch.setattr(CompilePool, "submit", submit)
        monkeypatch.setattr(CompilePool, "close", close)
        monkeypatch.setattr(plan_module.Planner, "close", planner_close)
        monkeypatch.setattr(ShortRuns, "time", self.fake_time)
        monkeypatch.setattr(retime_module, "interleaved", self.fake_interleaved)

    def note(self, what: str, key: str) -> None:
        with self.cv:
            self.events.append((what, key, threading.current_thread().name))
            self.cv.notify_all()

    def flag(self, name: str, value: bool) -> None:
        with self.cv:
            setattr(self, name, value)
            self.cv.notify_all()

    def fake_time(self, schedule: Schedule, sized: Compiled, *, budget_bytes: int | None,
                  time_budget: float, best: float | None) -> Measurement:
        """The fake timer: a made-up step time from the schedule's work (no run). It
        ends once every compile handed to a thread has started, as a device's timing
        would while the threads compile."""
        key = schedule.key()
        self.note("time start", key)
        self.flag("timing", True)

        def started() -> bool:
            begun = {k for what, k, _ in self.events if what == "compile start"}
            ahead = self.pools[-1]._ahead if self.pools else {}
            return all(k in begun or f.done() for k, f in list(ahead.items()))

        with self.cv:
            self.cv.wait_for(started, timeout=60)  # the thread notes its start under cv
        self.flag("timing", False)
        self.note("time end", key)
        m = sized.measurement
        if sized.executable is None:
            return m
        seq_len = 32
        seconds = (schedule.cost(seq_len).evaluations + (zlib.crc32(key.encode()) % 97) / 97
                   ) * 1e-4
        ran = replace(m, timed_seq_len=seq_len)
        self.seconds[key] = seconds
        if best is not None and seconds > CUT_RATIO * best:
            return replace(ran, cut_seconds=seconds)
        return replace(ran, step_seconds=seconds, step_samples=(seconds,))

    def fake_interleaved(self, runs: Sequence[Compiled], rounds: int) -> list[list[float]]:
        """Runs in turn before the search stops (``retime``): the fake timer's figures."""
        return [[self.seconds[c.measurement.schedule_key]] * rounds for c in runs]


def _search(tmp: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> tuple[
        Recorder, list[str], str | None]:
    """One deterministic search on the tiny problem: what it saw, the schedules it
    measured (in order) and its pick."""
    monkeypatch.chdir(tmp)
    monkeypatch.setenv(WORKERS_ENV, str(workers))
    recorder = Recorder(monkeypatch)
    result = tune(tiny(), BUDGET, time_budget=0.02, study_name=f"w{workers}", time_limit=None)
    order = [t.schedule.key() for t in sorted(measured_trials(load_study(f"w{workers}")),
                                              key=lambda t: t.number)]
    return recorder, order, None if result.best is None else result.best.key()


@pytest.fixture(scope="module")
def searches(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[
        Recorder, list[str], str | None]]:
    """The same search with 1 worker (sequential) and with 2 (one compile thread)."""
    out = {}
    for workers in (1, 2):
        with pytest.MonkeyPatch.context() as mp:
            out[workers] = _search(tmp_path_factory.mktemp(f"w{workers}"), mp, workers)
    return out


def test_compiles_run_on_a_thread_while_a_schedule_is_timed(searches: Any) -> None:
    recorder, _, _ = searches[2]
    events = recorder.events
    overlapped = []
    for i, (what, key, thread) in enumerate(events):
        if what != "compile start" or thread == threading.main_thread().name:
            continue
        timing = [k for w, k, _ in events[:i] if w == "time start"]
        ended = {k for w, k, _ in events[:i] if w == "time end"}
        if timing and timing[-1] not in ended:  # a schedule was being timed
            overlapped.append(key)
    assert overlapped, events
    pool = recorder.pools[0]
    assert pool.threads == 1 and pool.taken >= 1  # and the planner used what it compiled


def test_the_parallel_search_decides_as_the_sequential_one(searches: Any) -> None:
    _, order1, pick1 = searches[1]
    _, order2, pick2 = searches[2]
    assert pick1 is not None
    assert (order2, pick2) == (order1, pick1)


def test_one_worker_is_the_sequential_search(searches: Any) -> None:
    recorder, _, _ = searches[1]
    assert {t for _, _, t in recorder.events} == {threading.main_thread().name}
    pool = recorder.pools[0]
    assert pool.threads == 0 and pool.submitted == 0


def test_nothing_compiled_ahead_is_left_holding_an_executable(searches: Any) -> None:
    recorder, _, _ = searches[2]
    pool, planner = recorder.pools[0], recorder.planners[0]
    pool.wait()  # the search does not wait for a compile still running when it ends
    assert pool.submitted >= 1 and pool.held == 0
    assert pool.submitted == pool.taken + pool.released + pool.cancelled
    held = {id(c.compiled) for c in planner.pool.values() if c.compiled is not None}
    for compiled in recorder.thread_made:  # released, or the planner's (as sequentially)
        assert compiled.executable is None or id(compiled) in held


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_near_the_deadline_a_device_keeps_a_compile_for_the_proof_and_starts_none_ahead(
        platform: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a device the pick's proof of fit compiles it again (``proof``): the planner's
    time left keeps one compile for it, so the tune ends within its limit; and no compile
    is taken ahead within two compiles of the deadline (it would be done too late to be
    timed, and hold up the end). A stopped clock: no wall-clock time is read."""
    monkeypatch.setattr(clock_module, "time", SimpleNamespace(monotonic=lambda: 1000.0))
    problem = tiny()
    pool = CompilePool(lambda s: Compiled(Measurement("x", OK)), workers=2)
    planner = plan_module.Planner(problem, BUDGET, platform, ShortRuns(problem), compiles=pool)
    try:
        planner.clock.compile_seconds = [3.0, 5.0]
        reserve = 4.0 if platform == "tpu" else 0.0
        planner.clock.deadline = 1100.0
        assert planner.clock.time_left() == 100 - reserve
        planner.clock.deadline = 1007.0 + reserve  # 7 s left: under two compiles
        planner.ahead.prefetch()
        assert pool.submitted == 0
        planner.clock.deadline = 1100.0
        planner.ahead.prefetch()
        assert pool.submitted == 1
    finally:
        planner.close()


def test_no_schedule_is_compiled_twice_and_the_seeds_go_ahead_first(searches: Any) -> None:
    """What a thread compiled ahead is what the planner takes, never compiled again on the
    main thread; the first compiles handed to a thread are the study's enqueued seeds
    (handed over while the plain scan compiles), not the planner's guesses."""
    recorder, order, _ = searches[2]
    started = [k for what, k, _ in recorder.events if what == "compile start"]
    assert len(started) == len(set(started)), started
    whats = [what for what, _, _ in recorder.events]
    handed = [k for what, k, _ in recorder.events if what == "submit"]
    assert handed and handed[0] == order[1]  # the second seed ...
    assert whats.index("submit") < whats.index("compile end")  # ... while the first compiles


def timed(fit: int, seconds: float) -> Measurement:
    """A schedule timed in full at ``seconds``, fitting in ``fit`` bytes."""
    return Measurement("timed", OK, "", total_bytes=fit, step_seconds=seconds)


def test_one_predicted_to_be_cut_is_compiled_ahead_after_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner compiles a candidate predicted to be cut when it comes up (the model
    may be wrong), so a thread with room takes it ahead -- after every candidate predicted
    to be timed in full, whatever their rank: on a TPU v5e two such compiles on the main
    thread held the device 11 s (``studies/results/tune_time.md``)."""
    problem = tiny()
    pool = CompilePool(lambda s: Compiled(Measurement("x", OK)), workers=3)
    planner = plan_module.Planner(problem, BUDGET, "tpu", ShortRuns(problem), compiles=pool)
    try:
        a, b, c = [cand for cand in planner.pool.values() if cand.params][:3]
        planner.standings.record("timed", timed(1, 1.0))  # the best: 1 s, fits
        planner.judge.time_model.points = 2
        cut = CUT_RATIO * 1.05
        monkeypatch.setattr(planner.judge, "rank", lambda candidates, compiled_first=False: [
            (1.0, a), (cut, b), (1.1, c)])
        monkeypatch.setattr(planner.judge, "stop_ratio", lambda cand=None: 1.6)
        monkeypatch.setattr(planner.judge, "surely_over", lambda cand: False)
        monkeypatch.setattr(planner.judge, "dominated", lambda cand, predicted: False)
        assert planner.ahead.upcoming(3) == [a, c, b]
        assert planner.ahead.upcoming(2) == [a, c]
    finally:
        planner.close()


def test_one_likely_over_at_run_time_is_compiled_ahead_after_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the budget by the memory model's guess less the most a size overstated a run
    (where a run decides the fit): compiled ahead after the rest, as one predicted to be cut
    (a TPU v5e's threads compiled four to six such unfused schedules a tune first)."""
    problem = tiny()
    pool = CompilePool(lambda s: Compiled(Measurement("x", OK)), workers=3)
    planner = plan_module.Planner(problem, BUDGET, "tpu", ShortRuns(problem), compiles=pool)
    try:
        a, b, c = [cand for cand in planner.pool.values() if cand.params][:3]
        guesses = {a.schedule.key(): BUDGET + 1.0, b.schedule.key(): BUDGET + 10.0,
                   c.schedule.key(): BUDGET + 3.0}
        monkeypatch.setattr(planner.judge, "rank", lambda candidates, compiled_first=False: [
            (1.0, a), (1.05, b), (1.1, c)])
        monkeypatch.setattr(planner.judge.memory_model, "predict",
                            lambda structure: next(g for k, g in guesses.items()
                                                   if planner.pool[k].structure is structure))
        monkeypatch.setattr(planner.judge, "surely_over", lambda cand: False)
        monkeypatch.setattr(planner.judge, "dominated", lambda cand, predicted: False)
        # no run measured yet: its guess alone, all over
        assert planner.ahead.upcoming(3) == [a, b, c]  # all over: in their order
        assert planner.ahead.upcoming(1) == [a]
        # a run's peak 5 bytes under its size: what a guess overstates
        planner.standings.record("run", Measurement("run", OVER_BUDGET, "", total_bytes=BUDGET + 5,
                                                    runtime_peak_bytes=BUDGET))
        guesses[a.schedule.key()] = 1.0
        assert planner.ahead.upcoming(3) == [a, c, b]  # b: 10 over, less 5; c: 3 over, less 5, fits
    finally:
        planner.close()


def _ranked_first_then(planner: plan_module.Planner, first: Any, second: Any,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner ranks ``first``, then ``second``, both predicted at the best's 1 s (a
    timed schedule that fits) and neither dominated (the timed one stores more)."""
    planner.standings.record("timed", timed(BUDGET - 1, 1.0))
    planner.judge.time_model.points = 2
    monkeypatch.setattr(planner.judge, "rank", lambda candidates, compiled_first=False: [
        (0.9, first), (1.0, second)])
    monkeypatch.setattr(planner.judge, "predict", lambda cand: 1.0)


def test_while_the_candidate_ranked_first_compiles_on_a_thread_the_device_times_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner's first choice, not taken ahead, goes to the thread kept for it
    (``CompilePool.urgent``); until it is done the planner hands the device the next one
    it would time that is already compiled (``meanwhile``), then takes the first choice
    (a TPU v5e's device waited 25 s of an 83-s tune for compiles). A fake slow compiler:
    a gate the test opens."""
    gate = threading.Event()

    def compile_fn(schedule: Schedule) -> Compiled:
        gate.wait(60)
        return Compiled(Measurement(schedule.key(), OK, total_bytes=100), executable=object())

    problem = tiny()
    pool = CompilePool(compile_fn, workers=2)
    planner = plan_module.Planner(problem, BUDGET, "tpu", ShortRuns(problem), compiles=pool)
    try:
        first, ready = [cand for cand in planner.pool.values() if cand.params][:2]
        ready.compiled = Compiled(Measurement(ready.schedule.key(), OK, total_bytes=100),
                                  executable=object())
        _ranked_first_then(planner, first, ready, monkeypatch)
        assert planner.choose(None) is ready  # the device times it ...
        assert first.schedule.key() in pool and first.compiled is None  # ... while this compiles
        assert planner.choose(None) is ready  # not done yet: again
        gate.set()
        pool.wait()
        assert planner.choose(None) == "again"  # done: taken, sized
        assert first.compiled is not None and first.compiled.executable is not None
        assert pool.taken == 1 and pool.submitted == 1
    finally:
        gate.set()
        planner.close()


def test_a_compile_ahead_that_ends_while_the_first_choice_compiles_is_timed_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing compiled yet to time meanwhile: the planner waits for the first compile under
    way to end, not for its own choice's -- one taken ahead that ends first is timed while
    its choice compiles on (a TPU v5e's device waited 5.7 s for a cut schedule while the
    pick, compiled 2 s into that wait, was not looked at again). Fake slow compiles: gates
    the test opens, the other's from a thread while the planner waits."""
    gates = {"first": threading.Event(), "other": threading.Event()}
    problem = tiny()
    first, other = [c for c in plan_module.Planner(
        problem, BUDGET, "tpu", ShortRuns(problem)).pool.values() if c.params][:2]
    which = {first.schedule.key(): "first", other.schedule.key(): "other"}

    def compile_fn(schedule: Schedule) -> Compiled:
        gates[which[schedule.key()]].wait(60)
        return Compiled(Measurement(schedule.key(), OK, total_bytes=100), executable=object())

    pool = CompilePool(compile_fn, workers=3)
    planner = plan_module.Planner(problem, BUDGET, "tpu", ShortRuns(problem), compiles=pool)
    opener = threading.Timer(0.2, gates["other"].set)
    try:
        first, other = (planner.pool[k] for k in which)
        _ranked_first_then(planner, first, other, monkeypatch)
        assert pool.submit(other.schedule.key(), other.schedule)  # ahead, not done
        opener.start()
        assert planner.choose(None) is other  # ended first: timed meanwhile
        assert not gates["first"].is_set() and first.compiled is None  # still compiling
        assert pool.taken == 1
    finally:
        opener.cancel()
        for gate in gates.values():
            gate.set()
        planner.close()
