"""Measured device memory (issues 30, 35): the step's own runtime need, the compile
scratch, the bisected truth and the proof of fit.

No accelerator runs these tests. ``StandInDevice`` below is a STAND-IN for a GPU's
``memory_stats()``: a few integers that simulate an allocator's ``bytes_in_use`` and
``peak_bytes_in_use`` (a peak that never goes down, as XLA's BFC allocator reports
it); ``StandInTPU`` one for a TPU's, whose programs' temporaries are a reservation
(``bytes_reserved``: the largest loaded program's, given back when an allocation needs
the room), as measured on a TPU v5e. They are put where
``autoremat._measure.device_memory.meters()`` would return the real devices, so the
arithmetic, the fit rule and what is printed run here on a CPU. Real figures only come
from ``studies/device_check.py`` on a device, and ``tests/test_device.py`` (marked
``device``) checks them there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import optuna
import pytest

import autoremat
from autoremat._cli.breakdown_text import breakdown_lines
from autoremat._cli.front_text import front_table
from autoremat._cli.printing import proof_line, result_table
from autoremat._cli.show_text import describe_schedule
from autoremat._measure import device_memory
from autoremat._measure.allocator import Stats
from autoremat._measure.device_memory import CHUNK, LADDER, chunks
from autoremat._measure.device_memory import gap_need as measured
from autoremat._measure.measure import measure_step
from autoremat._measure.measurement import Measurement
from autoremat._measure.problem import Problem
from autoremat._measure.within import bisect_need, runs_within
from autoremat._schedules.base import Schedule
from autoremat._search.pareto import pareto_front, plot_groups
from autoremat._search.reports import ProofOfFit, ProofOutcome
from autoremat._search.study import choose, load_study, summarize
from autoremat._search.tune import tune
from tests.tiny_problem import tiny

optuna.logging.set_verbosity(optuna.logging.WARNING)

MB = 10**6


@pytest.fixture(autouse=True)
def _no_collections(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in device has no executables to collect, so ``device_memory``'s
    ``gc.collect`` before each measured piece of work is skipped here: in a whole test
    run's worker, one bisection's collections took 7 s."""
    monkeypatch.setattr(device_memory.gc, "collect", lambda *a: 0)


class StandInDevice:
    """A STAND-IN for a GPU's allocator -- not a device, no memory behind it.

    It implements ``device_memory.Meter``: ``stats()`` reads the simulated
    ``bytes_in_use``/``peak_bytes_in_use``; ``fill`` allocates the chunks the real
    meter would. ``transient(n)``: something allocates ``n`` bytes and frees them
    (a compile's scratch, a run's buffers). Over ``limit`` it raises XLA's
    out-of-memory error text.
    """

    platform = "gpu"

    def __init__(self, in_use: int, peak: int, limit: int | None = None) -> None:
        self.in_use, self.peak, self.limit = in_use, peak, limit

    def stats(self) -> Stats:
        return Stats(self.in_use, self.peak, 0, self.limit)

    def allocate(self, n: int) -> None:
        if self.limit is not None and self.in_use + n > self.limit:
            raise RuntimeError(f"RESOURCE_EXHAUSTED: Out of memory allocating {n} bytes "
                               "(stand-in device)")
        self.in_use += n
        self.peak = max(self.peak, self.in_use)

    def transient(self, n: int) -> None:
        self.allocate(n)
        self.in_use -= n

    def fill(self, nbytes: int, exact: bool = False) -> Callable[[], None]:
        held = 0
        try:
            for size in chunks(nbytes, exact=exact):
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
    for n in (0, CHUNK - 1, CHUNK, 3 * CHUNK + 5, 730 * MB + 777, 7_475 * MB, 16 * 2**30 - 1):
        sizes = chunks(n)
        assert 0 <= n - sum(sizes) < CHUNK and all(s >= CHUNK for s in sizes)
        assert sizes == sorted(sizes, reverse=True)
        assert all(sizes.count(s) < LADDER for s in sizes)  # the fewest chunks of these sizes


