"""What runs beside a timing: one step timed alone, beside XLA compiles, beside a trace.

The tuner's compile threads (``autoremat._search.planning.compile_pool``) build, trace and size
their schedules under the measure lock that a timing holds, and let only XLA's compile
run beside it. This script measures why, on the issue-47 big model (``seed_lstm``, hidden
1024, batch 128, T=10^4, fused readout; ``H``, ``B``, ``T`` in the environment resize
it): the step of ``T//3+1 x 3 nothing/everything unroll=2`` timed alone, beside two
compiles on threads, beside a thread that traces (``jax.jit(...).lower``) another schedule
in a loop -- at Python's default switch interval and at 0.1 ms -- and alone again; then
the neighbours of that step, alone (whether the search's cuts are real).

Run it on the device (``studies/device_setup.sh`` first on the TPU machine):
``python studies/timing_beside.py``. It prints each run's milliseconds, the warm-up first.
Results (TPU v5e): ``studies/results/tune_time.md``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import autoremat
from autoremat._measure.measure import compile_schedule
from autoremat._models.seed_lstm import seed_lstm

BUDGET = 12_000_000_000


def _schedule(outer: int, inner: int, unroll: int) -> autoremat.Schedule:
    return autoremat.nested([outer, inner], ["nothing_saveable", "everything_saveable"],
                            unroll=unroll)


def _runs(compiled: Any, n: int = 8) -> list[float]:
    """The warm-up and ``n`` runs, in milliseconds."""
    import jax

    out = []
    for _ in range(n + 1):
        start = time.perf_counter()
        jax.block_until_ready(compiled.executable(*compiled.args))
        out.append(round((time.perf_counter() - start) * 1e3, 2))
    return out


def main() -> None:
    problem = seed_lstm(seq_len=int(os.environ.get("T", 10_000)),
                        hidden=int(os.environ.get("H", 1024)),
                        batch=int(os.environ.get("B", 128)), fused_readout=True)
    t = problem.seq_len
    timed = compile_schedule(problem, _schedule(t // 3 + 1, 3, 2), budget_bytes=BUDGET)
    print("alone", _runs(timed), flush=True)

    busy = [threading.Thread(target=compile_schedule, args=(problem, s),
                             kwargs={"budget_bytes": BUDGET})
            for s in (_schedule(t // 16, 16, 8), _schedule(t // 8, 8, 2))]
    for thread in busy:
        thread.start()
    time.sleep(1.0)  # past their traces: XLA's compiles are under way
    print("beside two XLA compiles", _runs(timed), flush=True)
    for thread in busy:
        thread.join()

    stop = threading.Event()

    def trace_again() -> None:
        import jax

        while not stop.is_set():
            step, args = problem.build(_schedule(t // 8, 8, 2))
            jax.jit(step).lower(*args)

    for interval in (sys.getswitchinterval(), 1e-4):
        default = sys.getswitchinterval()
        sys.setswitchinterval(interval)
        stop.clear()
        tracer = threading.Thread(target=trace_again)
        tracer.start()
        time.sleep(0.5)
        print(f"beside a trace, switch interval {interval * 1e3:g} ms", _runs(timed), flush=True)
        stop.set()
        tracer.join()
        sys.setswitchinterval(default)
    print("alone again", _runs(timed), flush=True)

    for outer, inner, unroll in ((t // 4, 4, 2), (t // 4, 4, 4), (t // 5, 5, 2), (t // 2, 2, 2)):
        schedule = _schedule(outer, inner, unroll)
        compiled = compile_schedule(problem, schedule, budget_bytes=BUDGET)
        if compiled.executable is None:
            print(schedule.describe(), "not run:", compiled.measurement.reason[:200])
            continue
        print(schedule.describe(), "alone", _runs(compiled), flush=True)
        compiled.release()


if __name__ == "__main__":
    main()
