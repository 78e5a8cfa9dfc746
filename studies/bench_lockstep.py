"""A lockstep tune on 2 processes x 2 CPU devices against one process of 4 devices.

Every run is the real command, ``autoremat tune --coordinator 127.0.0.1:PORT,2,I`` started
once per process (Gloo's CPU collectives; 2 forced CPU devices each: one global mesh of
4), or ``autoremat tune`` alone on 4 forced devices. Three checks:

1. ``--mesh data=4``: the pick, the trials in order and their per-device memory, and the
   wall time of the lockstep tune against the one-process tune of the same global shape;
2. process 1 killed (SIGKILL) once a trial is recorded: how long process 0 takes to end
   and what it prints; then the same commands again resume the study;
3. ``--mesh fsdp=4`` across the two processes: each seed's step time against the plain
   scan's, with the all-gathers in its compiled program (one process of 4 devices
   compiles the same per-device program to count them).

    flock /tmp/autoremat-heavy.lock python studies/bench_lockstep.py   # minutes on 2 CPUs

Writes ``studies/results/lockstep.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autoremat._atomic import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(devices: int) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    env.pop("AUTOREMAT_STORAGE", None)
    return env


def _start(cwd: Path, args: list[str], processes: int, index: int,
           port: int) -> subprocess.Popen[str]:
    more = [] if processes == 1 else ["--coordinator", f"127.0.0.1:{port},{processes},{index}"]
    return subprocess.Popen(
        [sys.executable, "-m", "autoremat.cli", "tune", "--no-progress", *args, *more],
        cwd=cwd, env=_env(4 // processes), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def tune(cwd: Path, args: list[str], processes: int) -> tuple[float, list[str]]:
    """Wall seconds of the whole job and each process's stdout."""
    cwd.mkdir(parents=True, exist_ok=True)
    port, start = _port(), time.monotonic()
    procs = [_start(cwd, args, processes, i, port) for i in range(processes)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"exit {p.returncode}\n{out}\n{err[-3000:]}")
        outs.append(out)
    return time.monotonic() - start, outs


