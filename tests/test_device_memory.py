"""Measured device memory (issue 30): the step's own runtime peak and the compile scratch.

No GPU runs these tests. ``StandInDevice`` below is a STAND-IN for a GPU's
``memory_stats()``: a few integers that simulate an allocator's ``bytes_in_use`` and
``peak_bytes_in_use`` (a peak that never goes down, as XLA's BFC allocator reports
it). It is put where ``autoremat._measure.device_memory.meters()`` would return the
real devices, so the isolation arithmetic, the fit rule and what is printed run here
on a CPU. Real GPU figures only come from ``studies/gpu_check.py`` on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import optuna
import pytest

from autoremat._cli.printing import result_table
from autoremat._measure import device_memory
from autoremat._measure.breakdown import breakdown_lines
from autoremat._measure.device_memory import CHUNK, Stats, chunks, measured
from autoremat._measure.measure import measure_step
from autoremat._measure.measurement import Measurement
from autoremat._measure.problem import Problem
from autoremat._schedules.base import Schedule
from autoremat._search.pareto import describe_schedule, front_table, pareto_front, plot_groups
from autoremat._search.study import choose, load_study, summarize
from autoremat._search.tune import tune
from tests.tiny_problem import tiny

optuna.logging.set_verbosity(optuna.logging.WARNING)

MB = 10**6


class StandInDevice:
    """A STAND-IN for a GPU's allocator -- not a device, no memory behind it.

    It implements ``device_memory.Meter``: ``stats()`` reads the simulated
    ``bytes_in_use``/``peak_bytes_in_use``; ``fill`` allocates the chunks the real
    meter would. ``transient(n)``: something allocates ``n`` bytes and frees them
    (a compile's scratch, a run's buffers). Over ``limit`` it raises XLA's
    out-of-memory error text.
    """

    def __init__(self, in_use: int, peak: int, limit: int | None = None) -> None:
        self.in_use, self.peak, self.limit = in_use, peak, limit

    def stats(self) -> Stats:
        return Stats(self.in_use, self.peak)

    def allocate(self, n: int) -> None:
        if self.limit is not None and self.in_use + n > self.limit:
            raise RuntimeError(f"RESOURCE_EXHAUSTED: Out of memory allocating {n} bytes "
                               "(stand-in device)")
        self.in_use += n
        self.peak = max(self.peak, self.in_use)

    def transient(self, n: int) -> None:
        self.allocate(n)
        self.in_use -= n

    def fill(self, nbytes: int) -> Callable[[], None]:
        held = 0
        try:
            for size in chunks(nbytes):
                self.allocate(size)
                held += size
        except RuntimeError:
            self.in_use -= held
            raise

        def free() -> None:
            self.in_use -= held

        return free


# The H200 story (reference/gpu.md): building the problem lifted the peak to 137 MB with
# 20 MB in use; an earlier trial of the same process peaked at 750 MB.
def earlier_trials() -> StandInDevice:
    return StandInDevice(in_use=20 * MB + 12_345, peak=750 * MB + 777)


# --------------------------------------------------------------------- the arithmetic


def test_a_work_under_the_old_mark_is_measured_alone() -> None:
    dev = earlier_trials()
    result, rise = measured(lambda: dev.transient(118 * MB) or "done", [dev])
    assert result == "done"
    assert rise == 118 * MB  # exact: the gap was filled, so the work raised the mark
    assert dev.in_use == 20 * MB + 12_345  # the filler is freed
    assert dev.peak > 750 * MB  # the process's mark, which says nothing about the work


def test_a_work_over_the_old_mark_and_one_under_the_residual_gap() -> None:
    dev = earlier_trials()
    assert measured(lambda: dev.transient(900 * MB), [dev])[1] == 900 * MB
    dev = StandInDevice(in_use=100, peak=100 + CHUNK - 1)  # a gap under one chunk: no filler
    assert measured(lambda: dev.transient(10), [dev])[1] == CHUNK - 1  # the bound, not 10
    dev = StandInDevice(in_use=100, peak=100)
    assert measured(lambda: dev.transient(0), [dev])[1] == 0


def test_the_largest_rise_over_devices_and_none_when_one_is_unknown() -> None:
    a, b = earlier_trials(), earlier_trials()
    assert measured(lambda: (a.transient(5 * MB), b.transient(7 * MB)), [a, b])[1] == 7 * MB

    class Unreadable(StandInDevice):
        def stats(self) -> Any:
            return None

    c = Unreadable(0, 1)
    assert measured(lambda: a.transient(5 * MB), [a, c])[1] is None


def test_out_of_memory_with_the_filler_held_runs_again_without_it() -> None:
    # 1 GB device: the filler (730 MB) + 400 MB does not fit; 400 MB alone does.
    dev = StandInDevice(in_use=20 * MB, peak=750 * MB, limit=1000 * MB)
    calls: list[int] = []

    def work() -> None:
        calls.append(dev.in_use)
        dev.transient(400 * MB)

    _, rise = measured(work, [dev])
    assert len(calls) == 2 and calls[1] == 20 * MB  # the second run has no filler
    assert rise is None  # under the old mark without a filler: unknown, never 750 MB
    assert dev.in_use == 20 * MB
    dev = StandInDevice(in_use=20 * MB, peak=750 * MB, limit=1000 * MB)
    assert measured(lambda: dev.transient(800 * MB), [dev])[1] == 800 * MB  # rose anyway


def test_a_filler_that_does_not_fit_and_other_errors() -> None:
    dev = StandInDevice(in_use=20 * MB, peak=750 * MB, limit=500 * MB)  # gap 730 MB > room
    assert measured(lambda: dev.transient(10 * MB), [dev])[1] is None
    assert dev.in_use == 20 * MB
    dev = earlier_trials()
    with pytest.raises(ValueError, match="boom"):
        measured(lambda: (_ for _ in ()).throw(ValueError("boom")), [dev])
    assert dev.in_use == 20 * MB + 12_345  # freed on the way out


def test_chunks_cover_the_gap_to_within_one_chunk() -> None:
    for n in (0, CHUNK - 1, CHUNK, 3 * CHUNK + 5, 730 * MB + 777, 7_475 * MB):
        sizes = chunks(n)
        assert 0 <= n - sum(sizes) < CHUNK and all(s >= CHUNK for s in sizes)
        assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)


def test_a_cpu_has_no_meter_and_nothing_is_measured() -> None:
    assert jax.devices()[0].platform == "cpu"
    assert device_memory.meters() == []
    assert measured(lambda: 3) == (3, None)


# --------------------------------------------------------------------- through measure


def step_with(dev: StandInDevice, *, scratch: int, need: int) -> tuple[Any, tuple[Any, ...]]:
    """tiny()'s step, and a stand-in allocation: ``scratch`` when traced (compiling),
    ``need`` each time it runs (a host callback inside the compiled step)."""
    step, args = tiny().build(Schedule.plain(32))

    def run_needs(loss: jax.Array) -> jax.Array:
        def on_run(x: Any) -> Any:
            dev.transient(need)
            return x

        return jax.pure_callback(on_run, jax.ShapeDtypeStruct(loss.shape, loss.dtype), loss)

    def wrapped(*a: Any) -> Any:
        dev.transient(scratch)  # at trace time: inside the compile
        w, loss = step(*a)
        return w, run_needs(loss)

    return wrapped, args


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> StandInDevice:
    dev = earlier_trials()
    monkeypatch.setattr(device_memory, "meters", lambda: [dev])
    return dev


def test_measure_records_runtime_peak_and_compile_scratch_apart(
        standin: StandInDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    step, args = step_with(standin, scratch=118 * MB, need=3 * MB)
    m = measure_step(step, args, min_repeats=2, max_repeats=2)
    monkeypatch.setattr(device_memory, "meters", lambda: [])  # this CPU, as it is
    cpu = measure_step(*tiny().build(Schedule.plain(32)), min_repeats=1, max_repeats=1)
    assert m.status == "ok" and m.step_seconds is not None
    assert m.total_bytes == cpu.total_bytes and m.argument_bytes is not None  # the estimate
    assert m.compile_scratch_bytes == 118 * MB
    assert m.runtime_peak_bytes == m.argument_bytes + 3 * MB
    assert m.peak_bytes == standin.peak and m.peak_bytes > 750 * MB  # the process's mark
    assert cpu.runtime_peak_bytes is None and cpu.compile_scratch_bytes is None
    assert Measurement.from_attrs(m.to_attrs()) == m


def test_runtime_peak_over_the_budget_does_not_fit(standin: StandInDevice) -> None:
    step, args = step_with(standin, scratch=0, need=50 * MB)
    m = measure_step(step, args, budget_bytes=10 * MB, min_repeats=1, max_repeats=1)
    assert m.total_bytes is not None and m.total_bytes < 10 * MB  # the estimate fits
    assert m.status == "over_budget" and m.step_seconds is None
    assert "measured runtime peak" in m.reason and "estimate" in m.reason
    assert not m.fits(10 * MB) and m.bound == "runtime peak"
    fine = measure_step(step, args, budget_bytes=60 * MB, min_repeats=1, max_repeats=1)
    assert fine.status == "ok" and fine.fits(60 * MB)


def test_the_fit_rule() -> None:
    def m(total: int, runtime: int | None) -> Measurement:
        return Measurement("k", "ok", total_bytes=total, runtime_peak_bytes=runtime,
                           step_seconds=1.0)

    assert m(100, None).fits(100) and m(100, None).bound == "estimate"  # a CPU: as before
    assert not m(100, 150).fits(120) and m(100, 150).fits(150)
    assert m(100, 150).fit_bytes == 150 and m(100, 150).bound == "runtime peak"
    assert m(100, 90).fit_bytes == 100 and m(100, 90).bound == "estimate"
    assert not m(130, 90).fits(120)  # both must fit


# --------------------------------------------------------------------- tune, pareto, show


def needy(dev: StandInDevice, budget: int) -> Problem:
    """tiny(), where the plain scan needs 5x the budget when it runs (its estimate is a
    few KB) and every other schedule a tenth of it."""
    base = tiny()

    def build(schedule: Schedule) -> tuple[Any, tuple[Any, ...]]:
        step, args = base.build(schedule)
        need = 5 * budget if schedule.key() == Schedule.plain(32).key() else budget // 10

        def wrapped(*a: Any) -> Any:
            w, loss = step(*a)

            def on_run(x: Any) -> Any:
                dev.transient(need)
                return x

            return w, jax.pure_callback(on_run, jax.ShapeDtypeStruct(loss.shape, loss.dtype),
                                        loss)

        return wrapped, args

    return Problem(name="needy", seq_len=32, build=build)


def test_tune_pareto_and_show_on_a_stand_in_device(standin: StandInDevice, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    budget = 10 * MB
    tune(needy(standin, budget), budget, n_trials=5, time_budget=0.02, study_name="s")
    study = load_study("s")
    plain_key = Schedule.plain(32).key()
    trials = {t.schedule.key(): t for t in _measured(study)}
    plain = trials[plain_key].measurement
    assert plain.status == "over_budget" and "measured runtime peak" in plain.reason
    assert plain.total_bytes is not None and plain.total_bytes < budget
    best = choose(study)
    assert best is not None and best.schedule.key() != plain_key
    assert best.measurement.runtime_peak_bytes == (best.measurement.argument_bytes or 0) + MB
    front = pareto_front(study)
    assert front and plain_key not in {p.schedule for p in front}
    table = front_table(front, budget)
    assert "runtime peak" in table.splitlines()[1] and "compile scr." in table.splitlines()[1]
    assert "the fit is bound by the measured runtime peak" in table
    groups, _ = plot_groups(study)
    over = next(g for g in groups if g.kind == "over")
    assert trials[plain_key].number in over.trials
    result = summarize(study, "sqlite:///runs/autoremat.db")
    printed = result_table(result)
    assert "runtime peak" in printed and "bound" in printed
    assert result.best is not None
    shown = describe_schedule(result.best)
    assert "device memory: estimate" in shown and "measured runtime peak" in shown
    assert "other meta" not in shown


def _measured(study: Any) -> list[Any]:
    from autoremat._search.study import measured_trials

    return measured_trials(study)


def test_on_a_cpu_the_printed_figures_are_unchanged() -> None:
    fig = {"total_bytes": 2600, "temp_bytes": 1000, "argument_bytes": 800,
           "output_bytes": 800, "alias_bytes": 0, "argument_parts": [("w", 64), ("x", 736)],
           "stacked_bytes": None, "carry_bytes": None, "argument_sharding": [],
           "devices": 1, "mesh": ""}
    assert breakdown_lines(fig) == [
        "  memory (per device, 1 device): total 2.6 KB = arguments 800 B + outputs 800 B + "
        "temp 1 KB",
        "    arguments: w 64 B, x 736 B"]
    assert not any("device memory" in line for line in breakdown_lines(fig))
    gpu = {**fig, "runtime_peak_bytes": 2900, "compile_scratch_bytes": 118 * MB,
           "peak_bytes": 750 * MB}
    assert breakdown_lines(gpu)[-1] == (
        "    device memory: estimate 2.6 KB, measured runtime peak 2.9 KB, +11.5%, compile "
        "scratch 118 MB (transient, freed before the step runs), process peak 750 MB; the "
        "fit is bound by the measured runtime peak")


def needy_problem() -> Problem:
    """``needy`` on the stand-in that ``device_memory.meters()`` returns (the CLI test's
    ``--problem``), with a 10 MB budget in mind."""
    dev: Any = device_memory.meters()[0]  # the test's StandInDevice (this file loaded anew)
    return needy(dev, 10 * MB)


def test_the_commands_print_estimate_runtime_peak_and_scratch(
        standin: StandInDevice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from autoremat.cli import main

    monkeypatch.chdir(tmp_path)
    problem = f"{Path(__file__).resolve()}:needy_problem"
    assert main(["tune", "--problem", problem, "--budget", "10MB", "--trials", "4",
                 "--time-budget", "0.02", "--study-name", "cli"]) == 0
    out, err = capsys.readouterr()
    assert "runtime peak" in out.splitlines()[out.splitlines().index(
        next(line for line in out.splitlines() if "vs plain" in line))]
    assert "device memory: estimate" in out
    assert any("runtime peak" in line and "compile scratch" in line
               for line in err.splitlines() if line.startswith("tune: trial"))
    assert main(["pareto", "--study-name", "cli"]) == 0
    out, _ = capsys.readouterr()
    assert "runtime peak" in out and "compile scr." in out and "bound" in out
    assert main(["show", "schedule.yaml"]) == 0
    out, _ = capsys.readouterr()
    assert "device memory: estimate" in out and "compile scratch" in out


def test_the_real_meter_fills_and_frees_on_this_cpu() -> None:
    """The JAX meter's filler (what a GPU run allocates) runs here; a CPU reports no stats."""
    meter = device_memory.JaxMeter(jax.devices()[0])
    assert meter.stats() is None
    free = meter.fill(3 * CHUNK + 5)
    free()
    free()  # freeing twice is harmless
