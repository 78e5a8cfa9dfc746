"""The study's probe run lazily: a risky choice when the planner first proposes it, each
combination it proposes, and the verdicts cached per platform, device kind and jax/jaxlib.

No TPU here: the platform is the string ``"tpu"`` (its offload placements) on this CPU,
and what XLA:TPU does is played by a STAND-IN of the probe's compile-and-run
(``probe._run``): every offload places something on the host, and the combination of
``offload_carries`` (outer level) with ``offload_dots`` (innermost) fails to compile --
as it did on a TPU v5e, though each passed its probe alone (issue 47).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import optuna
import pytest

import autoremat._search.probes.probe as probe_module
from autoremat._cli.printing import event_line
from autoremat._measure.measurement import ERROR, Measurement
from autoremat._measure.problem import Problem
from autoremat._schedules.base import Schedule
from autoremat._schedules.nested import NestedSchedule
from autoremat._schedules.nested_space import OFFLOAD_POLICIES
from autoremat._search.attrs import PROBE
from autoremat._search.planning.candidates import Verdict
from autoremat._search.planning.planner import Planner
from autoremat._search.probes.cache import CACHE_ENV, VerdictCache, cache_path
from autoremat._search.probes.guard import ProbeGuard, choices_of, combination
from autoremat._search.probes.probe import LEFT_OUT, OFFERED, PROBE_LENGTH, Source
from autoremat._search.reports import ProbeChecked
from autoremat._search.short_runs import ShortRuns
from tests.tiny_problem import tiny

ENV = "tpu|TPU v5 lite|jax 0.0.1|jaxlib 0.0.1"  # a fake environment key
COMBO = combination(frozenset({"offload_carries", "offload_dots"}))
PLAIN = {"kind": "nested", "depth": 1, "d1_policy": "nothing", "d1_unroll": 1}
DOTS = {"kind": "nested", "depth": 2, "d2_n0": 8, "d2_p0": "nothing", "d2_p1": "offload_dots",
        "d2_unroll": 1}
BOTH = {**DOTS, "d2_p0": "offload_carries"}
BOTH_DEEPER = {"kind": "nested", "depth": 3, "d3_n0": 4, "d3_n1": 4, "d3_p0": "offload_carries",
               "d3_p1": "nothing", "d3_p2": "offload_dots", "d3_unroll": 1}


def labels(probed: list[frozenset[str]]) -> list[str]:
    """The choices probed, as their stored labels."""
    return [combination(c) for c in probed]


class _Lock(contextlib.nullcontext):
    """Stands in for ``StudyLock`` (one process)."""


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[Schedule]:
    """STAND-IN for XLA:TPU: the probe's runs (recorded); the combination fails to compile."""
    real = probe_module._run
    ran: list[Schedule] = []
    carries, dots = OFFLOAD_POLICIES["offload_carries"], OFFLOAD_POLICIES["offload_dots"]

    def tpu_like(problem: Problem, schedule: Schedule, offloads: bool) -> tuple[bool, list[Any]]:
        ran.append(schedule)
        if isinstance(schedule, NestedSchedule) and len(schedule.levels) >= 2 and \
                schedule.levels[0].policy == carries and schedule.levels[-1].policy == dots:
            raise probe_module._CompileFailed("INTERNAL: Expected instruction to have shape "
                                              "equal to f32[8,16] (STAND-IN)")
        placed, out = real(problem, schedule, offloads)
        return offloads or placed, out

    monkeypatch.setattr(probe_module, "_run", tpu_like)
    return ran


def _guard(cache: Path | None, env: str = ENV, problem: str = "tiny|abc",
           study: optuna.Study | None = None, notes: list[ProbeChecked] | None = None) -> ProbeGuard:
    study = study or optuna.create_study(directions=["minimize", "minimize"])
    return ProbeGuard(tiny(PROBE_LENGTH), "tpu", study, _Lock(),  # type: ignore[arg-type]
                      VerdictCache(cache, env, problem),
                      None if notes is None else notes.append)


def test_nothing_is_probed_until_a_candidate_uses_a_risky_choice(runs: list[Schedule]) -> None:
    notes: list[ProbeChecked] = []
    guard = _guard(None, notes=notes)
    assert guard.labels == set(OFFLOAD_POLICIES)
    assert guard.allows(PLAIN) and runs == [] and notes == []  # nothing risky: no compile
    assert guard.allows(DOTS)
    assert labels(guard.probed) == ["offload_dots"]  # that choice only, beside the reference
    assert len(runs) == 2 and guard.lines()["offload_dots"].startswith(f"{OFFERED}: ")
    assert [event_line(n) for n in notes] == [
        f"probe: offload_dots: {guard.lines()['offload_dots']}"]
    assert guard.allows(DOTS) and len(runs) == 2  # known: not probed twice
    assert guard.study.user_attrs[PROBE] == guard.lines()


