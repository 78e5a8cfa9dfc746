"""A lockstep tune: two processes x two CPU devices on JAX's multi-controller runtime.

Each test starts ``tests/lockstep_tune.py`` as real processes (``jax.distributed`` on
127.0.0.1, Gloo's CPU collectives), one global mesh of 4 devices over both. The default
suite keeps one small tune; the comparison with one process of 4 devices and the fault
runs are slow. The combining of figures is checked directly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from autoremat._cli.exits import EXIT_LOST
from autoremat._measure.measurement import ERROR, OK, OVER_BUDGET, Measurement
from autoremat._measure.peers import combine
from tests.env import module_path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "lockstep_tune.py")
#: Seconds a process of a test's tune may take: a hang (processes that never meet in a
#: collective) fails the test instead of blocking the suite.
LIMIT = 300


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(process: int, processes: int, port: int, tmp: Path, *args: str,
           devices: int = 2) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": module_path()}
    env.pop("XLA_FLAGS", None)
    return subprocess.Popen(
        [sys.executable, SCRIPT, str(process), str(processes), str(port),
         f"sqlite:///{tmp}/study{process}.db", str(tmp / f"schedule{process}.yaml"),
         "--devices", str(devices), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(p: subprocess.Popen[str], timeout: float = LIMIT) -> dict[str, Any]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{err[-3000:]}"
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT "):]))


def _lockstep(tmp: Path, *args: str, second: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    port = _port()
    procs = [_start(i, 2, port, tmp, *args, *(second if i else ())) for i in range(2)]
    try:
        return [_result(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_two_processes_tune_in_lockstep(tmp_path: Path) -> None:
    """Both processes return the same pick and figures; process 0 alone writes the study
    and the schedule; every figure is per device of the 4-device global mesh (the batch
    over both processes, parameters and optimizer state FSDP-sharded over them). A
    schedule that fails to build on process 1 alone is a failed trial naming it."""
    first, second = _lockstep(tmp_path, "--trials", "2", "--mesh", "data=2,fsdp=2",
                              second=("--fail-policy", "dots_with_no_batch_dims"))
    assert first["pick"] is not None and first["measured"] == 2
    for key in ("pick", "pick_total", "pick_seconds", "measured", "devices", "mesh"):
        assert second[key] == first[key], key
    assert (first["devices"], first["mesh"]) == (4, "data=2,fsdp=2")
    failed = [t for t in first["trials"] if "dots_with_no_batch_dims" in t[0]]
    assert len(failed) == 1 and failed[0][1] == ERROR, first["trials"]
    assert failed[0][6].startswith("process 1: build failed: RuntimeError: no dots_with_no")
    assert [t[1] for t in first["trials"] if t not in failed] == [OK, OK]
    assert (tmp_path / "schedule0.yaml").exists() and (tmp_path / "study0.db").exists()
    assert not (tmp_path / "schedule1.yaml").exists() and not (tmp_path / "study1.db").exists()


@pytest.mark.slow
def test_lockstep_matches_one_process_of_four_devices(tmp_path: Path) -> None:
    """The trial sequence and per-device memory figures equal one process's on the same
    global shape (4 CPU devices), within 2%."""
    args = ("--trials", "4")
    (tmp_path / "two").mkdir()
    (tmp_path / "one").mkdir()
    lock = _lockstep(tmp_path / "two", *args)
    one = _result(_start(0, 1, 0, tmp_path / "one", *args, devices=4))
    assert [t[0] for t in lock[0]["trials"]] == [t[0] for t in one["trials"]]
    for mine, theirs in zip(lock[0]["trials"], one["trials"], strict=True):
        assert mine[1] == theirs[1]
        for a, b in zip(mine[2:5], theirs[2:5], strict=True):
            assert abs(a - b) <= 0.02 * b, (mine, theirs)


@pytest.mark.slow
def test_a_lost_process_ends_the_other_and_the_study_resumes(tmp_path: Path) -> None:
    """Process 1 killed mid-tune: process 0 exits ``EXIT_LOST`` with a line naming
    process 1 (how soon: ``studies/bench_lockstep.py``); the same command again resumes
    the study (what was measured is not measured again)."""
    heartbeat = 2
    args = ("--trials", "6", "--time-budget", "1", "--heartbeat", str(heartbeat),
            "--print-trials")
    port = _port()
    procs = [_start(i, 2, port, tmp_path, *args) for i in range(2)]
    hung = threading.Timer(LIMIT, lambda: [p.kill() for p in procs])  # ends the read below
    try:
        hung.start()
        assert procs[0].stdout is not None
        for line in procs[0].stdout:
            if line.startswith("TRIAL "):
                break
        else:
            pytest.fail(f"no trial ended on process 0 (exit {procs[0].wait()})")
        hung.cancel()
        os.kill(procs[1].pid, signal.SIGKILL)
        # how soon it ends is a figure of studies/bench_lockstep.py; here: that it ends
        _, err = procs[0].communicate(timeout=60)
    finally:
        hung.cancel()
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[0].returncode == EXIT_LOST, err[-2000:]
    assert "lost process 1 of 2" in err and "resume" in err
    time.sleep(3 * heartbeat + 1)  # the trial under way goes stale (storage's grace)
    first, _ = _lockstep(tmp_path, "--trials", "2", "--heartbeat", str(heartbeat))
    keys = [t[0] for t in first["trials"]]
    assert len(keys) >= 3 and len(set(keys)) == len(keys), keys


def _m(status: str = OK, reason: str = "", **figures: Any) -> Measurement:
    return Measurement("k", status, reason, platform="cpu", **figures)  # type: ignore[arg-type]


def test_combine_takes_the_largest_figure_and_any_failure() -> None:
    mine = _m(total_bytes=100, temp_bytes=40, argument_bytes=60, step_seconds=None)
    both = combine(mine, [(1, _m(total_bytes=120, temp_bytes=30, argument_bytes=60))], 1000)
    assert (both.status, both.total_bytes, both.temp_bytes) == (OK, 120, 40)
    over = combine(mine, [(1, _m(total_bytes=120))], 110)
    assert over.status == OVER_BUDGET and "120 bytes" in over.reason
    failed = combine(mine, [(1, _m()), (2, _m(ERROR, "compile failed: boom",
                                              failed_at="compile"))], 1000)
    assert failed.status == ERROR and failed.reason == "process 2: compile failed: boom"
    assert failed.failed_at == "compile"
    refused = combine(mine, [(1, _m(OVER_BUDGET, "over budget: x", total_bytes=90))], 1000)
    assert refused.status == OVER_BUDGET and refused.reason == "process 1: over budget: x"


def test_coordinator_reads_auto_or_address_processes_index() -> None:
    from autoremat._cli.distributed import check_coordinator, parse_coordinator
    from autoremat._cli.settings import UsageError, check_settings

    assert parse_coordinator("auto") == (None, None, None)
    assert parse_coordinator("10.0.0.2:8476,2,1") == ("10.0.0.2:8476", 2, 1)
    for bad in ("10.0.0.2:8476", "host:port,2,0", "h:1,2,2", "h:1,0,0", 3):
        assert check_coordinator(bad) is not None, bad
    with pytest.raises(UsageError, match=r"--coordinator: expected 'auto' or HOST:PORT"):
        check_settings({"coordinator": "h:1,2,5"})


def test_a_lost_process_interrupts_the_main_thread_and_is_kept_to_raise() -> None:
    """The watcher thread keeps the error and interrupts the main thread (a wait on the
    store returns within a second); ``in_lockstep`` raises the kept error there."""
    from autoremat._search.lockstep import LockstepLost, _Watchdog

    watchdog = _Watchdog.__new__(_Watchdog)  # its store is the job's: not needed here
    watchdog.lost = None
    lost = LockstepLost(1, 2, 0, "no heartbeat for 3.1 s (heartbeat 2 s)")
    timer = threading.Timer(0.1, watchdog.end, (lost,))
    # Python's own SIGINT handling, as a command's process has it: interrupt_main does
    # nothing where an earlier test in this worker left the signal ignored or default
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            for _ in range(300):  # the main thread's waits on the store, a second each at most
                time.sleep(0.1)
    finally:
        signal.signal(signal.SIGINT, before)
    assert watchdog.lost is lost and not isinstance(lost, Exception)  # no trial's failure
    assert str(lost).startswith("lockstep tune: lost process 1 of 2: no heartbeat")
    assert "run the same command on every process to resume it" in str(lost)


def test_the_command_ends_a_lost_tune_with_one_line_and_exit_lost() -> None:
    code = ("from autoremat._cli.exits import end_lost\n"
            "from autoremat._search.lockstep import LockstepLost\n"
            "end_lost(LockstepLost(1, 2, 0, 'no heartbeat'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": module_path()},
                         check=False)
    assert out.returncode == EXIT_LOST == 75
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(
        "autoremat: lockstep tune: lost process 1 of 2: no heartbeat")
    assert out.stderr.rstrip().endswith(f"(exit {EXIT_LOST})")
