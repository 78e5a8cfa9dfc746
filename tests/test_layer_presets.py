"""studies/layer_presets.py off an accelerator: it says so; at a tiny size on the CPU
(--small --allow-cpu) every stage runs and writes its table (``-m slow``). CPU figures,
not a result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "studies" / "layer_presets.py"


def test_without_an_accelerator_it_says_so(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "no accelerator here" in proc.stdout and not (tmp_path / "r").exists()


@pytest.mark.slow  # two runs of every stage, 22 s: issue 45's study, its results recorded
def test_every_stage_at_a_tiny_size(tmp_path: Path) -> None:
    out = tmp_path / "r"
    argv = [sys.executable, str(SCRIPT), "--out", str(out), "--small", "--allow-cpu",
            "--presets", "full,save_qkv_proj,flax_remat", "--budgets", "1GB", "--trials", "1",
            "--time-budget", "0.1", "--deadline", "300"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((out / "layer_presets.json").read_text())
    assert list(data["presets"]) == ["full", "save_qkv_proj", "flax_remat"]
    assert all(r["status"] == "ok" and r["total_bytes"] > 0 for r in data["presets"].values())
    (tune,) = data["tunes"].values()
    assert tune["budget_bytes"] == 10**9 and tune["pick"]["status"] == "ok"
    check = data["check"]
    assert set(check) == {"sizes", "full", "save_qkv_proj", "flax_remat", "pick at 1,000.0 MB"}
    assert all(r["max_rel_diff"] < 1e-5 for k, r in check.items() if k != "sizes")
    table = (out / "layer_presets.md").read_text()
    assert "| save_qkv_proj | remat_policy=save_qkv_proj |" in table
    assert "| 1,000.0 MB | full, save_qkv_proj, flax_remat |" in table
    # a second run finds every stage done and measures nothing again
    again = subprocess.run(argv, capture_output=True, text=True, timeout=200, check=False)
    assert again.returncode == 0 and "] preset " not in again.stdout
    assert "] tune at " not in again.stdout
