"""One process of a lockstep tune on CPU devices, for ``tests/test_lockstep.py``.

``python tests/lockstep_tune.py PROCESS PROCESSES PORT STORAGE OUT [options]``: with more
than one process, ``jax.distributed.initialize`` on 127.0.0.1:PORT with Gloo's CPU
collectives; every process tunes the built-in problem on ``--mesh`` (spanning every
process's devices). Prints one JSON line ``RESULT {...}``: the pick, and on process 0 (or
alone) the study's measured trials in order with their per-device figures. ``--print-trials``
prints ``TRIAL n`` as each trial ends (the fault test kills a process after one);
``--fail-policy P`` makes building a schedule with policy P fail on this process alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("process", type=int)
    p.add_argument("processes", type=int)
    p.add_argument("port", type=int)
    p.add_argument("storage")
    p.add_argument("out")
    p.add_argument("--devices", type=int, default=2, help="CPU devices per process")
    p.add_argument("--mesh", default="data=4")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--hidden", type=int, default=8)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--budget", default="10MB")
    p.add_argument("--time-budget", type=float, default=0.1)
    p.add_argument("--heartbeat", type=int, default=10,
                   help="seconds; short in the fault test, long elsewhere (a loaded CI machine)")
    p.add_argument("--study-name", default="lockstep")
    p.add_argument("--print-trials", action="store_true")
    p.add_argument("--fail-policy", default="",
                   help="on this process, building a schedule with this policy fails "
                        "(a compile that fails on one host only)")
    a = p.parse_args()
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={a.devices}"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if a.processes > 1:
        jax.distributed.initialize(f"127.0.0.1:{a.port}", num_processes=a.processes,
                                   process_id=a.process, heartbeat_timeout_seconds=60)
    import optuna

    import autoremat
    from autoremat._cli.exits import end_lost
    from autoremat._search.lockstep import LockstepLost

    def on_trial(study: object, trial: optuna.trial.FrozenTrial) -> None:
        if a.print_trials:
            print(f"TRIAL {trial.number}", flush=True)

    problem = autoremat.seed_lstm(seq_len=a.seq_len, hidden=a.hidden, mesh=a.mesh)
    if a.fail_policy:
        build = problem.build

        def failing(schedule: autoremat.Schedule) -> Any:
            if a.fail_policy in schedule.key():
                raise RuntimeError(f"no {a.fail_policy} on process {a.process}")
            return build(schedule)

        problem = dataclasses.replace(problem, build=failing)
    start = time.perf_counter()
    try:
        result = autoremat.tune(problem, autoremat.parse_bytes(a.budget), n_trials=a.trials,
                                time_budget=a.time_budget, storage=a.storage,
                                study_name=a.study_name, out=a.out, heartbeat=a.heartbeat,
                                on_trial=on_trial)
    except LockstepLost as e:  # as the command does: one line, EXIT_LOST
        end_lost(e)
    wall = time.perf_counter() - start
    best = result.best_trial
    report: dict[str, object] = {
        "process": a.process, "wall": wall, "measured": result.measured,
        "pick": None if best is None else best.schedule.key(),
        "pick_total": None if best is None else best.measurement.total_bytes,
        "pick_seconds": None if best is None else best.measurement.step_seconds,
        "plain_seconds": (None if result.plain_trial is None
                          else result.plain_trial.measurement.step_seconds),
        "devices": result.devices, "mesh": result.mesh,
    }
    if jax.process_index() == 0:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name=result.study_name, storage=a.storage)
        report["trials"] = [
            [t.user_attrs["schedule_key"], t.user_attrs.get("status"),
             t.user_attrs.get("total_bytes"), t.user_attrs.get("temp_bytes"),
             t.user_attrs.get("argument_bytes"), t.user_attrs.get("step_seconds"),
             t.user_attrs.get("reason")]
            for t in study.trials if t.user_attrs.get("measured")]
    print("RESULT " + json.dumps(report), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
