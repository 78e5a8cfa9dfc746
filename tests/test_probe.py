"""The probe of risky choices (offload policies) before a study offers them.

No GPU here: the GPU's outcome ("compile failed" on an H200) is played by stand-ins,
problems whose step fails or differs for one schedule on purpose; they are labelled
STAND-IN. What jax does with an offload policy on this CPU is tested as it is.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import pytest

import autoremat
import autoremat._search.retime as retime_module
from autoremat._cli.printing import event_line
from autoremat._measure.failure import FailedAt
from autoremat._measure.measure import Compiled
from autoremat._measure.measurement import ERROR, OK, Measurement
from autoremat._measure.problem import Problem
from autoremat._schedules import from_data
from autoremat._schedules.base import Check, Schedule
from autoremat._schedules.nested import NestedSchedule
from autoremat._schedules.nested_space import OFFLOAD_POLICIES, policy_choices
from autoremat._search.attrs import PROBE
from autoremat._search.probes.probe import (
    LEFT_OUT,
    OFFERED,
    PROBE_LENGTH,
    ProbeVerdict,
    Source,
    checks,
    lines,
    probe,
    refused,
    small,
)
from autoremat._search.reports import TuneEvent
from autoremat._search.short_runs import ShortRuns
from autoremat._search.space import neighbours, parameters, propose, seeds
from autoremat._search.study import load_study
from autoremat._search.tune import tune
from autoremat._search.worker import compile_failed
from autoremat.cli import main as cli_main
from tests.tiny_problem import tiny

OFFLOAD = OFFLOAD_POLICIES["offload_dots"]
cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="what jax does on a CPU")


def _with_at_length(problem: Problem) -> Problem:
    return Problem(problem.name, problem.seq_len, problem.build,
                   at_length=lambda n: tiny(n))


def _odd_one(schedule: Schedule, how: str) -> Problem:
    """STAND-IN for a device whose XLA mishandles one schedule: the tiny problem, whose
    step under ``schedule`` fails to compile, fails at run time, or is off by 1e-2."""
    base = tiny(PROBE_LENGTH)

    def explode(x: Any) -> Any:
        raise RuntimeError("step exploded at run time")

    def build(s: Schedule) -> tuple[Any, tuple[Any, ...]]:
        step, args = base.build(s)
        if s.key() != schedule.key():
            return step, args
        if how == "compile":
            return (lambda w, x: step(w, x[:, :3] + x)), args  # a shape error when lowered
        if how == "run":
            return (lambda w, x: step(jax.pure_callback(
                explode, jax.ShapeDtypeStruct(w.shape, w.dtype), w), x)), args
        return (lambda w, x: jax.tree_util.tree_map(lambda v: v * 1.01, step(w, x))), args

    return Problem(f"odd({how})", PROBE_LENGTH, build)


def test_the_cpu_offers_no_offload_so_its_probe_compiles_nothing() -> None:
    calls: list[Schedule] = []
    base = tiny(32)

    def build(s: Schedule) -> tuple[Any, tuple[Any, ...]]:
        calls.append(s)
        return base.build(s)

    counting = Problem("counting", 32, build)
    assert checks(32, "cpu") == {}
    assert probe(counting, "cpu") == {} and calls == []


def test_gpu_and_tpu_check_each_offload_placement_on_its_own() -> None:
    for platform in ("gpu", "cuda", "rocm", "tpu"):
        got = checks(PROBE_LENGTH, platform)
        graphs = {"graph_loops"} if platform in ("gpu", "cuda") else set()  # _space.checks
        assert set(got) == set(OFFLOAD_POLICIES) | graphs
        assert set(OFFLOAD_POLICIES) <= set(policy_choices(platform))
        assert all(got[label].offloads for label in OFFLOAD_POLICIES)
        step, dots, carries = (got[k].schedule for k in
                               ("offload_step", "offload_dots", "offload_carries"))
        assert isinstance(step, NestedSchedule) and step.lengths == (PROBE_LENGTH,)
        assert step.levels[0].policy == OFFLOAD
        assert isinstance(dots, NestedSchedule) and dots.lengths == (8, 8)
        assert [lv.policy.name for lv in dots.levels] == ["nothing_saveable", OFFLOAD.name]
        assert isinstance(carries, NestedSchedule) and carries.lengths == (8, 8)
        assert carries.levels[0].policy == OFFLOAD_POLICIES["offload_carries"]
        assert carries.levels[1].policy.name == "nothing_saveable"


def test_each_placement_is_offered_only_where_it_is_placed() -> None:
    rng = random.Random(0)
    seen: dict[str, set[str]] = {"step": set(), "innermost": set(), "outer": set()}
    for _ in range(400):
        schedule = propose({"kind": "nested"}, 1000, "tpu", rng)[0]
        assert isinstance(schedule, NestedSchedule)
        levels = schedule.levels
        for i, lv in enumerate(levels):
            where = "step" if len(levels) == 1 else "innermost" if i == len(levels) - 1 \
                else "outer"
            seen[where].add(lv.policy.name)
    assert OFFLOAD.name in seen["step"] and OFFLOAD.name in seen["innermost"]
    assert OFFLOAD.name not in seen["outer"]
    carries = OFFLOAD_POLICIES["offload_carries"].name
    assert carries in seen["outer"] and carries not in seen["step"] | seen["innermost"]


@cpu_only
def test_each_offload_placement_gives_the_plain_scans_loss_and_gradients() -> None:
    """On this CPU the offload is a no-op, but each placement's schedule -- the named
    carries (``checkpoint_name`` + ``save_and_offload_only_these_names``) included --
    runs and matches the plain scan (the probe's comparison, at highest precision)."""
    problem = tiny(PROBE_LENGTH)
    for label, check in checks(PROBE_LENGTH, "tpu").items():
        plainly = {label: Check(check.schedule)}  # no host-placement test on a CPU
        found = probe(problem, "tpu", choices=plainly)[label]
        assert found.offered and found.why.startswith("compiles, loss and gradients match"), label


def test_a_placement_that_fails_is_left_out_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """STAND-IN for XLA:TPU (jax 0.10.2), which refuses offload at an outer level of a
    nested scan ("async-start expects the shape of operand 0 to match ... S(5)"): the
    compile of the ``offload_carries`` probe fails; the others compile and, on the
    TPU, place their residuals on the host (stood in: the CPU places nothing)."""
    import autoremat._search.probes.probe as probe_module

    real = probe_module._run
    carries = OFFLOAD_POLICIES["offload_carries"]

    def tpu_like(problem: Problem, schedule: Schedule, offloads: bool) -> tuple[bool, list[Any]]:
        if isinstance(schedule, NestedSchedule) and schedule.levels[0].policy == carries:
            raise probe_module._CompileFailed(
                "INTERNAL: async-start expects the shape of operand 0 to match the async "
                "shape at index {0} ... S(5)")
        placed, out = real(problem, schedule, offloads)
        return offloads or placed, out

    monkeypatch.setattr(probe_module, "_run", tpu_like)
    outcome = probe(tiny(PROBE_LENGTH), "tpu")
    assert set(outcome) == set(OFFLOAD_POLICIES)
    assert outcome["offload_step"].text().startswith(f"{OFFERED}: ")
    assert outcome["offload_dots"].text().startswith(f"{OFFERED}: ")
    assert outcome["offload_carries"].text().startswith(
        f"{LEFT_OUT}: compile failed (8x8 save()+offload(autoremat_carry)")
    assert "async-start" in outcome["offload_carries"].text()
    no = refused(outcome)
    assert no == {"offload_carries"}
    rng = random.Random(1)
    names = set().union(*(_policies(propose({"kind": "nested"}, 1000, "tpu", rng, no)[0])
                          for _ in range(300)))
    assert OFFLOAD.name in names and carries.name not in names


@cpu_only
def test_on_a_cpu_offload_compiles_and_matches_but_places_nothing_on_the_host() -> None:
    """jax 0.10 on a CPU: an offload policy compiles and its loss and gradients equal
    the plain scan's, but the lowered step moves nothing to host memory (jax lowers
    ``device_put`` to a memory space only on GPU and TPU). So the probe leaves it out
    as a duplicate of ``dots_with_no_batch_dims_saveable``, saying why."""
    problem = tiny(PROBE_LENGTH)
    two_level = autoremat.nested([8, 8], OFFLOAD)
    matched = probe(problem, "gpu", choices={"offload_dots": Check(two_level)})
    assert matched["offload_dots"].text().startswith(
        f"{OFFERED}: compiles, loss and gradients match")
    outcome = probe(problem, "gpu")  # the platform string of a GPU, on this CPU
    assert list(outcome) == [*OFFLOAD_POLICIES, "graph_loops"]
    for label in OFFLOAD_POLICIES:
        assert outcome[label].text().startswith(f"{LEFT_OUT}: offloads nothing on this device")
    # the CPU accepts XLA:GPU's options and ignores them: the same results
    assert outcome["graph_loops"].text().startswith(
        f"{OFFERED}: compiles, loss and gradients match")
    assert refused(outcome) == set(OFFLOAD_POLICIES)


@pytest.mark.parametrize(("how", "reason"), [
    ("compile", f"{LEFT_OUT}: compile failed (8x8 "),
    ("run", f"{LEFT_OUT}: run failed (8x8 "),
    ("differ", f"{LEFT_OUT}: loss or gradients differ from the plain scan (8x8 "),
])
def test_a_choice_that_fails_or_differs_is_left_out_with_one_line(how: str, reason: str) -> None:
    risky = autoremat.nested([8, 8], "dots_saveable")  # STAND-IN for an offload policy
    fine = autoremat.nested([8, 8], "nothing_saveable")
    outcome = probe(_odd_one(risky, how), "gpu",
                    choices={"risky": Check(risky), "fine": Check(fine)})
    assert outcome["risky"].text().startswith(reason), outcome["risky"].text()
    assert "\n" not in outcome["risky"].text() and "Traceback" not in outcome["risky"].text()
    assert outcome["fine"].text().startswith(OFFERED)
    assert refused(outcome) == {"risky"}
    stored = {k: v.text() for k, v in outcome.items()}  # as a study holds them
    assert lines(stored)[0] == f"probe: risky: {outcome['risky'].text()}"
    assert {k: ProbeVerdict.parse(v) for k, v in stored.items()} == outcome


def test_the_probe_runs_on_a_short_instance_when_the_problem_has_one() -> None:
    long = _with_at_length(tiny(1000))
    assert small(long).seq_len == PROBE_LENGTH
    assert small(tiny(1000)).seq_len == 1000  # no at_length: the problem itself
    assert small(tiny(32)).seq_len == 32  # already short
    got = probe(long, "gpu", choices={"c": Check(autoremat.nested([8, 8]))})
    assert f"at T={PROBE_LENGTH})" in got["c"].text()


def test_the_probe_runs_on_the_problems_own_small_instance_first() -> None:
    own = Problem("big", 1000, tiny(1000).build, at_length=lambda n: tiny(n),
                  small=lambda: tiny(12))
    assert small(own).seq_len == 12  # not at_length's PROBE_LENGTH
    got = probe(own, "gpu", choices={"c": Check(autoremat.nested([3, 4]))})
    assert got["c"].text().startswith(OFFERED) and "at T=12)" in got["c"].text()


def test_where_the_plain_scan_fails_the_probe_compares_with_remat_of_each_step() -> None:
    base = tiny(16)

    def build(s: Schedule) -> tuple[Any, tuple[Any, ...]]:
        if s == autoremat.plain(16):
            raise RuntimeError("RESOURCE_EXHAUSTED: the plain scan does not fit")
        return base.build(s)

    too_big = Problem("too big for plain", 16, build)
    got = probe(too_big, "gpu", choices={"c": Check(autoremat.nested([4, 4], "dots_saveable"))})
    assert got["c"].text().startswith(OFFERED), got["c"].text()
    nothing = Problem("nothing runs", 16, lambda s: (_ for _ in ()).throw(RuntimeError("no")))
    got = probe(nothing, "gpu", choices={"c": Check(autoremat.nested([4, 4]))})
    assert not got["c"].offered
    assert got["c"].why.startswith("no reference ran at T=16: "), got["c"].text()


def _policies(schedule: Schedule) -> set[str]:
    return ({lv.policy.name for lv in schedule.levels} if isinstance(schedule, NestedSchedule)
            else set())


def test_a_refused_choice_is_never_offered_proposed_or_a_neighbour() -> None:
    off = OFFLOAD.name
    rng = random.Random(0)
    schedules = [propose({}, 1000, "gpu", rng)[0] for _ in range(300)]
    assert any(off in _policies(s) for s in schedules)  # offered when not refused
    no = frozenset({"offload_dots", "offload_step"})  # the labels of this policy
    for _ in range(300):
        assert off not in _policies(propose({}, 1000, "gpu", rng, no)[0])
    _, params = propose({"kind": "nested", "depth": 2, "d2_p0": "offload_dots"}, 1000,
                        "gpu", rng, no)
    assert params["d2_p0"] != "offload_dots"
    assert all(not no & set(p.choices) for p in parameters(params, 1000, "gpu", no))
    for schedule, _ in neighbours(params, 1000, "gpu", rng, no):
        assert off not in _policies(schedule)
    assert all(not no & set(map(str, p.values())) for _, p in seeds(1000, "gpu", no))


def _favouring(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake timer (no run): a step's seconds from its work (``bounds.cost``'s
    evaluations), a quarter of that where a level saves under ``policy``, a tie broken by
    the key; runs in turn (``retime``) get the same figures. The planner then ranks by
    these figures alone, not by this machine's load."""
    seconds: dict[str, float] = {}

    def fake_time(runs: ShortRuns, schedule: Schedule, sized: Compiled, *,
                  budget_bytes: int | None, time_budget: float, best: float | None
                  ) -> Measurement:
        if sized.executable is None:
            return sized.measurement  # not compiled: as measured
        key, seq_len = schedule.key(), runs.problem.seq_len
        favoured = 0.25 if policy in _policies(schedule) else 1.0
        seconds[key] = (schedule.cost(seq_len).evaluations * favoured
                        + (zlib.crc32(key.encode()) % 97) / 97) * 1e-5
        return replace(sized.measurement, timed_seq_len=seq_len, step_seconds=seconds[key],
                       step_samples=(seconds[key],))

    def fake_interleaved(runs: Sequence[Compiled], rounds: int) -> list[list[float]]:
        return [[seconds[c.measurement.schedule_key]] * rounds for c in runs]

    monkeypatch.setattr(ShortRuns, "time", fake_time)
    monkeypatch.setattr(retime_module, "interleaved", fake_interleaved)


def test_tune_leaves_a_refused_choice_out_and_the_cli_shows_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """STAND-IN for offload on an H200: the ``everything`` policy label is declared risky
    (``checks`` patched) and its probe schedule fails to compile on this problem. A fake
    timer (``_favouring``) makes the schedules saving everything the fastest, so after the
    seeds the planner proposes that choice first, whatever this machine's load: it is
    probed then (not before the search), the study records why, says so once, and no trial
    the planner chose uses ``everything_saveable`` (the seeds, enqueued before any probe,
    use no risky choice on a real platform; here two of them hold it)."""
    monkeypatch.chdir(tmp_path)
    _favouring("everything_saveable", monkeypatch)
    risky = autoremat.nested([8, 8], "everything_saveable")
    monkeypatch.setattr("autoremat._search.probes.probe.checks",
                        lambda n, platform, named=None: {"everything": Check(risky)})
    notes: list[TuneEvent] = []
    result = tune(_odd_one(risky, "compile"), 10**6, n_trials=8, time_budget=0.02,
                  study_name="probed", on_confirm=notes.append)
    assert result.measured == 8
    study = load_study("probed")
    why = study.user_attrs[PROBE]["everything"]
    assert why.startswith(
        f"{LEFT_OUT}: compile failed (8x8 everything/everything unroll=1 at T=64): ")
    assert [event_line(n) for n in notes] == [f"probe: everything: {why}"]
    n_seeds = len(seeds(PROBE_LENGTH, "cpu"))
    chosen = [t for t in study.trials if "schedule" in t.user_attrs and t.number >= n_seeds]
    used = set().union(*(_policies(from_data(t.user_attrs["schedule"])) for t in chosen))
    assert len(chosen) == 8 - n_seeds and "everything_saveable" not in used
    cached = json.loads((tmp_path / "runs" / "probes.json").read_text())  # probe_cache
    assert [v for env in cached.values() for v in env["everything"].values()] == [why]

    assert cli_main(["pareto", "--study-name", "probed"]) == 0
    assert f"probe: everything: {why}" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(("failed_at", "out_of_memory", "failed"), [
    ("build", False, True),
    ("compile", False, True),
    ("compile", True, True),
    ("run", False, False),  # a run failure, a non-finite output
    ("run", True, False),
])
def test_what_counts_as_a_failed_compile(failed_at: FailedAt, out_of_memory: bool,
                                         failed: bool) -> None:
    """Read from the measurement's data (at full length or a short run's ``at T'=...``),
    whatever its reason's words say."""
    m = Measurement("k", ERROR, "at T'=4000: anything", failed_at=failed_at,
                    out_of_memory=out_of_memory)
    assert compile_failed(m) is failed
    assert not compile_failed(Measurement("k", OK, ""))


def test_a_verdict_is_data_stored_as_the_line_a_study_holds() -> None:
    """A verdict says whether the choice is offered, why, and where it came from; it is
    stored as one line and read back from any line a study or the cache holds."""
    lines_held = [
        "offered: compiles, loss and gradients match the plain scan (8x8 ... at T=64)",
        "left out: compile failed (8x8 ... at T=64): INTERNAL: async-start",
        "left out: compile failed (8x8 ... at T=64): INTERNAL (cached)",
        "left out: compile failed: INTERNAL: two choices (in a trial, not the probe)",
        "left out: compile failed: X (in a trial, not the probe) (cached)",
        "left out: compile failed (8x8): X [found on tiny] (cached)",
        "offered: not probed (no instance of it at the probe's length)",
    ]
    for line in lines_held:
        assert ProbeVerdict.parse(line).text() == line
    assert ProbeVerdict.parse(lines_held[0]) == ProbeVerdict(True, lines_held[0][9:])
    assert ProbeVerdict.parse(lines_held[2]).source is Source.CACHE
    trial = ProbeVerdict.parse(lines_held[3])
    assert (trial.offered, trial.why, trial.source) == (
        False, "compile failed: INTERNAL: two choices", Source.TRIAL)
    cached = ProbeVerdict.cached(lines_held[3])  # the cache's line, read from the cache
    assert cached.source is Source.CACHE and cached.text() == f"{lines_held[3]} (cached)"
    assert cached.stored().text() == lines_held[3]  # what the cache keeps
