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
``autoremat._measure.failure``). Otherwise it is run and timed
(``autoremat._measure.timing``: a warm-up, then runs until their median is known,
``step_seconds``; on GPU/TPU the device's peaks).

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

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autoremat._errors import one_line
from autoremat._measure import device_memory
from autoremat._measure.breakdown import (
    argument_parts,
    argument_sharding,
    memory_parts,
    scan_figures,
    total_of,
)
from autoremat._measure.compile_cache import counted
from autoremat._measure.device import environment
from autoremat._measure.failure import BUILD, COMPILE, is_out_of_memory, stated_bytes, words
from autoremat._measure.measurement import (
    ERROR,
    OK,
    OVER_BUDGET,
    Measurement,
)
from autoremat._measure.mesh import layout
from autoremat._measure.peers import peers_of
from autoremat._measure.problem import Problem, Step
from autoremat._measure.timing import DEFAULT_TIME_BUDGET, TIMING_GATE, Compiled, time_compiled
from autoremat._scan.records import record_scans
from autoremat._schedules.base import Schedule


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
            with counted():  # a schedule's compile: in the cache's hit rate
                executable = lowered.compile(
                    compiler_options=dict(compiler_options) if compiler_options else None)
        return executable, scans, time.perf_counter() - start

    with TIMING_GATE.write():  # Python: not beside a timing (the sizing's note)
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
    # Sizing is Python (it holds the GIL): on a compile thread, never beside a timing --
    # an accelerator's step runs slower beside Python tracing in another thread, and no
    # slower beside XLA's compile (``studies/timing_beside.py``, results in
    # ``studies/results/tune_time.md``). Behind the timing gate, not ``MEASURE_LOCK``:
    # queued behind other threads' lowerings there, a compiled step waited seconds to be
    # sized while the device waited for it (``studies/results/tune_time_v5e_workers.md``).
    with TIMING_GATE.write():
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
    is recorded. For a problem of a lockstep tune every process compiles it too, and the
    result is theirs as well (``autoremat._measure.peers``)."""
    peers = peers_of(problem)
    if peers is None:
        return _compile_schedule(problem, schedule, budget_bytes, built)
    ticket = peers.announce(problem, schedule, budget_bytes)
    return peers.joined(ticket, _compile_schedule(problem, schedule, budget_bytes, built))


def _compile_schedule(problem: Problem, schedule: Schedule, budget_bytes: int | None,
                      built: tuple[Step, tuple[Any, ...]] | None) -> Compiled:
    try:
        step, args = built if built is not None else problem.build(schedule)
    except Exception as e:
        env: dict[str, Any] = environment()
        return Compiled(Measurement(schedule.key(), ERROR, f"{words(BUILD)}: {one_line(e)}",
                                    failed_at=BUILD, out_of_memory=is_out_of_memory(e), **env))
    return compile_step(step, args, budget_bytes=budget_bytes, label=schedule.key(),
                        arg_names=problem.arg_names, compiler_options=schedule.compiler_options)
