"""Tiny problems that misbehave on purpose, for the reliability tests.

``faulty``: the tiny tanh-RNN (``tests/tiny_problem.py``) whose four seed
schedules (the first trials of every study) each fail another way: the plain
scan raises while running, per-step remat fails to build, sqrt(T) fails to
compile, cube-root gives a NaN loss. Every other schedule is fine.

``hang_once``: the tiny problem, but the ``AUTOREMAT_TEST_HANG_AT``-th call of
``build`` in a process (default 4: the plain scan, built once for the study's fingerprint
and trial 0, the bound's least-memory schedule, then trials 1, 2)
writes the file ``AUTOREMAT_TEST_HANG_MARKER`` (its pid) and sleeps, so a test
can SIGKILL the worker in the middle of a trial. Once the marker exists it no
longer hangs (the restarted worker runs normally).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from autoremat._measure.problem import Problem
from autoremat._schedules.base import Schedule
from tests.tiny_problem import tiny

FAIL_RUN, FAIL_BUILD, FAIL_COMPILE, FAIL_NAN = range(4)


def faulty(seq_len: int = 32) -> Problem:
    import jax
    import jax.numpy as jnp

    from autoremat._search.space import seeds

    base = tiny(seq_len)
    keys = [s.key() for s, _ in seeds(seq_len)]

    def explode(x: Any) -> Any:
        raise RuntimeError("step exploded at run time")

    def build(schedule: Schedule) -> tuple[Any, tuple[Any, ...]]:
        key = schedule.key()
        if key == keys[FAIL_BUILD]:
            raise RuntimeError("build exploded")
        step, args = base.build(schedule)
        if key == keys[FAIL_RUN]:
            def run_fails(w: jax.Array, x: jax.Array) -> Any:
                w = jax.pure_callback(explode, jax.ShapeDtypeStruct(w.shape, w.dtype), w)
                return step(w, x)

            return run_fails, args
        if key == keys[FAIL_COMPILE]:
            def compile_fails(w: jax.Array, x: jax.Array) -> Any:
                return step(w, x[:, :3] + x)  # shapes (T, 3) + (T, 4): a trace-time error

            return compile_fails, args
        if key == keys[FAIL_NAN]:
            def nan_loss(w: jax.Array, x: jax.Array) -> Any:
                w2, loss = step(w, x)
                return w2, loss * jnp.nan

            return nan_loss, args
        return step, args

    return Problem(name=f"faulty(T={seq_len})", seq_len=seq_len, build=build)


def hang_once(seq_len: int = 32) -> Problem:
    base = tiny(seq_len)
    calls = [0]
    # builds: the plain scan's (its trial reuses it), the bound's least-memory schedule,
    # then one per trial: the 4th is the third trial's
    hang_at = int(os.environ.get("AUTOREMAT_TEST_HANG_AT", "4"))
    marker = os.environ.get("AUTOREMAT_TEST_HANG_MARKER")

    def build(schedule: Schedule) -> tuple[Any, tuple[Any, ...]]:
        calls[0] += 1
        if marker and calls[0] == hang_at and not Path(marker).exists():
            Path(marker).write_text(str(os.getpid()))
            time.sleep(600)
        return base.build(schedule)

    return Problem(name=f"hang_once(T={seq_len})", seq_len=seq_len, build=build)