def test_a_combination_is_probed_and_left_out_though_each_choice_passes(
        runs: list[Schedule]) -> None:
    guard = _guard(None)
    assert not guard.allows(BOTH)
    assert labels(guard.probed) == ["offload_carries", "offload_dots", COMBO]
    assert guard.lines()["offload_carries"].startswith(OFFERED)
    assert guard.lines()["offload_dots"].startswith(OFFERED)
    assert guard.lines()[COMBO].startswith(f"{LEFT_OUT}: compile failed (8x8 ")
    assert "STAND-IN" in guard.lines()[COMBO]
    both = guard.verdicts[frozenset({"offload_carries", "offload_dots"})]  # a set, as data
    assert not both.offered and both.source is Source.PROBE and "STAND-IN" in both.why
    combo_run = runs[-1]  # the candidate's own structure at the probe's length
    assert isinstance(combo_run, NestedSchedule) and combo_run.lengths == (8, 8)
    assert guard.refused == frozenset()  # each alone is still offered
    assert guard.refused_combinations == {frozenset({"offload_carries", "offload_dots"})}
    n = len(runs)
    assert not guard.allows(BOTH_DEEPER) and len(runs) == n  # never proposed again
    assert guard.allows(DOTS) and guard.study.user_attrs[PROBE][COMBO] == \
        guard.lines()[COMBO]


def test_verdicts_cost_nothing_twice_on_the_same_platform(
        runs: list[Schedule], tmp_path: Path) -> None:
    cache = tmp_path / "probes.json"
    first = _guard(cache)
    assert not first.allows(BOTH)
    n = len(runs)
    notes: list[ProbeChecked] = []
    again = _guard(cache, notes=notes)  # a new study, the same problem and environment
    assert set(again.lines()) == {"offload_carries", "offload_dots", COMBO}  # read at start
    assert not again.allows(BOTH) and again.allows(DOTS) and len(runs) == n
    assert again.probed == [] and all(v.source is Source.CACHE for v in again.verdicts.values())
    assert all(v.endswith(" (cached)") for v in again.lines().values())
    assert len(notes) == 3 and again.study.user_attrs[PROBE] == again.lines()
    other = _guard(cache, problem="other|def")  # another problem: its compile failure holds
    assert other.lines()[COMBO].startswith(f"{LEFT_OUT}: compile failed")
    assert "[found on tiny]" in other.lines()[COMBO]
    assert not other.allows(BOTH_DEEPER) and labels(other.probed) == []
    assert other.allows(DOTS) and labels(other.probed) == ["offload_dots"]  # probed again
    newer = _guard(cache, env=ENV.replace("jax 0.0.1", "jax 0.0.2"))  # another jax
    assert newer.lines() == {}
    assert not newer.allows(BOTH)
    assert labels(newer.probed) == ["offload_carries", "offload_dots", COMBO]
    data = json.loads(cache.read_text())
    assert set(data) == {ENV, ENV.replace("jax 0.0.1", "jax 0.0.2")}
    assert set(data[ENV][COMBO]) == {"tiny|abc"}


def test_a_combination_that_fails_to_compile_at_full_length_is_left_out(
        runs: list[Schedule]) -> None:
    guard = _guard(None)
    dots_only = {**BOTH, "d2_p0": "nothing"}
    guard.compile_failed(dots_only, "compile failed: INTERNAL: one choice")
    assert guard.lines() == {}  # one choice: the failure may be the schedule's
    guard.compile_failed(BOTH_DEEPER, "compile failed: INTERNAL: two choices")
    assert guard.lines()[COMBO] == (f"{LEFT_OUT}: compile failed: INTERNAL: two choices "
                                     "(in a trial, not the probe)")
    assert not guard.allows(BOTH) and runs == []


def test_an_offload_that_fails_at_an_unroll_above_one_is_left_out_at_that_unroll(
        runs: list[Schedule]) -> None:
    """``offload_dots`` at unroll 2 failed to compile at full length on a TPU v5e though it
    passed its probe at unroll 1: the unroll is a choice of its own there -- not probed
    alone (a probe costs seconds), left out once a trial fails; probed in a combination."""
    unrolled = {**DOTS, "d2_unroll": 2}
    guard = _guard(None)
    assert guard.used(unrolled) == {"offload_dots", "unroll>1"}
    assert guard.used({**PLAIN, "d1_unroll": 2}) == frozenset()  # no offload: nothing risky
    both = {**BOTH, "d2_unroll": 4}  # two choices: probed, at the candidate's unroll
    assert not guard.allows(both)
    assert labels(guard.probed)[-1] == combination(frozenset({*guard.used(BOTH), "unroll>1"}))
    assert isinstance(runs[-1], NestedSchedule) and runs[-1].unroll == 4
    n = len(runs)
    assert guard.allows(unrolled) and "offload_dots" in labels(guard.probed) and len(runs) == n
    guard.compile_failed(unrolled, "compile failed: INTERNAL: async-start")  # a trial's
    label = combination(frozenset({"offload_dots", "unroll>1"}))
    assert guard.lines()[label].startswith(f"{LEFT_OUT}: compile failed: INTERNAL: async")
    assert not guard.allows(unrolled) and not guard.allows({**DOTS, "d2_unroll": 8})
    assert guard.allows(DOTS) and len(runs) == n  # at unroll 1 it stays


