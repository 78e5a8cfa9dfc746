"""What is measured, and how: the one place that defines every figure.

``measure_step(step, args)`` takes any un-jitted step (an autoremat schedule's or a
competitor's), compiles it ahead of time with ``jax.jit(step).lower(*args).compile()`` and
reads the compiled executable's ``memory_analysis()``; ``measure(problem, schedule)`` is
``problem.build(schedule)`` followed by ``measure_step``:

* ``argument_bytes``, ``output_bytes``, ``temp_bytes``, ``alias_bytes`` are XLA's own
  figures for that executable (``alias`` is output memory that reuses argument buffers, so
  it is counted once);
* ``total_bytes = argument + output + temp - alias``: what the step needs on the device
  while it runs. This is known after compiling, before running.
* the breakdown (``autoremat._measure.breakdown``): ``argument_parts`` (bytes per
  argument: params, optimizer state, inputs), ``stacked_bytes`` and ``carry_bytes`` (what
  the autoremat scans stack and carry, reported at trace time); the rest of temp is the
  schedule's.

A step whose total is over the budget is not run (``status`` is ``"over_budget"``); so is
one the compiler refused for want of device memory when its message states the size
(``compiler_bytes``) -- any other compile failure is an ``"error"`` with no size. Where a
measurement failed is data (``failed_at``, ``out_of_memory``;
``autoremat._measure.failure``). Otherwise the step runs once as a warm-up (its loss and
every floating output must be finite), then ``repeats`` more times, where ``repeats``
adapts to the warm-up time so timing one schedule takes about ``time_budget`` seconds
(between ``min_repeats`` and ``max_repeats`` runs; by default, when the warm-up alone was
longer than ``time_budget``, that one run is the figure); so timing takes at most
``max(time_budget, min_repeats * step)``. It stops sooner once the runs are steady: after
``min_repeats`` runs, as soon as three of them and all but at most one lie within
``STEADY`` (1%) of their median -- more runs would hardly move it: a TPU's runs mostly
agree so (``studies/results/tune_time.md``), and a big model's trial times in three or
four runs instead of ``time_budget``'s worth (12); a busy CPU's seldom do, and time on as
before. ``step_seconds``
is the median wall time of those runs, each ended by ``jax.block_until_ready``. On
GPU/TPU, ``peak_bytes`` is the device's ``memory_stats()["peak_bytes_in_use"]`` after the
runs -- a high-water mark of the whole process's buffers (on a GPU an upper bound for this
step; on a TPU it leaves out every program's temporaries, so it bounds nothing: shown as
the process's, never as the step's).

On a device whose ``memory_stats()`` reports ``bytes_in_use`` and ``peak_bytes_in_use``
(GPU, TPU), two more figures are measured where the platform's method was checked against
the truth (``device_memory.VALIDATED``; elsewhere ``None``, and
``device_memory.unmeasured_reason`` says why), each isolated from earlier trials in the
process (``autoremat._measure.device_memory``: read where the platform books it -- a TPU
program's reservation, a GPU's high-water mark):

* ``compile_scratch_bytes``: what compiling took on the device (XLA:GPU's autotuning),
  freed before the step runs -- transient, not part of the step; none on a TPU, whose
  compiles take no device memory;
* ``runtime_peak_bytes``: the arguments plus what the warm-up run needed beyond them (on a
  TPU its outputs and its program's reservation): the step's own need, to compare with
  ``total_bytes`` (the estimate).

Where the runtime peak is measured it decides the fit (``Measurement.fit_bytes``): a step
whose estimate is over the budget still compiles and runs its warm-up there (the estimate
can be a third over the truth on a TPU), and one whose runtime peak is over the budget is
``"over_budget"`` after its warm-up (not timed further), whatever its estimate. On a CPU,
and on a platform whose method is not validated, the estimate decides, and a step over it
is not run.

On many devices (arguments placed with a ``NamedSharding``), JAX's SPMD partitioner
compiles one program per device and every figure above is one device's
(``autoremat._measure.mesh``): ``devices`` and ``mesh`` say which, the argument parts are
per-device shards, and ``peak_bytes`` is the largest over the devices. The scans'
``stacked_bytes``/``carry_bytes`` are not recorded there: the scan sees whole (traced)
arrays, not one device's share.

Known caveat: ``memory_analysis()`` returns ``None`` or zero/-1 sizes on some backends and
versions (jax issues 18954, 12848); missing parts are recorded as ``None`` and
``total_bytes`` falls back to ``peak_bytes`` when that exists.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from autoremat._errors import one_line
from autoremat._measure import device_memory
from autoremat._measure.breakdown import (
    argument_parts,
    argument_sharding,
    memory_parts,
    scan_figures,
    total_of,
)
from autoremat._measure.device import environment
from autoremat._measure.failure import BUILD, COMPILE, RUN, is_out_of_memory, stated_bytes, words
from autoremat._measure.measurement import (
    ERROR,
    OK,
    OVER_BUDGET,
    Measurement,
    Status,
    fit_figure,
)
from autoremat._measure.mesh import layout
from autoremat._measure.problem import Problem, Step
from autoremat._scan.records import record_scans
from autoremat._schedules.base import Schedule

#: About how long timing one schedule may take, in seconds (``time_budget``).
DEFAULT_TIME_BUDGET: Final = 5.0
#: Timing stops once ``min_repeats`` runs or more lie within this fraction of their
#: median, one outlier aside (the module doc).
STEADY: Final = 0.01


def measure(
    problem: Problem,
    schedule: Schedule,
    *,
    budget_bytes: int | None = None,
    time_budget: float = DEFAULT_TIME_BUDGET,
    min_repeats: int | None = None,
    max_repeats: int = 20,
    run: bool = True,
) -> Measurement:
    """Compile, size and time ``problem``'s step under ``schedule``.

    ``problem.build(schedule)`` then ``measure_step`` (see there for the
    arguments); a build that raises is recorded (``failed_at="build"``, reason
    ``"build failed: ..."``).
    """
    compiled = compile_schedule(problem, schedule, budget_bytes=budget_bytes)
    if not run or compiled.executable is None:
        return compiled.measurement
    return time_compiled(compiled, budget_bytes=budget_bytes, time_budget=time_budget,
                         min_repeats=min_repeats, max_repeats=max_repeats)


def measure_step(
    step: Callable[..., Any],
    args: Sequence[Any],
    *,
    budget_bytes: int | None = None,
    time_budget: float = DEFAULT_TIME_BUDGET,
    min_repeats: int | None = None,
    max_repeats: int = 20,
    run: bool = True,
    label: str = "",
    on_output: Callable[[Any], None] | None = None,
    arg_names: Sequence[str] | None = None,
) -> Measurement:
    """Compile, size and time any un-jitted ``step(*args)`` (see the module doc).

    Args:
      step, args: the un-jitted step and example arguments for it; compiled
        with ``jax.jit(step).lower(*args).compile()``.
      budget_bytes: when given, a step over it is ``status="over_budget"``: not
        run when its ``total_bytes`` exceeds it and no runtime peak is measured on
        this platform, else after its warm-up when its runtime peak does.
      time_budget: about how many seconds the timed runs may take in all.
      min_repeats, max_repeats: bounds on the number of timed runs (equal
        bounds: exactly that many); by default 3, or none when the warm-up
        alone took longer than ``time_budget`` (that run is the figure).
      run: ``False`` compiles and sizes only (no ``step_seconds``).
      label: recorded as ``schedule_key`` (e.g. a non-autoremat competitor's name).
      on_output: called with the warm-up run's (finite) output before the
        timed runs, e.g. to keep gradients for a comparison; what it raises
        is recorded as a run failure.
      arg_names: names of ``args`` for ``argument_parts``.

    Returns:
      A ``Measurement``; failures are recorded in it, never raised (except
      ``KeyboardInterrupt``).
    """
    compiled = compile_step(step, args, budget_bytes=budget_bytes, label=label,
                            arg_names=arg_names)
    if not run or compiled.executable is None:
        return compiled.measurement
    return time_compiled(compiled, budget_bytes=budget_bytes, time_budget=time_budget,
                         min_repeats=min_repeats, max_repeats=max_repeats, on_output=on_output)


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
                 arg_names: Sequence[str] | None = None,
                 compiler_options: Mapping[str, Any] | None = None) -> Compiled:
    """Compile ``step(*args)`` ahead of time and size it (``memory_analysis()``,
    and the breakdown of ``autoremat._measure.breakdown``; ``arg_names`` name ``args``).
    ``compiler_options``: XLA options for this compile (``Schedule.compiler_options``).

    The measurement's status is ``"ok"`` (sized, fits, not run yet),
    ``"over_budget"`` or ``"error"``; a failure is recorded, never raised.
    """
    import jax

    def fresh(*a: Any) -> Any:  # traced anew, so the scans report what they stack
        return step(*a)

    def compile_now() -> tuple[Any, list[Any], float]:
        with record_scans() as scans:
            with device_memory.MEASURE_LOCK:  # a trace holds the GIL: never beside a timing
                start = time.perf_counter()  # not counting the wait for a timing to end
                lowered = jax.jit(fresh).lower(*args)
            executable = lowered.compile(
                compiler_options=dict(compiler_options) if compiler_options else None)
        return executable, scans, time.perf_counter() - start

    env: dict[str, Any] = environment()  # str values, passed to the str fields
    env["devices"], env["mesh"] = layout(args)
    try:  # the scratch: what compiling took on the device (None on a CPU)
        (executable, scans, seconds), scratch = device_memory.measured(compile_now,
                                                                            compiling=True)
    except Exception as e:
        oom = is_out_of_memory(e)
        stated = stated_bytes(e) if oom else None
        # Refused for want of memory with a size stated: a size; any other failure is none.
        return Compiled(Measurement(label, ERROR if stated is None else OVER_BUDGET,
                                    f"{words(COMPILE, oom)}: {one_line(e)}", failed_at=COMPILE,
                                    out_of_memory=oom, compiler_bytes=stated, **env))
    parts = memory_parts(executable)
    figures: dict[str, Any] = {
        # Traced shapes are whole arrays, not one device's: on many devices no scan figure.
        "argument_parts": argument_parts(args, arg_names),
        **scan_figures(scans if env["devices"] == 1 else [], env["platform"]),
        "argument_sharding": argument_sharding(args, arg_names, env["devices"]),
        "compile_seconds": seconds,
        "compile_scratch_bytes": scratch,
        "temp_bytes": parts["temp"],
        "argument_bytes": parts["argument"],
        "output_bytes": parts["output"],
        "alias_bytes": parts["alias"],
        "total_bytes": total_of(parts),
    }
    total = figures["total_bytes"]
    if (budget_bytes is not None and total is not None and total > budget_bytes
            and env["platform"] not in device_memory.VALIDATED):
        return Compiled(Measurement(
            label, OVER_BUDGET,
            f"over budget: total {total} bytes > budget {budget_bytes} bytes (not run)",
            **figures, **env))
    return Compiled(Measurement(label, OK, "", **figures, **env), executable, tuple(args))


def compile_schedule(problem: Problem, schedule: Schedule, *, budget_bytes: int | None = None,
                     built: tuple[Step, tuple[Any, ...]] | None = None) -> Compiled:
    """``problem.build(schedule)`` (or ``built``: what it returned, when the caller already
    built it) then ``compile_step`` with the schedule's ``compiler_options``; a build failure
    is recorded."""
    try:
        step, args = built if built is not None else problem.build(schedule)
    except Exception as e:
        env: dict[str, Any] = environment()
        return Compiled(Measurement(schedule.key(), ERROR, f"{words(BUILD)}: {one_line(e)}",
                                    failed_at=BUILD, out_of_memory=is_out_of_memory(e), **env))
    return compile_step(step, args, budget_bytes=budget_bytes, label=schedule.key(),
                        arg_names=problem.arg_names, compiler_options=schedule.compiler_options)


def time_compiled(compiled: Compiled, *, budget_bytes: int | None = None,
                  time_budget: float = DEFAULT_TIME_BUDGET, min_repeats: int | None = None,
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
    if compiled.executable is None:
        return compiled.measurement
    with device_memory.MEASURE_LOCK:  # no compile thread traces while the step is timed
        return _Timing(compiled).run(budget_bytes=budget_bytes, time_budget=time_budget,
                                     min_repeats=min_repeats, max_repeats=max_repeats,
                                     on_output=on_output, cut_after=cut_after)


class _Timing:
    """``time_compiled`` of one compiled step: the figures it was sized with, its runs,
    and the ``Measurement`` they end in."""

    def __init__(self, compiled: Compiled) -> None:
        sized = compiled.measurement
        self.figures = {k: getattr(sized, k) for k in _FIGURES}
        self.env = {k: getattr(sized, k) for k in _ENV}
        self.label, self.executable, self.args = (sized.schedule_key, compiled.executable,
                                                  compiled.args)

    def measurement(self, status: Status, reason: str = "", **more: Any) -> Measurement:
        return Measurement(self.label, status, reason, **self.figures, **more, **self.env)

    def once(self) -> tuple[float, Any]:
        """One run: its wall seconds (ended by ``block_until_ready``) and its output."""
        import jax

        t0 = time.perf_counter()
        out = jax.block_until_ready(self.executable(*self.args))
        return time.perf_counter() - t0, out

    def run(self, *, budget_bytes: int | None, time_budget: float, min_repeats: int | None,
            max_repeats: int, on_output: Callable[[Any], None] | None,
            cut_after: float | None) -> Measurement:
        """The warm-up (checked finite), then the cut test or the timed runs."""
        try:
            (warmup, out), rise = device_memory.measured(self.once)
            self.figures["runtime_peak_bytes"] = self.runtime_peak(rise)
            loss, bad = _check_finite(out)
            if bad:
                return self.measurement(ERROR, f"non-finite output: {bad}", loss=loss,
                                        failed_at=RUN)
            over = self.runtime_over(budget_bytes)
            if over:  # the estimate fit, the run did not: timed no further
                return self.measurement(OVER_BUDGET, over, loss=loss,
                                        peak_bytes=device_memory.process_peak())
            if on_output is not None:
                on_output(out)
            del out
            long_step = min_repeats is None and warmup > time_budget  # its one run is the figure
            samples = [warmup] if long_step else []
            if cut_after is not None and warmup > cut_after:  # one run decides
                if not samples:
                    samples.append(self.once()[0])
                if samples[0] > cut_after:
                    return self.measurement(OK, loss=loss, cut_seconds=samples[0])
            fewest = 3 if min_repeats is None else min_repeats
            repeats = 1 if long_step else max(
                fewest, min(max_repeats, int(time_budget / max(warmup, 1e-6))))
            while len(samples) < repeats and not (len(samples) >= fewest and steady(samples)):
                samples.append(self.once()[0])
        except Exception as e:
            oom = is_out_of_memory(e)
            return self.measurement(ERROR, f"{words(RUN, oom)}: {one_line(e)}", failed_at=RUN,
                                    out_of_memory=oom)
        return self.timed(samples, loss, budget_bytes)

    def runtime_peak(self, rise: int | None) -> int | None:
        """The step's runtime peak: its arguments plus what the run raised the device's
        mark by (``None``: no ``memory_stats``, or not isolated)."""
        if rise is None:
            return None
        args = self.figures["argument_bytes"]
        if args is None:
            args = sum(size for _, size in self.figures["argument_parts"] or ())
        return int(args) + rise

    def runtime_over(self, budget_bytes: int | None) -> str:
        """Why the measured runtime peak does not fit (``""``: it does, or none)."""
        runtime, total = self.figures["runtime_peak_bytes"], self.figures["total_bytes"]
        if budget_bytes is None or runtime is None or runtime <= budget_bytes:
            return ""
        return (f"over budget: measured runtime peak {runtime} bytes > budget {budget_bytes} "
                f"bytes (the estimate: {total} bytes); not timed further")

    def timed(self, samples: list[float], loss: float | None,
              budget_bytes: int | None) -> Measurement:
        """The timed measurement, with the device's peak (GPU/TPU) -- the total when
        ``memory_analysis()`` gave none, checked against the budget."""

        peak = device_memory.process_peak()
        if self.figures["total_bytes"] is None:
            self.figures["total_bytes"] = peak
        total = self.figures["total_bytes"]
        if total is None:
            return self.measurement(
                ERROR, "no memory figure: memory_analysis() and memory_stats() gave none",
                loss=loss, failed_at=RUN)
        fit = fit_figure(total, self.figures["runtime_peak_bytes"])[0]
        if budget_bytes is not None and fit is not None and fit > budget_bytes:
            return self.measurement(OVER_BUDGET, f"over budget: {fit} bytes > budget "
                                    f"{budget_bytes} bytes", peak_bytes=peak)
        return self.measurement(OK, peak_bytes=peak, step_seconds=statistics.median(samples),
                                step_samples=tuple(samples), loss=loss)


_FIGURES: Final = ("compile_seconds", "temp_bytes", "argument_bytes", "output_bytes",
                   "alias_bytes", "total_bytes", "argument_parts", "stacked_bytes",
                   "carry_bytes", "argument_sharding", "compile_scratch_bytes",
                   "runtime_peak_bytes")
_ENV: Final = ("device_kind", "platform", "jax_version", "flax_version", "devices", "mesh")


def steady(samples: Sequence[float]) -> bool:
    """Three samples or more, and all but at most one, lie within ``STEADY`` of their
    median (timing may stop: the module doc)."""
    mid = statistics.median(samples)
    near = sum(abs(x - mid) <= STEADY * mid for x in samples)
    return mid > 0 and near >= 3 and near >= len(samples) - 1


def _check_finite(out: Any) -> tuple[float | None, str]:
    """The scalar loss (if any) and a description of the first non-finite output."""
    import jax
    import numpy as np

    loss = None
    for path, leaf in jax.tree_util.tree_leaves_with_path(out):
        arr = np.asarray(leaf)
        if not np.issubdtype(arr.dtype, np.floating):
            continue
        if arr.size == 1 and loss is None:
            loss = float(arr.reshape(()))
        if not np.isfinite(arr).all():
            return loss, f"output {jax.tree_util.keystr(path) or '()'} has NaN/inf"
    return loss, ""
