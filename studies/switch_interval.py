"""The main thread's storage work beside a tracing thread, at several switch intervals.

A tune's main thread records each trial in an Optuna SQLite study while compile threads
trace the next schedules (``autoremat._search.planning.compile_pool``). SQLite lets the
GIL go on every call, and the main thread then waits up to Python's switch interval to
take it back from a thread that traces. This script times 30 rounds of a trial's
storage work (``ask``, ten attrs, ``tell``, ``get_trials``) alone, then beside a thread
that traces (``jax.jit(...).lower``) in a loop, at each interval, and how many lowerings
that thread ran a second meanwhile and with the main thread idle.

Run it anywhere (no device needed): ``python studies/switch_interval.py``.
Results, and what a finer interval did to whole tunes on a TPU (they took longer: the
compile threads' Python slowed more than the main thread's gained):
``studies/results/tune_time_v5e_workers.md``.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time

INTERVALS = (0.005, 0.001, 0.00025, 0.005, 0.00025)
ROUNDS = 30


def _storage_rounds(n: int) -> float:
    """Seconds for ``n`` rounds of one trial's storage work in a fresh SQLite study."""
    import optuna

    from autoremat._search.storage import open_storage

    folder = tempfile.mkdtemp()
    study = optuna.create_study(storage=open_storage(f"sqlite:///{folder}/study.db"))
    start = time.perf_counter()
    for k in range(n):
        trial = study.ask()
        for a in range(10):
            trial.set_user_attr(f"a{a}", k)
        study.tell(trial, float(k))
        study.get_trials(deepcopy=False)
    return time.perf_counter() - start


def main() -> None:
    import warnings

    import jax
    import jax.numpy as jnp
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore")  # Optuna's heartbeat note outside ``optimize``
    stop = threading.Event()
    lowered = [0]

    def trace_loop() -> None:
        while not stop.is_set():
            def f(x: jax.Array) -> jax.Array:  # a new function: traced anew each time
                for _ in range(200):
                    x = jnp.tanh(x @ x)
                return x

            jax.jit(f).lower(jnp.ones((8, 8)))
            lowered[0] += 1

    print(f"alone: {_storage_rounds(ROUNDS):.2f} s", flush=True)
    tracer = threading.Thread(target=trace_loop)
    tracer.start()
    time.sleep(1.0)
    default = sys.getswitchinterval()
    for interval in INTERVALS:
        sys.setswitchinterval(interval)
        before, start = lowered[0], time.perf_counter()
        seconds = _storage_rounds(ROUNDS)
        rate = (lowered[0] - before) / (time.perf_counter() - start)
        before = lowered[0]
        time.sleep(3.0)
        idle = (lowered[0] - before) / 3.0
        print(f"beside a trace, interval {interval * 1e3:g} ms: {seconds:.2f} s; "
              f"lowerings/s {rate:.1f} meanwhile, {idle:.1f} with the main thread idle",
              flush=True)
    sys.setswitchinterval(default)
    stop.set()
    tracer.join()


if __name__ == "__main__":
    main()