def test_the_planner_refuses_what_the_guard_leaves_out_before_compiling_it(
        runs: list[Schedule]) -> None:
    guard = _guard(None)
    problem = tiny(PROBE_LENGTH)
    planner = Planner(problem, 10**6, "tpu", ShortRuns(problem), guard=guard)
    both = [c for c in planner.pool.values() if guard.used(c.params) >= {"offload_carries",
                                                                          "offload_dots"}]
    assert both, "the pool proposes the combination"
    assert not planner.probed(both[0]) and both[0].verdict is Verdict.REFUSED
    assert both[0].compiled is None  # never compiled
    assert all(not planner.probed(c) for c in both)
    plain = next(c for c in planner.pool.values() if not guard.used(c.params))
    assert planner.probed(plain)


def test_a_trial_whose_short_run_failed_to_compile_leaves_its_combination_out(
        runs: list[Schedule]) -> None:
    guard = _guard(None)
    problem = tiny(PROBE_LENGTH)
    planner = Planner(problem, 10**6, "tpu", ShortRuns(problem), guard=guard)
    both = next(c for c in planner.pool.values()
                if guard.used(c.params) == {"offload_carries", "offload_dots"})
    key = both.schedule.key()
    planner.record(both.schedule, Measurement(key, ERROR, "at T'=16: run failed: x",
                                              failed_at="run"))
    assert guard.lines() == {}
    planner.record(both.schedule, Measurement(key, ERROR, "at T'=16: compile failed: INTERNAL",
                                              failed_at="compile"))
    assert guard.lines()[COMBO] == (f"{LEFT_OUT}: at T'=16: compile failed: INTERNAL "
                                     "(in a trial, not the probe)")
    assert not guard.allows(both.params) and runs == []  # never probed: known to fail


def test_where_the_cache_lives() -> None:
    assert cache_path("sqlite:///runs/autoremat.db") == Path("runs/probes.json")
    assert cache_path(None) == Path("runs/probes.json")
    assert cache_path("sqlite:////tmp/x/s.db") == Path("/tmp/x/probes.json")
    assert cache_path("sqlite:///:memory:") is None
    assert cache_path("postgresql+psycopg://u@h/db") == Path("runs/probes.json")


def test_the_cache_can_be_moved_or_turned_off(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "c.json"))
    assert cache_path("sqlite:///runs/a.db") == tmp_path / "c.json"
    monkeypatch.setenv(CACHE_ENV, "off")
    assert cache_path("sqlite:///runs/a.db") is None
    unreadable = VerdictCache(tmp_path, ENV, "p")  # a folder: nothing read, nothing written
    assert unreadable.get("x") is None
    unreadable.put("x", "offered: y")


def test_a_combination_label_keeps_labels_that_hold_a_plus() -> None:
    """The problem's own policies are labelled like ``offload(a,b,+3)`` (``names``)."""
    guard = _guard(None)
    guard.labels = frozenset({"offload(a,b,+3)", "offload_carries"})
    label = combination(guard.labels)
    assert label == "offload(a,b,+3) & offload_carries"
    assert choices_of(label) == guard.labels  # read back from the study or the cache
    both = {"d2_p0": "offload_carries", "d2_p1": "offload(a,b,+3)"}
    guard.compile_failed(both, "compile failed: x")  # in a trial
    assert guard.refused_combinations == {guard.labels} and guard.refused == frozenset()
    assert guard.lines() == {label: f"{LEFT_OUT}: compile failed: x (in a trial, not the probe)"}
    assert not guard.allows({"d2_p0": "offload_carries", "d2_p1": "offload(a,b,+3)"})


def test_the_cache_reuses_a_compile_failure_for_another_problem_and_nothing_else(
        tmp_path: Path) -> None:
    """Read from the verdict's kind (its reason's start, or a trial's compile failure),
    not from the words appearing anywhere in it."""
    path = tmp_path / "probes.json"
    mine = VerdictCache(path, ENV, "tiny|abc")
    mine.put("a", f"{LEFT_OUT}: compile failed (8x8 at T=64): INTERNAL")
    mine.put("b", f"{LEFT_OUT}: run failed (8x8 at T=64): RuntimeError: compile failed here")
    mine.put("c", f"{LEFT_OUT}: at T'=16: compile failed: X (in a trial, not the probe)")
    mine.put("d", f"{OFFERED}: compiles, loss and gradients match (compile failed nowhere)")
    other = VerdictCache(path, ENV, "other|def")
    assert other.get("a") == f"{LEFT_OUT}: compile failed (8x8 at T=64): INTERNAL [found on tiny]"
    assert other.get("b") is None and other.get("d") is None  # probed again there
    assert other.get("c") is not None and "[found on tiny]" in other.get("c")
    assert mine.get("b") == f"{LEFT_OUT}: run failed (8x8 at T=64): RuntimeError: compile " \
                            "failed here"  # its own problem: whatever it says
