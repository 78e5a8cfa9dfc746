"""Many devices: the scan under sharding, per-device figures, the mesh in the record.

The multi-device checks run on 4 forced CPU devices in subprocesses (this
process keeps its one device): ``tests/mesh_checks.py`` compiles every
front-end x way of sharding x schedule kind once, and the command line tunes
on ``--mesh data=4``.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import pytest
import yaml

import autoremat
from autoremat.cli import main
from tests.env import module_path

ROOT = Path(__file__).resolve().parents[1]
FOUR = "--xla_force_host_platform_device_count=4"
FRONTS = ("scan", "linen", "nnx")
CONTEXTS = ("jit_data", "jit_fsdp", "shard_map", "pmap")
#: The scan front in CI; Flax's fronts (the same builders inside ``nn.scan``/``nnx.scan``,
#: 15 s more of subprocess) with ``-m slow``.
CASES = [(f, c, k) if f == "scan" else pytest.param(f, c, k, marks=pytest.mark.slow)
         for f in FRONTS for c in CONTEXTS
         for k in (("plain", "nested", "binomial", "binomial_static") if f == "scan"
                   else ("nested", "binomial"))]


def _env(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = module_path()
    flags = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f != FOUR)
    env["XLA_FLAGS"] = f"{flags} {FOUR}".strip() if devices == 4 else flags
    return env


def _checked(tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str,
             args: list[str]) -> dict[Any, dict[str, Any]]:
    """Every record ``mesh_checks.py args`` printed, by ``(front, context, kind)`` or check
    name. Run once per test run: the xdist workers that need it share its output (a file
    ``name`` beside their temporary folders, behind a lock)."""
    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent
    printed = shared / f"{name}.jsonl"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker runs it, the others wait
        if not printed.exists():
            out = subprocess.run([sys.executable, str(ROOT / "tests" / "mesh_checks.py"), *args],
                                 capture_output=True, text=True, timeout=600, env=_env(4),
                                 check=False)
            assert out.returncode == 0, out.stderr[-3000:]
            printed.write_text(out.stdout)
    found: dict[Any, dict[str, Any]] = {}
    for line in printed.read_text().splitlines():
        r = json.loads(line)
        found[r["check"] if "check" in r else (r["front"], r["context"], r["kind"])] = r
    return found


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory,
            worker_id: str) -> dict[Any, dict[str, Any]]:
    """The seed problem's checks and the scan front's records (23 s)."""
    return _checked(tmp_path_factory, worker_id, "mesh_checks", ["scan"])


@pytest.fixture(scope="module")
def flax_records(tmp_path_factory: pytest.TempPathFactory,
                 worker_id: str) -> dict[Any, dict[str, Any]]:
    """The Flax fronts' records (``-m slow``)."""
    return _checked(tmp_path_factory, worker_id, "mesh_checks_flax",
                    ["--fronts-only", "linen", "nnx"])


@pytest.mark.parametrize(("front", "context", "kind"), CASES)
def test_values_gradients_and_collectives_match_the_plain_scan(
        request: pytest.FixtureRequest, front: str, context: str, kind: str) -> None:
    r = request.getfixturevalue("records" if front == "scan" else "flax_records")[
        (front, context, kind)]
    assert r["error"] == "" and r["mismatch"] == "", r
    got, plain = r["collectives"], r["plain_collectives"]
    # Nothing new is communicated, and nothing more in any loop (run every time step).
    assert set(got["shapes"]) <= set(plain["shapes"]), r
    assert got["in_loop"] == plain["in_loop"], r
    if context == "jit_fsdp":
        # A schedule's recomputing forward pass gathers the FSDP parameters it reads
        # again, outside the loops (as ZeRO-3's backward does): the same gathers, once
        # more per step; every other collective is the plain scan's. The static
        # binomial backward compiles the re-advanced step once per branch, and each
        # copy's gathers are hoisted out of the loops on their own (12 vs 6 here):
        # more gathers per training step, none per time step.
        if kind != "binomial_static":
            assert got["total"]["all-gather"] <= 2 * plain["total"]["all-gather"], r
        assert {k: v for k, v in got["total"].items() if k != "all-gather"} == {
            k: v for k, v in plain["total"].items() if k != "all-gather"}, r
    else:
        assert got["total"] == plain["total"], r


