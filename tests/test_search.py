"""The search (issue 12): screening by compiled memory, cut trials, the time limit,
and a problem the tuner has never seen."""

from __future__ import annotations

import contextlib
import statistics
import time
import zlib
from pathlib import Path
from typing import Any

import optuna
import pytest

import autoremat
import autoremat._search.planning.planner as planner_module
import autoremat._search.short_runs as short_runs_module
from autoremat._errors import TuneError
from autoremat._measure.measure import compile_schedule
from autoremat._measure.problem import Problem
from autoremat._schedules.base import Schedule
from autoremat._search import space
from autoremat._search.pareto import pareto_front
from autoremat._search.study import MeasuredTrial, load_study, measured_trials
from autoremat._search.tune import tune
from autoremat._units import parse_duration
from autoremat.cli import main
from tests import user_problems
from tests.tiny_problem import tiny

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 2400  # the tiny plain scan needs ~2.6 KB: over
#: under the tiny plain scan on every JAX line (2.1 KB on jax 0.12, 2.6 KB on 0.10)
UNDER_PLAIN = 2000


@pytest.fixture()
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_screening_never_times_an_over_budget_or_dominated_schedule(
        in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[str] = []
    timed: list[tuple[str, int | None]] = []
    calls = {"compile": 0, "time": 0}

    def spy_compile(real: Any) -> Any:
        def spy(problem: Problem, schedule: Schedule, **kw: Any) -> Any:
            calls["compile"] += 1
            compiled.append(schedule.key())
            return real(problem, schedule, **kw)
        return spy

    def spy_time(real: Any) -> Any:
        def spy(c: Any, **kw: Any) -> Any:
            calls["time"] += 1
            if c.executable is not None:
                timed.append((c.measurement.schedule_key, c.measurement.total_bytes))
            return real(c, **kw)
        return spy

    # patched where the search looks them up (both import them at module level)
    monkeypatch.setattr(planner_module, "compile_schedule", spy_compile(planner_module.compile_schedule))
    monkeypatch.setattr(short_runs_module, "time_compiled",
                        spy_time(short_runs_module.time_compiled))
    # no n_trials: the planner decides what to time (n_trials asks for exactly that
    # many, and past the planner's stop it then times dominated schedules too)
    # under the tiny plain scan on every JAX line (2.1 KB on jax 0.12, 2.6 KB on 0.10)
    result = tune(tiny(), UNDER_PLAIN, time_budget=0.02, study_name="s", time_limit=None)
    assert result.best is not None
    # the spies saw the search (a spy patched where nobody looks would see nothing)
    assert calls["compile"] >= 1 and calls["time"] >= 1 and timed, calls
    # many sized, few timed; each schedule compiled once, timed at most once
    assert len(compiled) == len(set(compiled)) > len(timed)
    assert len({k for k, _ in timed}) == len(timed)
    assert all(b is not None and b <= UNDER_PLAIN for _, b in timed)  # never over the budget
    assert autoremat.plain(32).key() not in {k for k, _ in timed}
    trials = sorted(measured_trials(load_study("s")), key=lambda t: t.number)
    seeds = {s.key() for s, _ in space.seeds(32)}
    for i, t in enumerate(trials):
        m = t.measurement
        if m.total_bytes is not None and m.total_bytes > UNDER_PLAIN:
            assert m.step_seconds is None and m.cut_seconds is None
        predicted = load_study("s").trials[t.number].user_attrs.get("predicted_seconds")
        if t.schedule.key() in seeds or predicted is None or m.total_bytes is None:
            continue
        for earlier in trials[:i]:  # nothing timed before it beat it on memory and prediction
            e = earlier.measurement
            if e.step_seconds is not None and e.total_bytes is not None:
                assert not (e.total_bytes <= m.total_bytes and e.step_seconds <= predicted), (
                    t.schedule.describe(), earlier.schedule.describe())


def slow_binomial(seq_len: int = 32) -> Problem:
    """The tiny problem, its binomial schedules 20 ms slower per step (a host callback)."""
    import jax

    base = tiny(seq_len)

    def build(schedule: Schedule) -> tuple[Any, tuple[Any, ...]]:
        step, args = base.build(schedule)
        if schedule.kind != "binomial":
            return step, args

        def slow(w: Any, x: Any) -> Any:
            w = jax.pure_callback(lambda v: (time.sleep(0.02), v)[1],
                                  jax.ShapeDtypeStruct(w.shape, w.dtype), w)
            return step(w, x)

        return slow, args

    return Problem(name="slow_binomial", seq_len=seq_len, build=build)


def test_a_clearly_slower_schedule_is_cut_and_recorded(in_tmp: Path) -> None:
    result = tune(slow_binomial(), BUDGET, n_trials=5, time_budget=0.02, study_name="cut")
    study = load_study("cut")
    binomial = next(t for t in study.trials if t.user_attrs.get("schedule", {}).get("kind")
                    == "binomial")
    assert binomial.state == optuna.trial.TrialState.COMPLETE
    m = MeasuredTrial.of(binomial)
    assert m is not None and m.measurement.cut and m.measurement.step_seconds is None
    assert m.measurement.cut_seconds is not None and m.measurement.cut_seconds >= 0.02
    assert binomial.values[1] == m.measurement.cut_seconds  # its partial figure
    assert not m.measurement.fits(BUDGET) and m.measurement.total_bytes <= BUDGET
    assert result.best_trial is not None and result.best_trial.number != binomial.number
    assert binomial.number not in {p.number for p in pareto_front(study)}  # front stays true


def test_the_time_limit_is_respected(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No compile or trial starts after the limit; the one under way finishes.

    The clock is the test's: every ``build`` of the problem moves ``time.monotonic``
    on by a quarter of the limit, so how many trials fit does not depend on the
    machine's speed (the real seconds that pass are negligible against an hour)."""
    limit, tick = 3600.0, 900.0
    offset = [0.0]
    real_monotonic = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real_monotonic() + offset[0])
    base, starts = tiny(), []

    def build(schedule: Schedule) -> tuple[Any, tuple[Any, ...]]:
        starts.append(offset[0])
        offset[0] += tick  # this build (and so its trial) takes a quarter of the limit
        return base.build(schedule)

    problem = Problem(name=base.name, seq_len=base.seq_len, build=build)
    result = tune(problem, 10**6, time_limit="1h", explore_front=True, time_budget=0.02)
    assert result.best is not None and result.measured >= 1
    assert all(s < limit for s in starts), starts  # nothing started past the limit
    assert offset[0] >= limit  # ... and the limit is what stopped it (the space is far from done)
    assert parse_duration("5m") == 300 and parse_duration("1.5h") == 5400
    assert parse_duration("90s") == parse_duration("90") == parse_duration(90) == 90
    for bad in ("0", "-1m", "5 minutes", "nan", "", True):
        with pytest.raises(TuneError, match=r"^time_limit: expected a duration"):
            tune(tiny(), BUDGET, time_limit=bad)  # type: ignore[arg-type]


def test_a_budget_under_the_floor_stops_after_the_seeds(in_tmp: Path) -> None:
    from autoremat._cli.breakdown_text import nothing_fits_message

    result = tune(tiny(), 600, time_limit="60s", time_budget=0.02)  # over its 576 B arguments
    assert result.best is None and 1 <= result.measured <= len(space.seeds(tiny().seq_len))
    message = nothing_fits_message(result)
    assert "that no schedule can remove" in message
    # In library terms; the CLI words the same settings as its flags (test_fuse.py).
    assert "seed_lstm(seq_len=...)" in message and "seed_lstm(batch=...)" in message
    assert " --" not in message


def steady_clock(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every schedule the search times is run as usual (warm-up, timed runs, its loss
    checked), and its step time is then replaced by a made-up figure, the same on any
    machine: its step evaluations (``bounds.cost``) x 10 us, plus a few us from its key
    (no ties). The cut is decided on that figure. So the search's decisions do not
    depend on how busy the machine is: with real times a busy CPU's noise widens the
    stop ratio, and the planner compiled ~100 candidates (a minute) to time six.
    Returns the keys timed, in order."""
    real = short_runs_module.ShortRuns.time
    timed: list[str] = []

    def time_it(runs: Any, schedule: Schedule, sized: Any, *, budget_bytes: int | None,
                time_budget: float, best: float | None) -> Any:
        from dataclasses import replace

        from autoremat._measure.timing import CUT_RATIO

        m = real(runs, schedule, sized, budget_bytes=budget_bytes, time_budget=time_budget,
                 best=None)
        if m.step_seconds is None:
            return m  # not run (over the budget, failed): as measured
        timed.append(schedule.key())
        seconds = (schedule.cost(runs.problem.seq_len).evaluations * 1e-5
                   + (zlib.crc32(schedule.key().encode()) % 97) * 1e-7)
        if best is not None and seconds > CUT_RATIO * best:
            return replace(m, step_seconds=None, step_samples=(), cut_seconds=seconds)
        return replace(m, step_seconds=seconds, step_samples=(seconds,))

    monkeypatch.setattr(short_runs_module.ShortRuns, "time", time_it)
    return timed


def test_an_unseen_problem_gets_the_fastest_measured_schedule_that_fits(
        in_tmp: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A problem the tuner has never seen (a user's GRU, by file path): every seed is
    measured, the pick fits, was timed, and is the fastest of the fitting trials --
    so by the tuner's own figures it is as fast as the best seed. The steps run, their
    times are made up (``steady_clock``): a busy machine decides nothing here. (Whether
    real figures hold when re-timed is a benchmark:
    ``test_the_pick_is_as_fast_as_the_best_seed_when_retimed``, ``-m slow``.)"""
    timed = steady_clock(monkeypatch)
    problem = user_problems.gru_long()
    plain = compile_schedule(problem, autoremat.plain(problem.seq_len)).measurement
    assert plain.total_bytes is not None
    budget = plain.total_bytes // 2
    assert main(["tune", "--problem", f"{ROOT / 'tests' / 'user_problems.py'}:gru_long", "--budget",
                 str(budget), "--trials", "6", "--time-budget", "0.02", "--study-name", "gru",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    trials = measured_trials(load_study("gru"))
    # T=160 is past a short scan's enumerated space: the pool (random draws) does not run dry
    assert len(trials) == 6 and "6 measured now" in out
    seeds = {s.key() for s, _ in space.seeds(problem.seq_len)}
    assert seeds <= {t.schedule.key() for t in trials}  # the seeds are always measured
    assert timed and set(timed) <= {t.schedule.key() for t in trials}  # the steps ran
    fits = [t for t in trials if t.measurement.fits(budget)]
    assert fits and all(t.measurement.step_seconds is not None for t in fits)
    pick = min(fits, key=lambda t: t.measurement.step_seconds or 0.0)
    assert f"best (trial {pick.number})" in out
    assert pick.measurement.total_bytes is not None and pick.measurement.total_bytes <= budget
    fitting_seeds = [t for t in fits if t.schedule.key() in seeds]
    assert fitting_seeds, "no seed fits half of plain's total"
    assert all(pick.measurement.step_seconds <= t.measurement.step_seconds  # type: ignore[operator]
               for t in fitting_seeds)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gru", "lstm2"])
def test_the_pick_is_as_fast_as_the_best_seed_when_retimed(name: str, tmp_path: Path) -> None:
    """A benchmark (``-m slow``): the tuner's figures are its own, so its pick is re-timed
    here against every seed that fits, interleaved, in this process, at a size where a
    step takes >= 0.2 s (milliseconds of wall time are noise on a shared machine)."""
    size = {"seq_len": 4096, "batch": 16, "hidden": 64}
    problem = getattr(user_problems, name)(**size)
    plain = compile_schedule(problem, autoremat.plain(problem.seq_len)).measurement
    assert plain.total_bytes is not None
    budget = plain.total_bytes // 2
    with contextlib.chdir(tmp_path):
        result = tune(problem, budget, n_trials=8, time_budget=1.0, study_name=name)
    assert result.best_trial is not None
    pick = result.best_trial.schedule
    seeds = [s for s, _ in space.seeds(problem.seq_len) if s.key() != pick.key()]
    runs = {}
    for schedule in (pick, *seeds):
        c = compile_schedule(problem, schedule, budget_bytes=budget)
        if c.executable is not None:
            runs[schedule.key()] = c
    assert len(runs) >= 2, "no seed fits"
    seconds = _interleaved(list(runs.values()), rounds=7)
    assert seconds[0] <= 1.25 * min(seconds[1:]), dict(zip(runs, seconds, strict=True))


def _interleaved(compiled: list[Any], rounds: int) -> list[float]:
    """Median seconds of each compiled step, run in turn ``rounds`` times (after one
    warm-up each), so machine noise falls on all of them alike."""
    import jax

    times: list[list[float]] = [[] for _ in compiled]
    for c in compiled:
        jax.block_until_ready(c.executable(*c.args))
    for _ in range(rounds):
        for c, out in zip(compiled, times, strict=True):
            t0 = time.perf_counter()
            jax.block_until_ready(c.executable(*c.args))
            out.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def test_the_cost_model_learns_a_study_and_the_memory_terms_are_monotone() -> None:
    from autoremat._search.planning.memory_model import MemoryModel
    from autoremat._search.planning.predict import Structure, TimeModel

    seq_len = 10_000
    schedules = [autoremat.plain(seq_len), autoremat.nested([seq_len], "nothing_saveable"),
                 autoremat.nested([100, 100], ["nothing_saveable", "everything_saveable"]),
                 autoremat.nested([25, 20, 20], "nothing_saveable"), autoremat.binomial(38),
                 autoremat.binomial(200), autoremat.nested([50, 200], "dots_saveable")]
    structures = [Structure.of(s, seq_len) for s in schedules]

    def truth(s: Structure, total: float) -> float:  # a made-up machine
        return (1e-4 * s.evaluations + 4e-5 * s.partial + 2e-9 * total + 5e-5 * s.bookkeeping
                + 0.01)

    sizes = [7e8, 1.8e8, 7.6e7, 7.4e7, 7.5e7, 9e7, 3e8]
    model = TimeModel()
    assert model.predict(structures[0], sizes[0]) is None  # nothing timed yet
    model.fit([(s, b, truth(s, b)) for s, b in zip(structures, sizes, strict=True)])
    for s, b in zip(structures, sizes, strict=True):
        assert model.predict(s, b) == pytest.approx(truth(s, b), rel=0.1)
    # two points: the prior (seconds per evaluation) already orders them
    few = TimeModel()
    few.fit([(structures[0], sizes[0], 1.0), (structures[3], sizes[3], 3.0)])
    assert few.predict(structures[1], sizes[1]) < few.predict(structures[3], sizes[3])
    # a dots level's re-run counts as partial, so it is predicted cheaper than a full one
    dots, full = (Structure.of(autoremat.nested([50, 200], ["nothing_saveable", p]), seq_len)
                  for p in ("dots_saveable", "nothing_saveable"))
    assert dots.partial == seq_len and full.partial == 0
    assert dots.evaluations + dots.partial == full.evaluations
    assert model.predict(dots, 3e8) < model.predict(full, 3e8)
    assert few.error == 0.0 and model.error < 0.1  # leave-one-out, on a noiseless machine

    memory = MemoryModel()
    memory.add(structures[2], 76_000_000, over_budget=True)  # 100x100 over the budget
    wider = Structure.of(autoremat.nested([100, 100], ["dots_saveable", "everything_saveable"],
                                          unroll=2), seq_len)  # stores more of every term
    narrower = Structure.of(autoremat.nested([200, 50], ["nothing_saveable",
                                                         "everything_saveable"]), seq_len)
    assert memory.surely_over(wider) and not memory.surely_over(narrower)
    assert not memory.surely_over(structures[4])  # another kind
    memory.add(structures[0], 700_000_000, over_budget=True)
    memory.add(structures[4], 75_000_000, over_budget=False)
    guess = memory.predict(Structure.of(autoremat.plain(seq_len), seq_len))
    assert guess is not None and guess > 5 * memory.predict(narrower)


def test_no_memory_guess_is_under_what_the_step_takes_anyway() -> None:
    """Where the seeds sit at the floor (a TPU keeps the seed's residuals on chip), a fit
    through them guessed some candidates under it; a guess is now never under ``least``."""
    from autoremat._search.planning.memory_model import MemoryModel
    from autoremat._search.planning.predict import Structure

    seq_len = 10_000
    s = lambda sched: Structure.of(sched, seq_len)  # noqa: E731
    memory = MemoryModel()
    memory.add(s(autoremat.plain(seq_len)), 1_040_000_000, over_budget=False)
    memory.add(s(autoremat.nested([seq_len], "nothing_saveable")), 16_600_000, False)
    memory.add(s(autoremat.nested([100, 100], ["nothing_saveable", "everything_saveable"])),
               16_600_000, False)
    short = s(autoremat.nested([25, 20, 20], "nothing_saveable"))
    guess = memory.predict(short)
    assert guess is not None and guess < 16_600_000  # the fit alone: under the floor
    memory.least = 16_600_000.0
    assert memory.predict(short) == 16_600_000.0
    assert memory.predict(s(autoremat.plain(seq_len))) == pytest.approx(1.04e9, rel=0.05)


def test_memory_model_skips_what_stores_more_than_a_refused_compile() -> None:
    """More saved policies at the same lengths, a larger unroll, plain at any unroll:
    each stores at least what a schedule over the budget stored."""
    from autoremat._search.planning.memory_model import MemoryModel
    from autoremat._search.planning.predict import Structure

    seq_len = 10_000
    s = lambda sched: Structure.of(sched, seq_len)  # noqa: E731
    memory = MemoryModel()
    memory.add(s(autoremat.plain(seq_len)), 64 * 2**30, over_budget=True, refused=True)
    for u in (1, 2, 8):
        assert memory.surely_over(s(autoremat.nested([seq_len], "none", unroll=u)))
    ne = autoremat.nested([100, 100], ["nothing_saveable", "everything_saveable"], unroll=2)
    memory.add(s(ne), 7 * 2**30, over_budget=True)
    ee = autoremat.nested([100, 100], ["everything_saveable", "everything_saveable"], unroll=2)
    de = autoremat.nested([100, 100], ["dots_saveable", "everything_saveable"], unroll=4)
    assert memory.surely_over(s(ee)) and memory.surely_over(s(de))
    smaller_unroll = autoremat.nested([100, 100], ["nothing_saveable", "everything_saveable"])
    nn = autoremat.nested([100, 100], ["nothing_saveable", "nothing_saveable"], unroll=2)
    assert not memory.surely_over(s(smaller_unroll)) and not memory.surely_over(s(nn))
    # unfused (the readout's stack kept) stores at least what fused stores; not the reverse
    assert memory.surely_over(s(ne.with_fuse(False)))
    unfused = MemoryModel()
    unfused.add(s(ne.with_fuse(False)), 7 * 2**30, over_budget=True)
    assert not unfused.surely_over(s(ne.with_fuse(True)))
    # predicted at least as large as a program the compiler refused: not compiled
    sized = MemoryModel()
    ne = lambda n: s(autoremat.nested([seq_len // n, n],  # noqa: E731
                                      ["nothing_saveable", "everything_saveable"]))
    for n in (100, 200, 500):  # bytes: 1 MB per step of stored residuals
        sized.add(ne(n), 10**6 * int(ne(n).terms[1]), over_budget=False)
    sized.add(ne(1000), 10**6 * int(ne(1000).terms[1]), over_budget=True, refused=True)
    assert ne(2000).terms[0] < ne(1000).terms[0]  # stores less of a term: not dominated
    assert sized.surely_over(ne(2000)) and not sized.surely_over(ne(50))


def test_memory_model_rules_out_what_it_predicts_far_over_once_it_fits_its_points() -> None:
    """``far_over``: predicted at 1.5x the budget or more by a fit on at least five sized
    schedules that misses none of them by half -- not compiled; fewer points, or a fit
    that misses one, rules nothing out (``far_under``, its mirror, rules nothing in)."""
    from autoremat._search.planning.memory_model import FAR_OVER, FAR_POINTS, MemoryModel
    from autoremat._search.planning.predict import Structure

    seq_len = 10_000
    ne = lambda n: Structure.of(autoremat.nested(  # noqa: E731
        [seq_len // n, n], ["nothing_saveable", "everything_saveable"]), seq_len)
    size = lambda n: 10**6 * ne(n).terms[1]  # noqa: E731  # 1 MB per step of residuals kept
    memory = MemoryModel()
    for n in (10, 20, 40, 50)[:FAR_POINTS - 1]:
        memory.add(ne(n), int(size(n)), over_budget=False)
    budget = int(size(50))
    assert size(500) > 2 * FAR_OVER * budget and not memory.far_over(ne(500), budget)  # 4 points
    assert not memory.far_under(ne(10), budget)  # 4 points: no more sure below than above
    memory.add(ne(100), int(size(100)), over_budget=False)
    assert memory.far_over(ne(500), budget) and not memory.far_over(ne(60), budget)
    assert size(10) * FAR_OVER < budget and memory.far_under(ne(10), budget)  # far_under too
    assert not memory.far_under(ne(40), budget)  # within the budget, not far under it
    memory.add(ne(25), int(10 * size(25)), over_budget=False)  # a point the fit misses
    assert not memory.far_over(ne(500), budget) and not memory.far_under(ne(10), budget)
    bent = MemoryModel()  # fits its points, but more stored costs fewer bytes: no machine
    for n in (10, 20, 40, 50, 100):
        bent.add(ne(n), int(10**9 - size(n)), over_budget=False)
    guess = bent.predict(ne(2))
    assert guess is not None and guess > 2 * FAR_OVER * budget
    assert not bent.far_over(ne(2), budget)


@pytest.fixture(scope="module")
def lstm_total() -> Any:
    """The compiled total of a schedule of the unfused seed LSTM (T=100, batch 8, hidden
    64), each schedule compiled once for the memory model's tests."""
    from autoremat._models.seed_lstm import seed_lstm

    problem = seed_lstm(seq_len=100, batch=8, hidden=64, fused_readout=None)
    sizes: dict[str, int] = {}

    def size(schedule: Schedule) -> int:
        if schedule.key() not in sizes:
            total = compile_schedule(problem, schedule).measurement.total_bytes
            assert total is not None
            sizes[schedule.key()] = total
        return sizes[schedule.key()]

    return size


def test_memory_model_predicts_the_compiled_bytes_of_schedules_the_seeds_do_not_resemble(
        lstm_total: Any) -> None:
    """Fit on the TPU's seeds (unfused among them), the memory model predicts within 25%
    (at least 60% where two ``everything`` levels lead) the compiled totals of schedules
    like those that ran out of memory on a TPU v5e (issue 47): an outer ``everything``
    level stores every step below it whole (as plain does, whatever the inner levels
    save), an outer ``dots`` level the dots of every step below it; an unfused schedule
    adds the readout's stack."""
    from autoremat._search.planning.memory_model import MemoryModel
    from autoremat._search.planning.predict import Structure

    seq_len, size = 100, lstm_total
    n, e, d = "nothing_saveable", "everything_saveable", "dots_saveable"
    fused = lambda *a: autoremat.nested(*a).with_fuse(True)  # noqa: E731
    seeds = [autoremat.plain(seq_len).with_fuse(True), fused([seq_len], n),
             fused([10, 10], [n, e]), fused([2, 10, 5], [n, d, e]),
             autoremat.nested([10, 10], [n, e]).with_fuse(False)]
    unlike = [fused([10, 10], [e, n]), fused([2, 10, 5], [e, e, n]), fused([50, 2], [d, e]),
              fused([2, 25, 2], [n, e, n])]

    memory = MemoryModel()
    for s in seeds:
        memory.add(Structure.of(s, seq_len), size(s), over_budget=False)
    plain = size(seeds[0])
    dots = memory.step_dots_bytes()  # a step's dots: part of what plain keeps of a step
    assert dots is not None and 0 < dots < plain / seq_len
    for s in unlike:
        guess, total = memory.predict(Structure.of(s, seq_len)), size(s)
        assert guess is not None
        if s.levels[0].policy.name == e:  # whole, as plain is (two such levels: more)
            assert total > 0.9 * plain and Structure.of(s, seq_len).terms[1] > seq_len
            assert 0.6 * total < guess < 1.25 * total, s.describe()
        else:
            assert guess == pytest.approx(total, rel=0.25), s.describe()


def test_until_dots_are_sized_the_memory_model_guesses_them_at_a_whole_steps_bytes(
        lstm_total: Any) -> None:
    """Seeds that keep no steps' dots (a TPU's) say nothing of a step's dots: the memory
    model guesses them at a whole step's bytes (they are part of it), so an outer ``dots``
    level that keeps every step's dots is guessed at least at its compiled total, not at a
    ``nothing`` level's (on a TPU v5e two such were compiled, out of memory)."""
    from autoremat._search.planning.memory_model import MemoryModel
    from autoremat._search.planning.predict import Structure

    seq_len, size = 100, lstm_total
    n, e, d = "nothing_saveable", "everything_saveable", "dots_saveable"
    fused = lambda *a, **k: autoremat.nested(*a, **k).with_fuse(True)  # noqa: E731
    memory = MemoryModel()
    for s in (autoremat.plain(seq_len).with_fuse(True), fused([seq_len], n),
              fused([25, 4], [n, e], unroll=4), fused([10, 10], [n, e]),
              autoremat.nested([10, 10], [n, e]).with_fuse(False)):
        memory.add(Structure.of(s, seq_len), size(s), over_budget=False)
    outer_dots, inner_dots = fused([25, 4], [d, e], unroll=4), fused([10, 10], [n, d])
    guess = memory.predict(Structure.of(outer_dots, seq_len))
    assert guess is not None and size(outer_dots) <= guess < 1.5 * size(outer_dots)
    assert memory.predict(Structure.of(inner_dots, seq_len)) == pytest.approx(
        size(inner_dots), rel=0.25)  # a chunk's dots: a small term either way
    memory.add(Structure.of(outer_dots, seq_len), size(outer_dots), over_budget=False)
    dots = memory.step_dots_bytes()  # sized now: its own bytes
    assert dots is not None and memory.predict(Structure.of(outer_dots, seq_len)) == (
        pytest.approx(size(outer_dots), rel=0.05))


def _plain_out_of_memory(problem: Problem, compiles: list[str]) -> Problem:
    """A stand-in for a device that cannot hold the plain scan (the CPU never runs out
    of memory at compile): a plain scan's step, at any unroll, raises XLA:TPU's
    compile-time message while it is traced; every compile is logged."""
    def build(schedule: Schedule) -> tuple[Any, tuple[Any, ...]]:
        step, args = problem.build(schedule)
        compiles.append(schedule.describe())
        if schedule.describe().startswith(f"{problem.seq_len} no-remat"):
            def refused(*a: Any) -> Any:
                raise RuntimeError("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. The "
                                   "total memory required for HLO temporaries (64.06G) "
                                   "exceeds available HBM (15.75G)")
            return refused, args
        return step, args

    return Problem(problem.name, problem.seq_len, build, problem.arg_names)


def test_tune_compiles_one_plain_scan_the_device_refused(in_tmp: Path) -> None:
    compiles: list[str] = []
    result = tune(_plain_out_of_memory(tiny(), compiles), BUDGET, time_budget=0.02,
                  time_limit=None, study_name="refused")
    plain = [c for c in compiles if c.startswith("32 no-remat")]
    assert len(plain) == 1, plain  # at unroll 2, 4, 8 it is surely over
    trials = measured_trials(load_study("refused"))
    refused = [t for t in trials if t.measurement.compiler_bytes is not None]
    assert len(refused) == 1 and refused[0].measurement.status == "over_budget"
    assert refused[0].measurement.compiler_bytes == int(64.06 * 2**30)
    assert result.best_trial is not None and result.best_trial.measurement.fits(BUDGET)


def test_the_search_stops_after_patience_fitting_compiles_without_a_better_best(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``PATIENCE``: the planner's own compiles that fit, counted since the best last
    improved by ``IMPROVES``; one over the budget (the memory model is off) does not
    count, and a better best starts the count again. Once spent, nothing more is compiled
    (the last compiled may still be timed)."""
    from autoremat._measure.measure import Compiled
    from autoremat._measure.measurement import OK, OVER_BUDGET, Measurement
    from autoremat._search.planning.candidates import Verdict
    from autoremat._search.planning.standings import PATIENCE
    from autoremat._search.short_runs import ShortRuns

    problem = tiny(64)
    planner = planner_module.Planner(problem, 10**9, "cpu", ShortRuns(problem))
    seeds = [s for s, _ in space.seeds(64)][:3]
    for i, schedule in enumerate(seeds[:2]):  # two timed: the time model is calibrated
        planner.record(schedule, Measurement(schedule.key(), OK, "", total_bytes=10**6,
                                             step_seconds=0.010 + i * 0.001))
    assert planner.standings.since_best == 0 and planner.standings.best is not None
    statuses = iter([OVER_BUDGET] * 3 + [OK] * 100)

    screens: list[str] = []

    def screen(cand: Any) -> None:  # sized, as a compile would: over the budget, then fits
        status = next(statuses)
        screens.append(status)
        cand.compiled = Compiled(Measurement(cand.schedule.key(), status, "",
                                             total_bytes=10**6 if status == OK else 10**10))

    monkeypatch.setattr(planner, "screen", screen)
    monkeypatch.setattr(planner.judge, "dominated", lambda cand, predicted: False)
    for _ in range(3):
        assert planner.choose(None) == "again"
    assert planner.standings.since_best == 0  # three over the budget: not counted
    for n in range(1, PATIENCE + 1):
        assert planner.choose(None) in ("again", None)
        cand = next(c for c in planner.pool.values() if c.compiled is not None
                    and c.verdict.name == "UNDECIDED" and c.sized.status == OK)
        planner.pool.mark(cand, Verdict.DOMINATED)  # sized, not timed
        assert planner.standings.since_best == n
    compiled = len(screens)
    assert planner.next(None) is None and len(screens) == compiled  # spent: done, no compile
    planner.record(seeds[2], Measurement(seeds[2].key(), OK, "", total_bytes=10**6,
                                         step_seconds=0.005))  # a better best
    assert planner.standings.since_best == 0 and planner.choose(None) is not None


def test_a_schedule_sized_over_by_more_than_any_size_overstated_a_run_is_not_timed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a run decides the fit (a TPU), a schedule sized over the budget is still timed
    -- a size may overstate the run's peak -- unless it is over by more than the most a
    timed schedule's size overstated its measured runtime peak (``overstated``; a TPU
    v5e's unfused big model: 5.34 GB, sizes 17.5 and 21.5 GB, peaks 12.2 and 16.1 GB)."""
    from dataclasses import replace

    from autoremat._measure.measure import Compiled
    from autoremat._measure.measurement import OK, OVER_BUDGET, Measurement
    from autoremat._search.planning.candidates import Verdict
    from autoremat._search.planning.untimed import over_at_runtime
    from autoremat._search.short_runs import ShortRuns

    gb = 10**9
    problem = tiny(64)
    planner = planner_module.Planner(problem, 12 * gb, "tpu", ShortRuns(problem))
    first, second, third = [s for s, _ in space.seeds(64)][:3]
    planner.record(first, Measurement(first.key(), OK, "", total_bytes=3 * gb,
                                      runtime_peak_bytes=3 * gb, step_seconds=0.4))
    assert planner.standings.overstated == 0
    planner.record(second, Measurement(second.key(), OVER_BUDGET, "", total_bytes=17_540_000_000,
                                       runtime_peak_bytes=12_200_000_000))
    assert planner.standings.overstated == 5_340_000_000
    sized = {}
    for schedule, total in ((third, 21_470_000_000), (first, 17_000_000_000)):
        cand = planner.pool.candidate(schedule)
        cand.compiled = Compiled(Measurement(schedule.key(), OK, "", total_bytes=total),
                                 executable=object())
        sized[total] = cand
    assert planner.judge.over_at_runtime(sized[21_470_000_000])  # 16.13 GB at best: over
    assert not planner.judge.over_at_runtime(sized[17_000_000_000])  # 11.66 GB: a run decides
    reach = planner.standings.reach("tpu")  # the rule alone, on the figures it names
    assert over_at_runtime(21_470_000_000, reach) and not over_at_runtime(17_000_000_000, reach)
    cpu = replace(reach, platform="cpu")
    assert not over_at_runtime(21_470_000_000, cpu)  # its size decided (over) already
    over = sized[21_470_000_000]
    monkeypatch.setattr(planner.judge, "rank", lambda candidates, compiled_first=False: [(0.3, over)])
    assert planner.choose(None) is None  # not timed ...
    assert over.verdict is Verdict.OVER_AT_RUNTIME
    assert planner.judge.memory_model.surely_over(over.structure)  # ... nor what stores more