def test_a_chips_fills_need_four_filler_programs() -> None:
    """Every fill up to a 16-GiB chip uses one of four chunk sizes: a device compiles a
    fill of zeros once per size (about 0.1 s each on a TPU, under the measurement lock)."""
    seen = {size for n in range(CHUNK, 16 * 2**30, 7_777_777 * 13) for size in chunks(n)}
    assert seen == {CHUNK * LADDER**k for k in range(4)}


def test_a_cpu_has_no_meter_and_nothing_is_measured() -> None:
    assert jax.devices()[0].platform == "cpu"
    assert device_memory.meters() == []
    assert device_memory.measured(lambda: 3) == (3, None)
    assert runs_within(lambda: 3, 10)[0] is None


# --------------------------------------------------------------------- through measure


def step_with(dev: StandInDevice, *, scratch: int, need: int) -> tuple[Any, tuple[Any, ...]]:
    """tiny()'s step, and a stand-in allocation: ``scratch`` when traced (compiling),
    ``need`` each time it runs (a host callback inside the compiled step)."""
    step, args = tiny().build(autoremat.plain(32))

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
    """The GPU stand-in, its method counted as validated (the real GPU's is not yet)."""
    dev = earlier_trials()
    monkeypatch.setattr(device_memory, "meters", lambda: [dev])
    monkeypatch.setitem(device_memory.VALIDATED, "gpu", "stand-in: as if validated")  # type: ignore[index]
    return dev


