"""Compile and size a step, then time it: the two halves of ``_measure.measure_step``.

Compiling and sizing (``compile_step``: ``jax.jit(step).lower(*args).compile()``
and its ``memory_analysis()``) costs a fraction of timing, so the tuner sizes
many schedules and times few; the ``Compiled`` handle keeps the executable, so
a schedule timed later (``time_compiled``) is not compiled twice. The figures
are defined in ``autoremat._measure`` (its module doc).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from autoremat._measure import (
    ERROR,
    OK,
    OVER_BUDGET,
    Measurement,
    _check_finite,
    _kind_of_failure,
    _memory_parts,
    _memory_stats,
    _one_line,
    _total,
    environment,
)
from autoremat._problem import Problem
from autoremat._schedule import Schedule


@dataclass
class Compiled:
    """A step compiled and sized, not yet timed (``compile_step``).

    Compiling and sizing costs a fraction of timing, so the tuner sizes many
    schedules and times few; the executable is kept so a schedule timed later
    is not compiled twice. ``executable`` is ``None`` when the step failed or
    is over the budget (``measurement`` says which); ``release()`` drops it.
    """

    measurement: Measurement
    executable: Any = None
    args: Sequence[Any] = ()

    def release(self) -> None:
        """Drop the executable and arguments (the sized ``measurement`` stays)."""
        self.executable, self.args = None, ()


def compile_step(step: Callable[..., Any], args: Sequence[Any], *,
                 budget_bytes: int | None = None, label: str = "",
                 arg_names: Sequence[str] | None = None) -> Compiled:
    """Compile ``step(*args)`` ahead of time and size it (``memory_analysis()``,
    and the breakdown of ``autoremat._breakdown``; ``arg_names`` name ``args``).

    The measurement's status is ``"ok"`` (sized, fits, not run yet),
    ``"over_budget"`` or ``"error"``; a failure is recorded, never raised.
    """
    import jax

    from autoremat._breakdown import argument_parts, scan_figures
    from autoremat._scan import record_scans

    def fresh(*a: Any) -> Any:  # traced anew, so the scans report what they stack
        return step(*a)

    env: dict[str, Any] = environment()  # str values, passed to the str fields
    start = time.perf_counter()
    try:
        with record_scans() as scans:
            executable = jax.jit(fresh).lower(*args).compile()
    except Exception as e:
        return Compiled(Measurement(label, ERROR, f"{_kind_of_failure(e, 'compile')}: "
                                    f"{_one_line(e)}", **env))
    parts = _memory_parts(executable)
    figures: dict[str, Any] = {
        "argument_parts": argument_parts(args, arg_names), **scan_figures(scans),
        "compile_seconds": time.perf_counter() - start,
        "temp_bytes": parts["temp"],
        "argument_bytes": parts["argument"],
        "output_bytes": parts["output"],
        "alias_bytes": parts["alias"],
        "total_bytes": _total(parts),
    }
    total = figures["total_bytes"]
    if budget_bytes is not None and total is not None and total > budget_bytes:
        return Compiled(Measurement(
            label, OVER_BUDGET,
            f"over budget: total {total} bytes > budget {budget_bytes} bytes (not run)",
            **figures, **env))
    return Compiled(Measurement(label, OK, "", **figures, **env), executable, tuple(args))


def compile_schedule(problem: Problem, schedule: Schedule, *,
                     budget_bytes: int | None = None) -> Compiled:
    """``problem.build(schedule)`` then ``compile_step``; a build failure is recorded."""
    try:
        step, args = problem.build(schedule)
    except Exception as e:
        env: dict[str, Any] = environment()
        return Compiled(Measurement(schedule.key(), ERROR, f"build failed: {_one_line(e)}",
                                    **env))
    return compile_step(step, args, budget_bytes=budget_bytes, label=schedule.key(),
                        arg_names=problem.arg_names)


def time_compiled(compiled: Compiled, *, budget_bytes: int | None = None,
                  time_budget: float = 5.0, min_repeats: int | None = None,
                  max_repeats: int = 20,
                  on_output: Callable[[Any], None] | None = None,
                  cut_after: float | None = None) -> Measurement:
    """Run a ``compile_step`` result: a warm-up, then the timed runs (module doc).

    ``min_repeats``: the fewest timed runs; by default 3 -- but when the warm-up
    alone took longer than ``time_budget`` (a step of seconds, T=10^5 on a CPU)
    that run is the figure (and the cut test): its one-time costs and its
    run-to-run noise are small against its length, and more runs would
    multiply the cost of every trial.

    ``cut_after``: when the warm-up and then one timed run each take longer
    (seconds), stop there: the measurement has ``step_seconds=None`` and
    ``cut_seconds`` = that run's time -- two runs instead of ``repeats + 1``
    for a schedule already slower than one measured, and no claim about its
    median.
    """
    import jax

    sized = compiled.measurement
    if compiled.executable is None:
        return sized
    figures = {k: getattr(sized, k) for k in _FIGURES}
    env = {k: getattr(sized, k) for k in _ENV}
    label, executable, args = sized.schedule_key, compiled.executable, compiled.args

    def fail(reason: str, **more: Any) -> Measurement:
        return Measurement(label, ERROR, reason, **figures, **more, **env)

    try:
        t0 = time.perf_counter()
        out = jax.block_until_ready(executable(*args))
        warmup = time.perf_counter() - t0
        loss, bad = _check_finite(out)
        if bad:
            return fail(f"non-finite output: {bad}", loss=loss)
        if on_output is not None:
            on_output(out)
        del out
        long_step = min_repeats is None and warmup > time_budget  # its one run is the figure
        samples = [warmup] if long_step else []
        if cut_after is not None and warmup > cut_after:  # one run decides
            if not samples:
                t0 = time.perf_counter()
                jax.block_until_ready(executable(*args))
                samples.append(time.perf_counter() - t0)
            if samples[0] > cut_after:
                return Measurement(label, OK, "", **figures, loss=loss,
                                   cut_seconds=samples[0], **env)
        repeats = 1 if long_step else max(
            3 if min_repeats is None else min_repeats,
            min(max_repeats, int(time_budget / max(warmup, 1e-6))))
        for _ in range(repeats - len(samples)):
            t0 = time.perf_counter()
            jax.block_until_ready(executable(*args))
            samples.append(time.perf_counter() - t0)
    except Exception as e:
        return fail(f"{_kind_of_failure(e, 'run')}: {_one_line(e)}")

    stats = _memory_stats(jax.devices()[0])
    peak = stats.get("peak_bytes_in_use") if stats else None
    peak = int(peak) if isinstance(peak, int) and peak > 0 else None
    if figures["total_bytes"] is None:
        figures["total_bytes"] = peak
    if figures["total_bytes"] is None:
        return fail("no memory figure: memory_analysis() and memory_stats() gave none", loss=loss)
    if budget_bytes is not None and figures["total_bytes"] > budget_bytes:
        return Measurement(label, OVER_BUDGET, "over budget: peak bytes in use > budget",
                           **figures, peak_bytes=peak, **env)
    return Measurement(
        label, OK, "", **figures, peak_bytes=peak, step_seconds=statistics.median(samples),
        step_samples=tuple(samples), loss=loss, **env,
    )


_FIGURES: Final = ("compile_seconds", "temp_bytes", "argument_bytes", "output_bytes",
                   "alias_bytes", "total_bytes", "argument_parts", "stacked_bytes",
                   "carry_bytes")
_ENV: Final = ("device_kind", "platform", "jax_version", "flax_version")