@pytest.mark.parametrize("check", [
    "argument_bytes None", "argument_bytes data=4", "argument_bytes data=2,fsdp=2",
    "sharding data=4", "fingerprints differ by mesh", "stale names both meshes",
    "StaleScheduleWarning"])
def test_the_seed_problem_on_a_mesh(records: dict[Any, dict[str, Any]], check: str) -> None:
    assert records[check]["ok"], records[check]["detail"]


def test_tune_on_a_mesh_writes_per_device_figures_and_show_elsewhere_is_stale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The tune runs on 4 forced CPU devices (a process of its own); what reads its
    record -- pareto, show -- runs in this process, which has 1 device."""
    tuned = subprocess.run(
        [sys.executable, "-m", "autoremat.cli", "tune", "--mesh", "data=4", "--budget", "50MB",
         "--seq-len", "24", "--hidden", "8", "--trials", "1", "--time-budget", "0.05",
         "--no-progress", "--storage", "sqlite:///m.db"],
        cwd=tmp_path, capture_output=True, text=True, timeout=400, env=_env(4), check=False)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    assert "per device, 4 devices, mesh data=4" in tuned.stdout
    budget_line = next(ln for ln in tuned.stdout.splitlines() if ln.startswith("budget: "))
    assert "per device" in budget_line
    meta = yaml.safe_load((tmp_path / "schedule.yaml").read_text())["meta"]
    assert meta["mesh"] == "data=4" and meta["devices"] == 4
    assert meta["argument_sharding"] == {"params": "replicated", "opt_state": "replicated",
                                         "x": "sharded", "y": "sharded"}
    assert sum(meta["argument_parts"].values()) == meta["argument_bytes"]

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOREMAT_STORAGE", raising=False)
    assert jax.device_count() == 1
    assert main(["pareto", "--storage", "sqlite:///m.db"]) == 0  # the study's record
    assert "per device, 4 devices, mesh data=4" in capsys.readouterr().out

    assert main(["show", "schedule.yaml"]) == 1
    shown = capsys.readouterr().out
    assert "figures per device, 4 devices, mesh data=4" in shown
    assert "stale here: tuned per device on 4 devices, mesh data=4, this run has 1 device" \
        in shown
    assert main(["show", "schedule.yaml", "--problem", "seed_lstm", "--seq-len", "24",
                 "--hidden", "8", "--batch", "12"]) == 1
    assert "mesh data=4" in capsys.readouterr().out


def test_bad_mesh_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--mesh", "model=4", "--trials", "1"]) == 2
    assert "--mesh: expected axis=N[,axis=N] over the axes data and fsdp" in capsys.readouterr().err
    with pytest.raises(autoremat.ProblemError, match="needs 4 devices, this process has 1"):
        autoremat.seed_lstm(seq_len=8, mesh="data=4")


def test_tune_on_many_processes_needs_jax_distributed(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """Many processes tune in lockstep (``tests/test_lockstep.py``) through
    ``jax.distributed``; without it, one clear error."""
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    problem = autoremat.Problem("never built", 8, lambda schedule: (lambda: 0.0, ()))
    with pytest.raises(autoremat.TuneError, match=r"call jax.distributed.initialize\(\) first"):
        autoremat.tune(problem, 10**9, n_trials=1, storage=f"sqlite:///{tmp_path}/x.db")


def test_peak_is_the_largest_over_every_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoremat._measure.device_memory import process_peak

    class Device:
        platform = "gpu"

        def __init__(self, stats: dict[str, int] | None) -> None:
            self.stats = stats

        def memory_stats(self) -> dict[str, int] | None:
            return self.stats

    devices = [Device({"bytes_in_use": 1, "peak_bytes_in_use": 5}), Device(None),
               Device({"bytes_in_use": 1, "peak_bytes_in_use": 9})]
    monkeypatch.setattr(jax, "local_devices", lambda: devices)
    assert process_peak() == 9
    monkeypatch.setattr(jax, "local_devices", lambda: [Device(None)])
    assert process_peak() is None
