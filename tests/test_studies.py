"""studies/device_check.py off an accelerator: it says so and exits 0; its report and one row.

The check itself only measures on a TPU or GPU machine (issue 35); here, on a CPU, only
what does not need one: the no-accelerator exit, the table it writes (from made-up rows,
not measurements) and one row at a tiny T (no device figures on a CPU).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.env import module_path

SCRIPT = Path(__file__).resolve().parents[1] / "studies" / "device_check.py"


def _load() -> ModuleType:
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    return importlib.import_module("device_check")


def test_without_an_accelerator_it_says_so_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={"PYTHONPATH": module_path(), "JAX_PLATFORMS": "cpu",
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "no accelerator here" in proc.stdout and "nothing written" in proc.stdout
    assert not out.exists()


def test_unroll_gain_without_an_accelerator_says_so_and_exits_0(tmp_path: Path) -> None:
    """``studies/unroll_gain.py`` measures only on a device; its plumbing at ``--small`` was
    run on a CPU by hand, and its table on a TPU is ``studies/results/unroll_gain_v5e.md``."""
    out = tmp_path / "unroll_gain.md"
    proc = subprocess.run([sys.executable, str(SCRIPT.parent / "unroll_gain.py"), "--out",
                           str(out)], capture_output=True, text=True, timeout=120, check=False,
                          env={"PYTHONPATH": module_path(), "JAX_PLATFORMS": "cpu",
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "no accelerator here" in proc.stdout and "nothing written" in proc.stdout
    assert not out.exists()


def test_the_report_table(tmp_path: Path) -> None:
    dc = _load()
    report = dc.Report(tmp_path / "tpu.md", ["Run on a made-up device (these rows are not measured)."])
    report.rows = [
        {"kind": "seq2seq", "label": "plain", "seq_len": 10_000, "describe": "10000 none unroll=1",
         "estimate": 986 * 10**6, "measured": 985 * 10**6, "true": 985.088 * 10**6,
         "step_seconds": 0.0612},
        {"kind": "seq2seq", "label": "100x100", "seq_len": 10_000,
         "describe": "100x100 nothing/nothing unroll=1", "estimate": 85.3 * 10**6,
         "measured": None, "true": 85.2 * 10**6, "step_seconds": 0.020},
        {"kind": "last state", "label": "100x100", "seq_len": 10_000, "error": "boom"},
    ]
    report.sections.append(("autoremat tune --budget 4GB", "study: ...\n"))
    report.write()
    text = (tmp_path / "tpu.md").read_text()
    assert ("| seq2seq | 10000 | 10000 none unroll=1 | 986.00 | 985.00 | 985.09 | -0.0% | +0.1% "
            "| 61.2 | 1.00 |") in text
    assert ("| seq2seq | 10000 | 100x100 nothing/nothing unroll=1 | 85.30 | - | 85.20 | - | +0.1% "
            "| 20.0 | 0.33 |") in text
    assert "| last state | 10000 | 100x100 | failed: boom |" in text
    assert "## autoremat tune --budget 4GB" in text
    assert json.loads((tmp_path / "tpu.json").read_text())["rows"][0]["label"] == "plain"


def test_one_row_at_a_tiny_length() -> None:
    dc = _load()
    row = dc.measure_row("last state", dc.schedule_of("100x100", 64), 64)
    assert row["status"] == "ok" and row["describe"] == "8x8 nothing/nothing unroll=1"
    assert row["estimate"] > 0 and row["step_seconds"] > 0
    assert "measured" not in row and "true" not in row  # a CPU reports no memory_stats
    assert dc.schedule_of("root_ne", 10_000).describe() == "100x100 nothing/everything unroll=1"


SEARCH_TPU = Path(__file__).resolve().parents[1] / "studies" / "search_tpu.py"


def _search_tpu(out: Path, stages: str) -> dict[str, Any]:
    """``search_tpu.py --small --allow-cpu --stages ...``: one line per stage, each
    stage's result in the JSON and the Markdown as it finishes; the stages' results."""
    proc = subprocess.run([sys.executable, str(SEARCH_TPU), "--out", str(out), "--allow-cpu",
                           "--small", "--stages", stages],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wanted = stages.split(",")
    printed = [line for line in proc.stdout.splitlines() if line[:1] in wanted
               and line[1:2] == "."]
    assert len(printed) == len(wanted) and not any("FAILED" in line for line in printed)
    found: dict[str, Any] = json.loads((out / "search_tpu.json").read_text())["stages"]
    assert set(found) == set(wanted) and all("error" not in r for r in found.values())
    md = (out / "search_tpu.md").read_text()
    assert all(f"## {k}" in md for k in wanted)
    return found


@pytest.mark.slow
def test_search_tpu_runs_its_stages_at_tiny_sizes_on_a_cpu(tmp_path: Path) -> None:
    """The TPU search script's plumbing (issue 36), at --small sizes on this CPU; stage b
    (two tunes and their grids, 16 s) in the slow test below. Its figures are not
    measurements of anything (the sizes are not the issue's)."""
    out = tmp_path / "results"
    off = subprocess.run([sys.executable, str(SEARCH_TPU), "--out", str(out)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert off.returncode == 0 and "no TPU here" in off.stdout and not out.exists()
    stages = _search_tpu(out, "a,d,e")
    assert stages["a"]["compiles"] >= 1 and stages["a"]["pick"] is not None
    assert set(stages["d"]["probe"]) == {"offload_step", "offload_dots", "offload_carries"}
    assert "loop" in stages["e"]


@pytest.mark.slow
def test_search_tpu_stage_b_tunes_fused_and_unfused_at_tiny_sizes(tmp_path: Path) -> None:
    """Stage b: the seed tuned from its loss and built in, fusion a choice in both, and
    the grid timed fused and unfused."""
    stages = _search_tpu(tmp_path / "results", "b")
    for label in ("from_loss", "built_in"):
        b = stages["b"][label]
        assert b["pick"] is not None and b["fuse"] in (True, False)
        assert {row["fused"] for row in b["grid"]} == {True, False}
    assert "target 1.05x" in (tmp_path / "results" / "search_tpu.md").read_text()


TUNE_TIME = Path(__file__).resolve().parents[1] / "studies" / "tune_time.py"


def test_tune_time_says_where_the_seconds_around_the_device_went() -> None:
    """``tune_time.main_thread`` on a made-up timeline: a compile whose entry was written
    at 2.0 s and handed back at 3.0 s (sized 1 s late), timed from 3.5 s to 4.0 s, recorded
    at 4.6 s (a gap of 0.6 s); the next timing starts at 5.0 s, after a compile ending at
    4.8 s (a wait of 0.4 s, 0.2 s of it with the compile there)."""
    if str(TUNE_TIME.parent) not in sys.path:
        sys.path.insert(0, str(TUNE_TIME.parent))
    tune_time = importlib.import_module("tune_time")
    events = [
        {"event": "cache_put", "t": 2.0, "thread": "c0"},
        {"event": "compile", "start": 1.0, "t": 3.0, "thread": "c0", "label": "a"},
        {"event": "timing", "start": 3.5, "t": 4.0, "label": "a"},
        {"event": "trial", "t": 4.6},
        {"event": "compile", "start": 3.0, "t": 4.8, "thread": "c1", "label": "b"},
        {"event": "timing", "start": 5.0, "t": 5.2, "label": "b"},
        {"event": "trial", "t": 5.5},
    ]
    got = tune_time.main_thread(events)
    assert got == pytest.approx({"gaps_s": 0.9, "waits_s": 0.4, "before_timing_s": 0.7,
                                 "sized_late_s": 1.0})


@pytest.mark.slow
def test_tune_time_breaks_tunes_into_phases_at_tiny_sizes_on_a_cpu(tmp_path: Path) -> None:
    """The tune-time benchmark's plumbing (issue 47), at --small sizes on this CPU: CLI
    runs as fresh processes (two of the three cases: the built-in problem and a user's),
    each broken into phases from its time-stamped lines and events, with where its
    compiles and timings ran. Its figures are not measurements of anything (the sizes are
    not the issue's)."""
    out = tmp_path / "results" / "tune_time.md"
    off = subprocess.run([sys.executable, str(TUNE_TIME), "--out", str(out)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert off.returncode == 0 and "no TPU here" in off.stdout and not out.exists()
    proc = subprocess.run([sys.executable, str(TUNE_TIME), "--out", str(out), "--small",
                           "--cases", "a,c"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = [line for line in proc.stdout.splitlines() if line[:2] in ("a.", "b.", "c.")]
    assert len(printed) == 2, proc.stdout
    cases = json.loads(out.with_suffix(".json").read_text())["cases"]
    assert [c["case"] for c in cases] == ["a", "c"]
    for c in cases:
        assert c["exit"] == 0, c
        assert c["first_line_s"] <= c["startup_s"] <= c["written_s"] <= c["total_s"]
        assert c["trials"] == 1 and c["compiles"] >= 1 and c["oom_compiles"] == 0
        assert c["probes"] == 0 and c["lost_to_compile_failures"] == 0  # a CPU probes nothing
        assert c["study_line"].startswith("study: ") and c["pick"] is not None
        assert c["timings"] == 1 and c["timed_runs"] >= 1 and c["compile_threads_s"] == 0
        assert c["pool"]["threads"] == 0  # a CPU compiles on the main thread only
        assert {e["event"] for e in c["timeline"]} >= {"compile", "timing", "trial"}
    md = out.read_text()
    assert "| a. big |" in md and "| c. unmodified |" in md and "## c. unmodified" in md
    assert "- device: 1 timings, " in md and "compiles ahead: threads 0" in md


def test_storage_gil_writes_the_same_trial_both_ways(tmp_path: Path) -> None:
    """``studies/storage_gil.py``'s two ways of a trial's storage work (Optuna's own
    writers and whole-study reads; the search's) leave the same trial behind: the same
    attrs, params and constraint."""
    import optuna

    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    gil = importlib.import_module("storage_gil")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    raw = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'a.db'}")
    study = optuna.create_study(storage=raw, directions=["minimize", "minimize"])
    study_id = raw.get_study_id_from_name(study.study_name)
    for after in (False, True):
        gil._trial(study, raw, study_id, after)
    before, after = optuna.load_study(study_name=study.study_name, storage=raw).trials
    assert before.user_attrs == after.user_attrs == {**gil.CLAIM, **gil.FIGURES}
    assert before.params == after.params and len(before.params) == len(gil._params())
    assert before.system_attrs == after.system_attrs
    times = gil.measure(trials=1, threads=0, repeats=1)
    assert [len(v) for v in times.values()] == [1, 1] and all(
        t > 0 for v in times.values() for t in v)
