"""studies/gpu_check.py off a GPU: it says so and exits 0; its report and one row's worker.

The check itself only measures on a GPU machine (issue 30); here, on a CPU, only what
does not need one: the no-GPU exit, the table it writes (from made-up rows, not
measurements) and the row worker at a tiny T.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[1] / "studies" / "gpu_check.py"


def _load() -> ModuleType:
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    return importlib.import_module("gpu_check")


def test_without_a_gpu_it_says_so_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "no GPU here" in proc.stdout and "nothing written" in proc.stdout
    assert not out.exists()


def test_the_report_table(tmp_path: Path) -> None:
    gc = _load()
    report = gc.Report(tmp_path, ["Run on a made-up device (these rows are not measured)."],
                       10_000)
    report.rows = [
        {"kind": "seq2seq", "label": "plain", "describe": "10000 none unroll=1",
         "total_bytes": 750 * 10**6, "runtime_peak_bytes": 760 * 10**6,
         "compile_scratch_bytes": 118 * 10**6, "process_peak_end": 900 * 10**6,
         "step_seconds": 0.4, "evaluations": 20_000},
        {"kind": "seq2seq", "label": "100x100", "describe": "100x100 nothing/nothing unroll=1",
         "total_bytes": 137 * 10**6, "runtime_peak_bytes": None, "step_seconds": 0.6,
         "evaluations": 30_000},
        {"kind": "seq2seq", "label": "binomial s=11, static backward",
         "describe": "binomial s=11 backward=static unroll=1", "total_bytes": 122 * 10**6,
         "step_seconds": 1.5, "evaluations": 63_813},
        {"kind": "last state", "label": "100x100", "error": "exit 1: boom"},
    ]
    report.sections.append(("autoremat tune --budget 4GB", "study: ...\n"))
    report.write()
    text = (tmp_path / "gpu.md").read_text()
    assert ("| seq2seq | 10000 none unroll=1 | 750.0 MB | 760.0 MB | +1.3% | 118.0 MB | "
            "900.0 MB | 0.400 | 1.00 | 2.00 | 1.00 |") in text
    assert ("| seq2seq | 100x100 nothing/nothing unroll=1 | 137.0 MB | - | - | - | - | 0.600 | "
            "1.50 | 3.00 | 1.00 |") in text
    # 1.5 s / 63,813 evaluations against 0.6 s / 30,000
    assert "| 1.500 | 3.75 | 6.38 | 1.18 |" in text
    assert "| last state | 100x100 | failed: exit 1: boom |" in text
    assert "## autoremat tune --budget 4GB" in text
    assert json.loads((tmp_path / "gpu.json").read_text())["rows"][0]["label"] == "plain"


def test_one_row_worker_at_a_tiny_length(tmp_path: Path) -> None:
    gc = _load()
    result = tmp_path / "row.json"
    gc.row_main("last state", "100x100", 64, result)
    row = json.loads(result.read_text())
    assert row["status"] == "ok" and row["describe"] == "8x8 nothing/nothing unroll=1"
    assert row["total_bytes"] > 0 and row["step_seconds"] > 0
    assert row["runtime_peak_bytes"] is None  # a CPU reports no memory_stats


def test_the_binomial_rows_schedules() -> None:
    """The fused rows try the binomial backward as loops and static, with and without
    command buffers (the search's ``graph_loops``)."""
    gc = _load()
    from autoremat._search.space import COMPILER_CHOICES

    graphs = COMPILER_CHOICES["graph_loops"]
    got = {name: gc.schedule_of(name, 10_000) for _, _, name in gc.ROWS + gc.VARIANTS
           if "binomial" in name}
    assert got["binomial11"].describe() == "binomial s=11 unroll=1"
    assert got["binomial11_static"].to_data()["backward"] == "static"
    assert dict(got["binomial11_graphs"].compiler_options) == graphs
    assert got["binomial11_static_graphs"] == gc.schedule_of("binomial11_static", 10).with_options(
        **graphs)


SEARCH_TPU = Path(__file__).resolve().parents[1] / "studies" / "search_tpu.py"


def test_search_tpu_runs_every_stage_at_tiny_sizes_on_a_cpu(tmp_path: Path) -> None:
    """The TPU search script's plumbing (issue 36), at --small sizes on this CPU: one
    line per stage, each stage's result in the JSON and the Markdown as it finishes.
    Its figures are not measurements of anything (the sizes are not the issue's)."""
    out = tmp_path / "results"
    off = subprocess.run([sys.executable, str(SEARCH_TPU), "--out", str(out)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert off.returncode == 0 and "no TPU here" in off.stdout and not out.exists()
    proc = subprocess.run([sys.executable, str(SEARCH_TPU), "--out", str(out), "--allow-cpu",
                           "--small", "--stages", "a,b,d,e"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = [line for line in proc.stdout.splitlines() if line[:2] in ("a.", "b.", "d.", "e.")]
    assert len(printed) == 4 and not any("FAILED" in line for line in printed), proc.stdout
    data = json.loads((out / "search_tpu.json").read_text())
    stages = data["stages"]
    assert set(stages) == {"a", "b", "d", "e"}
    assert all("error" not in r for r in stages.values())
    assert stages["a"]["compiles"] >= 1 and stages["a"]["pick"] is not None
    for label in ("from_loss", "built_in"):  # fusion was a choice in both
        b = stages["b"][label]
        assert b["pick"] is not None and b["fuse"] in (True, False)
        assert {row["fused"] for row in b["grid"]} == {True, False}
    assert set(stages["d"]["probe"]) == {"offload_step", "offload_dots", "offload_carries"}
    assert "loop" in stages["e"]
    md = (out / "search_tpu.md").read_text()
    assert all(f"## {k}" in md for k in "abde") and "target 1.05x" in md