def test_measure_records_runtime_peak_and_compile_scratch_apart(
        standin: StandInDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    step, args = step_with(standin, scratch=118 * MB, need=3 * MB)
    m = measure_step(step, args, min_repeats=2, max_repeats=2)
    monkeypatch.setattr(device_memory, "meters", lambda: [])  # this CPU, as it is
    cpu = measure_step(*tiny().build(autoremat.plain(32)), min_repeats=1, max_repeats=1)
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
    # measured, the runtime peak decides also when the estimate is larger (a TPU's can be
    # a third over the truth)
    assert m(100, 90).fit_bytes == 90 and m(100, 90).bound == "runtime peak"
    assert m(130, 90).fits(120) and not m(130, 90).fits(80)


def test_an_estimate_over_the_budget_runs_where_the_runtime_is_measured(
        standin: StandInDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    step, args = step_with(standin, scratch=0, need=0)
    estimate = measure_step(step, args, run=False).total_bytes
    assert estimate is not None
    budget = estimate - 1
    skipped = measure_step(step, args, budget_bytes=budget, min_repeats=1, max_repeats=1)
    assert skipped.status == "over_budget" and "not run" in skipped.reason  # unvalidated here
    platform = skipped.platform
    monkeypatch.setitem(device_memory.VALIDATED, platform, "stand-in")  # type: ignore[index]
    ran = measure_step(step, args, budget_bytes=budget, min_repeats=1, max_repeats=1)
    assert ran.runtime_peak_bytes is not None  # it ran: the measured peak decides
    assert ran.fit_bytes == ran.runtime_peak_bytes and ran.bound == "runtime peak"
    roomy = ran.runtime_peak_bytes
    assert roomy > budget and ran.status == "over_budget" and "not run" not in ran.reason
    fine = measure_step(step, args, budget_bytes=roomy, min_repeats=1, max_repeats=1)
    assert fine.status == "ok" and fine.fits(roomy)


# --------------------------------------------------------------------- tune, pareto, show


def needy(dev: StandInDevice, budget: int) -> Problem:
    """tiny(), where the plain scan needs 5x the budget when it runs (its estimate is a
    few KB) and every other schedule a tenth of it."""
    base = tiny()

    def build(schedule: Schedule) -> tuple[Any, tuple[Any, ...]]:
        step, args = base.build(schedule)
        need = 5 * budget if schedule.key() == autoremat.plain(32).key() else budget // 10

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
    plain_key = autoremat.plain(32).key()
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


# --------------------------------------------------------------------- a TPU's books


class StandInTPU:
    """A STAND-IN for a TPU's allocator -- not a device, no memory behind it.

    As measured on a TPU v5e (jax 0.10.2): buffers are booked in ``bytes_in_use``; a
    program's temporaries are a reservation made when it first runs and held while it
    is loaded, ``bytes_reserved`` being the largest over the loaded programs (not a
    sum); an allocation that needs the reserved room makes the runtime give it back
    (the programs reserve again when they next run). Over ``limit`` it raises XLA's
    out-of-memory text.
    """

    platform = "tpu"

    def __init__(self, in_use: int, limit: int, gives_back: bool = True) -> None:
        self.in_use, self.peak, self.limit = in_use, in_use, limit
        self.reserving: dict[str, int] = {}
        self.gives_back = gives_back  # False: a runtime that keeps a loaded program's room

    @property
    def reserved(self) -> int:
        return max(self.reserving.values(), default=0)

    def stats(self) -> Stats:
        return Stats(self.in_use, self.peak, self.reserved, self.limit)

    def allocate(self, n: int) -> None:
        if self.in_use + n + (0 if self.gives_back else self.reserved) > self.limit:
            raise RuntimeError(f"RESOURCE_EXHAUSTED: Out of memory allocating {n} bytes")
        if self.in_use + n + self.reserved > self.limit:
            self.reserving.clear()  # the runtime gives the reservations back
        self.in_use += n
        self.peak = max(self.peak, self.in_use)

    def run(self, program: str, temp: int, outputs: int) -> None:
        """Run ``program``: reserve its temporaries, then allocate its outputs (kept)."""
        if self.in_use + max(self.reserved, temp) + outputs > self.limit:
            raise RuntimeError("RESOURCE_EXHAUSTED: E0101: RuntimeProgramAllocationFailure: "
                               f"Attempting to reserve {temp} bytes at the bottom of memory")
        self.reserving[program] = temp
        self.allocate(outputs)

    def fill(self, nbytes: int, exact: bool = False) -> Callable[[], None]:
        size = sum(chunks(nbytes, exact=exact))
        self.allocate(size)

        def free() -> None:
            nonlocal size
            self.in_use -= size
            size = 0

        return free


def test_a_tpu_step_needs_its_outputs_and_its_reservation() -> None:
    tpu = StandInTPU(in_use=20 * MB, limit=16_000 * MB)
    _, need = device_memory.reserved_need(lambda: tpu.run("plain", 984 * MB, MB), [tpu])
    assert need == 985 * MB  # never the 1 MB that peak_bytes_in_use rose by
    # a smaller program beside a loaded larger one: the reservation is given back first
    _, need = device_memory.reserved_need(lambda: tpu.run("100x100", 83 * MB, MB), [tpu])
    assert need == 84 * MB
    assert tpu.reserving == {"100x100": 83 * MB}


def test_a_tpu_reservation_hidden_under_a_loaded_program_is_unknown() -> None:
    tpu = StandInTPU(in_use=20 * MB, limit=1_500 * MB, gives_back=False)
    tpu.run("plain", 984 * MB, 0)
    _, need = device_memory.reserved_need(lambda: tpu.run("small", 83 * MB, 0), [tpu])
    assert need is None  # under plain's 984 MB: not 984 MB, not 83 MB either


def test_validated_platforms_only_give_a_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    tpu = StandInTPU(in_use=20 * MB, limit=16_000 * MB)
    assert device_memory.measured(lambda: tpu.run("p", 50 * MB, MB), [tpu]) == (None, 51 * MB)
    assert device_memory.measured(lambda: None, [tpu], compiling=True)[1] is None
    gpu = earlier_trials()
    assert device_memory.measured(lambda: gpu.transient(5 * MB), [gpu])[1] is None
    assert device_memory.need(lambda: gpu.transient(5 * MB), [gpu])[1] == 5 * MB
    reason = device_memory.unmeasured_reason("gpu")
    assert "not measured" in reason and "studies/device_check.py" in reason
    assert device_memory.unmeasured_reason("tpu") == device_memory.unmeasured_reason("cpu") == ""
    fig = {"total_bytes": 2600, "temp_bytes": 1000, "argument_bytes": 800, "output_bytes": 800,
           "alias_bytes": 0, "platform": "gpu", "devices": 1, "mesh": ""}
    assert breakdown_lines(fig)[-1] == (
        f"    device memory: estimate 2.6 KB, measured runtime peak - ({reason}); the fit is "
        "bound by the estimate")


@pytest.mark.parametrize("device", ["gpu", "tpu"])
def test_runs_within_and_the_bisected_need(device: str) -> None:
    def make() -> Any:
        return (StandInDevice(in_use=20 * MB, peak=20 * MB, limit=16_000 * MB)
                if device == "gpu" else StandInTPU(in_use=20 * MB, limit=16_000 * MB))

    dev = make()

    def step() -> None:  # 100 MB of temporaries and 3 MB of outputs, freed at once
        if isinstance(dev, StandInTPU):
            dev.run("step", 100 * MB, 3 * MB)
            dev.in_use -= 3 * MB
        else:
            dev.transient(103 * MB)

    assert runs_within(step, 103 * MB, [dev]) == (True, "")
    ok, why = runs_within(step, 102 * MB, [dev])
    assert ok is False and "RESOURCE_EXHAUSTED" in why
    assert dev.in_use == 20 * MB  # every filler freed
    need = bisect_need(step, 1_000 * MB, resolution=CHUNK // 4, devices=[dev])
    assert need is not None and 103 * MB <= need <= 103 * MB + CHUNK // 4
    assert bisect_need(step, 50 * MB, devices=[dev]) is None  # not even in `high`
    no_limit = StandInDevice(in_use=0, peak=0)
    assert runs_within(step, MB, [no_limit])[0] is None


def test_exact_chunks_cover_every_byte() -> None:
    for n in (0, 5, CHUNK - 1, CHUNK, 3 * CHUNK + 5):
        assert sum(chunks(n, exact=True)) == n


# --------------------------------------------------------------------- the proof of fit


def test_tune_proves_its_pick_and_writes_the_next_when_one_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stand-in TPU where every schedule needs 1 MB when it runs -- but the first one
    proved, whichever it is, needs 20 MB when it runs with only the 10 MB budget free.
    The first pick runs the executable the search timed; the next is compiled again."""
    from autoremat.cli import main

    monkeypatch.chdir(tmp_path)
    tpu = StandInTPU(in_use=MB, limit=16_000 * MB)
    monkeypatch.setattr(device_memory, "meters", lambda: [tpu])
    base = tiny()
    failed_proof: list[str] = []
    builds: dict[str, int] = {}

    def build(schedule: Schedule) -> tuple[Any, tuple[Any, ...]]:
        step, args = base.build(schedule)
        key = schedule.key()
        builds[key] = builds.get(key, 0) + 1

        def wrapped(*a: Any) -> Any:
            w, loss = step(*a)

            def on_run(x: Any) -> Any:
                proving = tpu.in_use > 1_000 * MB  # a filler holds the rest
                if proving and not failed_proof:
                    failed_proof.append(key)
                    tpu.run(key, 20 * MB, 0)
                tpu.run(key, MB, 0)
                return x

            return w, jax.pure_callback(on_run, jax.ShapeDtypeStruct(loss.shape, loss.dtype),
                                        loss)

        return wrapped, args

    problem = Problem(name="proved", seq_len=32, build=build)
    out = tmp_path / "s.yaml"
    result = tune(problem, 10 * MB, n_trials=4, time_budget=0.02, study_name="s", out=out,
                  explore_front=True)  # no cut trial: each has a time to be the next
    assert len(failed_proof) == 1
    assert builds[failed_proof[0]] == 1  # the first pick: the search's executable ran
    assert result.best_trial is not None and result.best is not None
    assert builds[result.best_trial.schedule.key()] == 2  # the next: compiled again
    # a TPU's mark is no process peak: the search took reservations back, lifting it
    assert tpu.peak > 1_000 * MB and result.best_trial.measurement.peak_bytes is None
    assert result.best_trial.schedule.key() != failed_proof[0]
    assert result.best_trial.measurement.fit_proof_bytes == 10 * MB
    assert result.best.meta["fit_proof_bytes"] == 10 * MB
    assert result.proof == ProofOfFit(ProofOutcome.PASSED, result.best_trial.number, 10 * MB)
    failed = [t for t in _measured(load_study("s")) if t.measurement.fit_proof_failed]
    assert [t.schedule.key() for t in failed] == failed_proof
    assert "RESOURCE_EXHAUSTED" in failed[0].measurement.fit_proof_failed
    assert not failed[0].measurement.fits(10 * MB)
    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "proof of fit: ran once with only 10 MB on the device" in shown


def test_on_a_cpu_the_proof_is_skipped_and_said(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = tune(tiny(), 10 * MB, n_trials=2, time_budget=0.02, study_name="cpu")
    assert result.proof == ProofOfFit(ProofOutcome.SKIPPED)
    assert proof_line(result.proof) == "proof of fit: skipped (a CPU has no device memory to fill)"
    assert result.best is not None and "fit_proof_bytes" not in result.best.meta
    assert "proof of fit: skipped" in result_table(result)


# --------------------------------------------------------------------- the breakdown


def test_a_temp_below_the_stacked_outputs_is_said_and_left_out_of_the_floor() -> None:
    """The TPU's pick (issue 35): temp 0 B, 51.2 MB of per-step outputs stacked (82 MB
    as the device pads them), arguments 15.6 MB, outputs 1 MB."""
    fig = {"total_bytes": 16_557_056, "temp_bytes": 0, "argument_bytes": 15_558_656,
           "output_bytes": 998_400, "alias_bytes": 0, "stacked_bytes": 81_920_000,
           "carry_bytes": 10_240, "argument_parts": [("params", 300_000), ("x", 15_258_656)],
           "devices": 1, "mesh": "", "platform": "tpu"}
    lines = breakdown_lines(fig)
    assert "temp 0 B is below the per-step outputs the scan stacks, 81.9 MB" in lines[2]
    assert "floor no schedule removes: 16.6 MB (arguments + outputs; the stacked outputs " \
           "are on chip here)" in lines[3]
    from autoremat._measure.breakdown import floor_bytes

    assert floor_bytes(fig) == 15_558_656 + 998_400
    fits = {**fig, "temp_bytes": 90_000_000, "total_bytes": 106_557_056}
    assert "temp = per-step outputs stacked by the scan 81.9 MB (carry 10.2 KB) + the rest " \
           "8.08 MB" in breakdown_lines(fits)[2]
    assert floor_bytes(fits) == 15_558_656 + 998_400 + 81_920_000


def test_arguments_and_stacked_outputs_in_device_bytes_on_this_cpu() -> None:
    """On a CPU device bytes are the shapes' bytes: what was printed before."""
    import jax.numpy as jnp

    from autoremat._measure.breakdown import argument_parts, laid_out_bytes

    x = jnp.zeros((10, 7), jnp.float32)
    assert argument_parts([x], ["x"]) == (("x", 280),)
    assert laid_out_bytes((10, 7), "float32") == 280
    assert laid_out_bytes((3,), "key<fry>") is None
