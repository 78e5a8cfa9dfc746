"""``--out`` is never half-written: killed during the write, or two writers at once."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import autoremat
from autoremat._schedules import dump_schedule, read_schedule, save_schedule
from autoremat._search.tune import tune
from tests.env import module_path
from tests.tiny_problem import tiny

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """A two-trial study of the tiny problem: ``(storage URL, best trial number)``."""
    folder = tmp_path_factory.mktemp("study")
    storage = f"sqlite:///{folder / 'study.db'}"
    with contextlib.chdir(folder):
        result = tune(tiny(), 10**6, n_trials=2, time_budget=0.02, storage=storage,
                      study_name="s")
    assert result.best_trial is not None
    return storage, result.best_trial.number


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": module_path()}
    env.pop("AUTOREMAT_STORAGE", None)
    return env


# `autoremat export` whose write of --out stops halfway (the first half written and
# flushed to the temp file), says so, and sleeps there until it is killed.
STALLED_EXPORT = """
import os, sys, time
import autoremat._atomic as atomic
real_fdopen = os.fdopen

class Stalls:
    def __init__(self, fh, path):
        self.fh, self.path = fh, path
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return self.fh.__exit__(*exc)
    def write(self, text):
        self.fh.write(text[: len(text) // 2])
        self.fh.flush()
        os.fsync(self.fh.fileno())
        print("HALF", self.path, flush=True)
        time.sleep(600)
    def __getattr__(self, name):
        return getattr(self.fh, name)

def fdopen(fd, *args, **kwargs):
    fh = real_fdopen(fd, *args, **kwargs)
    target = os.readlink(f"/proc/self/fd/{fd}")
    return Stalls(fh, target) if os.path.basename(target).startswith(".s.yaml.") else fh

atomic.os.fdopen = fdopen
from autoremat.cli import main
sys.exit(main(sys.argv[1:]))
"""


def export(cwd: Path, storage: str, trial: int, out: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "autoremat.cli", "export", str(trial), "--out", out, "--storage",
         storage, "--study-name", "s"], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def test_killed_while_writing_out_leaves_the_previous_file(
    tmp_path: Path, study: tuple[str, int]
) -> None:
    storage, best = study
    r = export(tmp_path, storage, best, "s.yaml")
    assert r.wait(timeout=120) == 0, r.communicate()
    before = (tmp_path / "s.yaml").read_bytes()
    other = 1 - best

    p = subprocess.Popen(
        [sys.executable, "-c", STALLED_EXPORT, "export", str(other), "--out", "s.yaml",
         "--storage", storage, "--study-name", "s"],
        cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()  # blocks until the write is half done
    assert line.startswith("HALF "), (line, p.stderr.read() if p.poll() is not None else "")
    temp = Path(line.split(" ", 1)[1].strip())
    os.kill(p.pid, signal.SIGKILL)
    p.communicate(timeout=30)

    assert (tmp_path / "s.yaml").read_bytes() == before  # untouched: old and complete
    assert read_schedule(tmp_path / "s.yaml").meta["trial"] == best
    half = temp.read_text()  # the kill did land mid-write: the temp file is the proof
    assert 0 < len(half) < len(before) + 200
    r = export(tmp_path, storage, other, "s.yaml")
    assert r.wait(timeout=120) == 0, r.communicate()
    assert read_schedule(tmp_path / "s.yaml").meta["trial"] == other


WRITER = """
import sys
from autoremat._schedules import nested, save_schedule
path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
big = {"pad": ["x" * 100] * 80}  # ~8 KB per file
schedules = [nested([4, 8], unroll=1 + i % 4, meta={"writer": tag, "i": i, **big})
             for i in range(8)]
print("READY", flush=True)
i = 0
while n == 0 or i < n:
    save_schedule(schedules[i % 8], path)
    i += 1
"""


def test_random_kills_during_writes_never_leave_a_broken_file(tmp_path: Path) -> None:
    out = tmp_path / "s.yaml"
    save_schedule(autoremat.plain(5), out)
    rng = random.Random(7)
    for _ in range(12):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(out), "k", "0"], env=_env(),
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline() == "READY\n"
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(p.pid, signal.SIGKILL)
        p.communicate(timeout=30)
        schedule = read_schedule(out)  # complete and valid, whenever the kill came
        assert schedule.key() in {autoremat.plain(5).key(),
                                  *(autoremat.nested([4, 8], unroll=u).key() for u in (1, 2, 3, 4))}


def test_two_writers_of_one_out_leave_one_valid_file(tmp_path: Path) -> None:
    out = tmp_path / "s.yaml"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(out), tag, "100"], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for tag in ("a", "b")]
    for p in procs:
        assert p.stdout.readline() == "READY\n"
    seen = set()
    while any(p.poll() is None for p in procs):  # read while both replace it
        if out.exists():
            schedule = read_schedule(out)
            seen.add(schedule.meta["writer"])
            assert dump_schedule(schedule).count("\n") > 80
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    final = read_schedule(out)
    assert final.meta["writer"] in {"a", "b"} and final.meta["i"] == 99 % 8  # a last write
    assert seen <= {"a", "b"} and seen
    assert [f.name for f in tmp_path.iterdir()] == ["s.yaml"]  # no temp files left


def test_two_exports_to_one_out_leave_one_of_them(tmp_path: Path, study: tuple[str, int]) -> None:
    procs = [export(tmp_path, study[0], n, "same.yaml") for n in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    final = read_schedule(tmp_path / "same.yaml")
    assert final.meta["trial"] in (0, 1)
    assert [f.name for f in tmp_path.iterdir()] == ["same.yaml"]  # no temp file left