def trials(cwd: Path) -> list[dict[str, Any]]:
    """The study's measured trials, in order, with their figures."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{cwd / 'runs' / 'autoremat.db'}"
    name = optuna.get_all_study_names(storage)[0]
    study = optuna.load_study(study_name=name, storage=storage)
    return [dict(t.user_attrs, number=t.number) for t in study.trials
            if t.user_attrs.get("measured")]


def _short(key: str) -> str:
    from autoremat._schedules import from_data
    from autoremat._schedules.safe_yaml import load_yaml_text

    return str(from_data(load_yaml_text(key)).describe())


def _ms(x: Any) -> str:
    return "-" if x is None else f"{1e3 * x:.1f}"


def check_same_pick(tmp: Path, args: list[str]) -> list[str]:
    lock_wall, lock_out = tune(tmp / "two", args, 2)
    one_wall, one_out = tune(tmp / "one", args, 1)
    two, one = trials(tmp / "two"), trials(tmp / "one")
    rows = ["| trial | schedule | bytes/device, 2x2 | bytes/device, 1x4 | diff | step ms, 2x2 "
            "| step ms, 1x4 |", "|---|---|---|---|---|---|---|"]
    for a, b in zip(two, one, strict=False):
        same = a["schedule_key"] == b["schedule_key"]
        diff = (abs(a["total_bytes"] - b["total_bytes"]) / b["total_bytes"]
                if same and a.get("total_bytes") and b.get("total_bytes") else None)
        rows.append(f"| {a['number']} | {_short(a['schedule_key'])}"
                    f"{'' if same else ' (1x4: ' + _short(b['schedule_key']) + ')'} | "
                    f"{a.get('total_bytes')} | {b.get('total_bytes')} | "
                    f"{'-' if diff is None else f'{100 * diff:.2f}%'} | "
                    f"{_ms(a.get('step_seconds'))} | {_ms(b.get('step_seconds'))} |")
    picks = [next((x.strip() for x in out.splitlines() if x.strip().startswith("best (")), "?")
             for out in (lock_out[0], one_out[0])]
    order = [t["schedule_key"] for t in two] == [t["schedule_key"] for t in one[:len(two)]]
    return [f"`autoremat tune {' '.join(args)}`", "",
            f"* wall: 2 processes x 2 devices {lock_wall:.1f} s, 1 process x 4 devices "
            f"{one_wall:.1f} s (ratio {lock_wall / one_wall:.2f})",
            f"* pick, 2x2: `{picks[0]}`", f"* pick, 1x4: `{picks[1]}`",
            f"* the trials in the same order: {order}",
            "", *rows]


def _measured(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=1) as c:
            row = c.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0])


def check_lost_process(tmp: Path, args: list[str], heartbeat: int) -> list[str]:
    cwd = tmp / "fault"
    cwd.mkdir(parents=True)
    port = _port()
    procs = [_start(cwd, [*args, "--heartbeat", str(heartbeat)], 2, i, port) for i in range(2)]
    while _measured(cwd / "runs" / "autoremat.db") < 1:
        time.sleep(0.2)
    os.kill(procs[1].pid, signal.SIGKILL)
    killed = time.monotonic()
    _, err = procs[0].communicate(timeout=600)
    ended = time.monotonic() - killed
    procs[1].wait()
    line = next((x for x in err.splitlines() if "lost process" in x), "(no line)")
    before = len(trials(cwd))
    time.sleep(3 * heartbeat + 1)  # the trial under way goes stale (storage's grace)
    tune(cwd, [*args, "--heartbeat", str(heartbeat)], 2)
    after = trials(cwd)
    keys = [t["schedule_key"] for t in after]
    return [f"`autoremat tune {' '.join(args)} --heartbeat {heartbeat}` on 2 processes; "
            "process 1 killed (SIGKILL) once a trial was recorded:", "",
            f"* process 0 exited {procs[0].returncode} after {ended:.1f} s "
            f"(2 x heartbeat = {2 * heartbeat} s), printing:", "", "```", line, "```", "",
            f"* the study held {before} measured trials; the same commands again: "
            f"{len(after)} measured, none twice ({len(set(keys)) == len(keys)})"]


def all_gathers(mesh: str, seq_len: int, hidden: int, keys: list[str]) -> dict[str, int]:
    """All-gathers in each schedule's compiled program on one process of 4 devices."""
    code = (
        "import sys, json, jax, autoremat\n"
        "from autoremat._schedules import from_data\n"
        "from autoremat._schedules.safe_yaml import load_yaml_text\n"
        f"p = autoremat.seed_lstm(seq_len={seq_len}, hidden={hidden}, mesh={mesh!r})\n"
        "out = {}\n"
        "for k in json.loads(sys.stdin.read()):\n"
        "    step, args = p.build(from_data(load_yaml_text(k)))\n"
        "    text = jax.jit(step).lower(*args).compile().as_text()\n"
        "    out[k] = sum(1 for line in text.splitlines() if ' all-gather(' in line "
        "or ' all-gather-start(' in line)\n"
        "print(json.dumps(out))\n")
    import json

    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(keys), text=True,
                          capture_output=True, env=_env(4), check=True, timeout=1800)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def check_fsdp(tmp: Path, args: list[str], seq_len: int, hidden: int) -> list[str]:
    wall, _ = tune(tmp / "fsdp", args, 2)
    got = trials(tmp / "fsdp")
    gathers = all_gathers("fsdp=4", seq_len, hidden, [t["schedule_key"] for t in got])
    plain = next((t for t in got if "policy: none" in t["schedule_key"]
                  and t["schedule_key"].count("length") == 1), None)
    base = None if plain is None else plain.get("step_seconds")
    rows = ["| trial | schedule | bytes/device | step ms | vs plain | all-gathers |",
            "|---|---|---|---|---|---|"]
    for t in got:
        s = t.get("step_seconds")
        rows.append(f"| {t['number']} | {_short(t['schedule_key'])} | {t.get('total_bytes')} | "
                    f"{_ms(s)} | {'-' if s is None or not base else f'{s / base:.2f}x'} | "
                    f"{gathers.get(t['schedule_key'])} |")
    return [f"`autoremat tune {' '.join(args)}` on 2 processes x 2 devices ({wall:.0f} s):",
            "", *rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "studies" / "results" / "lockstep.md"))
    ap.add_argument("--seq-len", type=int, default=500)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--budget", default="8MB")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--heartbeat", type=int, default=4)
    a = ap.parse_args()
    base = ["--seq-len", str(a.seq_len), "--hidden", str(a.hidden), "--budget", a.budget,
            "--trials", str(a.trials), "--time-budget", "1"]
    lines = ["# Lockstep tune: 2 processes x 2 CPU devices against 1 process x 4", "",
             "`python studies/bench_lockstep.py` (one 2-core machine shared with other work; "
             "Gloo's CPU collectives between the two processes).", ""]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for title, check in (
                ("Same pick, memory, wall time",
                 lambda: check_same_pick(tmp, [*base, "--mesh", "data=4"])),
                ("A process lost mid-tune",
                 lambda: check_lost_process(tmp, [*base, "--mesh", "data=4"], a.heartbeat)),
                ("FSDP across the two processes",
                 lambda: check_fsdp(tmp, [*base, "--mesh", "fsdp=4"], a.seq_len, a.hidden))):
            lines += [f"## {title}", "", *check(), ""]
            atomic_write_text(Path(a.out), "\n".join(lines))  # each check as it is done
            print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
