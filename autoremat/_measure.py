"""What is measured, and how: the one place that defines every figure.

``measure_step(step, args)`` takes any un-jitted step (an autoremat schedule's
or a competitor's), compiles it ahead of time with
``jax.jit(step).lower(*args).compile()`` and reads the compiled executable's
``memory_analysis()``; ``measure(problem, schedule)`` is
``problem.build(schedule)`` followed by ``measure_step``:

* ``argument_bytes``, ``output_bytes``, ``temp_bytes``, ``alias_bytes`` are
  XLA's own figures for that executable (``alias`` is output memory that
  reuses argument buffers, so it is counted once);
* ``total_bytes = argument + output + temp - alias``: what the step needs on
  the device while it runs. This is known after compiling, before running.
* the breakdown (``autoremat._breakdown``): ``argument_parts`` (bytes per
  argument: params, optimizer state, inputs), ``stacked_bytes`` and
  ``carry_bytes`` (what the autoremat scans stack and carry, reported at
  trace time); the rest of temp is the schedule's.

A step whose total is over the budget is not run (``status`` is
``"over_budget"``). Otherwise the step runs once as a warm-up (its loss and
every floating output must be finite), then ``repeats`` more times, where
``repeats`` adapts to the warm-up time so timing one schedule takes about
``time_budget`` seconds (between ``min_repeats`` and ``max_repeats`` runs;
by default, when the warm-up alone was longer than ``time_budget``, that
one run is the figure);
so timing takes ``max(time_budget, min_repeats * step)``;
``step_seconds`` is the median wall time of those runs, each ended by
``jax.block_until_ready``. On GPU/TPU, ``peak_bytes`` is the device's
``memory_stats()["peak_bytes_in_use"]`` after the runs -- a high-water mark of
the whole process, so an upper bound for this step.

Known caveat: ``memory_analysis()`` returns ``None`` or zero/-1 sizes on some
backends and versions (jax issues 18954, 12848); missing parts are recorded
as ``None`` and ``total_bytes`` falls back to ``peak_bytes`` when that exists.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Final

from autoremat._errors import TuneError
from autoremat._problem import Problem
from autoremat._schedule import Schedule

OK: Final = "ok"
OVER_BUDGET: Final = "over_budget"
ERROR: Final = "error"


@dataclass(frozen=True)
class Measurement:
    """The measured figures of one schedule of one problem on one device.

    Attributes:
      schedule_key: ``Schedule.key()`` of what was measured.
      status: ``"ok"`` (compiled, fits, ran, finite), ``"over_budget"``
        (compiled; total over the budget; not run) or ``"error"`` (build,
        compile or run failed, out of memory, or a non-finite loss).
      reason: why it is not ``ok`` (empty when it is).
      total_bytes: argument + output + temp - alias, in bytes (see module doc).
      temp_bytes, argument_bytes, output_bytes, alias_bytes: the parts.
      peak_bytes: device ``peak_bytes_in_use`` after running (GPU/TPU only).
      step_seconds: median wall seconds of one step (``None`` when not run).
      step_samples: every timed run, in seconds.
      compile_seconds: wall seconds of ``lower(...).compile()``.
      loss: the warm-up's scalar output when the step returns one.
      device_kind, platform, jax_version, flax_version: where it was measured.
      argument_parts: ``(name, bytes)`` per argument of the step
        (``Problem.arg_names``; default ``arg0``, ...).
      stacked_bytes: per-step outputs the step's autoremat scans stack
        (``None``: no autoremat scan); part of the floor no schedule removes.
      carry_bytes: those scans' carries (one each).
      cut_seconds: a cut trial's one (warm-up) run, in seconds: its timing
        stopped there as it was already clearly slower than the best that
        fits (``step_seconds`` is then ``None``; ``time_compiled``).
    """

    schedule_key: str
    status: str
    reason: str = ""
    total_bytes: int | None = None
    temp_bytes: int | None = None
    argument_bytes: int | None = None
    output_bytes: int | None = None
    alias_bytes: int | None = None
    peak_bytes: int | None = None
    step_seconds: float | None = None
    step_samples: tuple[float, ...] = field(default_factory=tuple)
    compile_seconds: float | None = None
    loss: float | None = None
    device_kind: str = ""
    platform: str = ""
    jax_version: str = ""
    flax_version: str = ""
    argument_parts: tuple[tuple[str, int], ...] = ()
    stacked_bytes: int | None = None
    carry_bytes: int | None = None
    cut_seconds: float | None = None

    @property
    def cut(self) -> bool:
        """Timing stopped after one run (``cut_seconds``): slower than the best that fits."""
        return self.cut_seconds is not None

    @property
    def feasible(self) -> bool:
        """Compiled, within the budget, ran, and produced finite outputs."""
        return self.status == OK

    def to_attrs(self) -> dict[str, Any]:
        """A JSON-safe mapping (Optuna user attrs), with ``feasible`` added."""
        data = asdict(self)
        data["step_samples"] = list(self.step_samples)
        data["argument_parts"] = [[name, size] for name, size in self.argument_parts]
        data["feasible"] = self.feasible
        return data

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> Measurement:
        """The measurement ``to_attrs`` stored (Optuna user attrs); other keys are ignored.

        Raises:
          TuneError: ``schedule_key`` or ``status`` is missing (not a measurement).
        """
        for key in ("schedule_key", "status"):
            if key not in attrs:
                raise TuneError(f"trial attrs: no {key!r}, so no measurement to read")
        data = {f.name: attrs[f.name] for f in fields(cls) if f.name in attrs}
        data["step_samples"] = tuple(data.get("step_samples") or ())
        data["argument_parts"] = tuple((str(n), int(b)) for n, b in data.get("argument_parts") or ())
        return cls(**data)

    def fits(self, budget_bytes: int) -> bool:
        """Ran (timed) and ``total_bytes <= budget_bytes``: the one test of "fits the budget"."""
        return (self.feasible and self.step_seconds is not None
                and self.total_bytes is not None and self.total_bytes <= budget_bytes)


def environment() -> dict[str, str]:
    """Device kind, platform and jax/flax versions of the default device."""
    import jax

    try:
        import flax

        flax_version = flax.__version__
    except ImportError:  # pragma: no cover - flax is a dependency
        flax_version = ""
    device = jax.devices()[0]
    return {
        "device_kind": str(device.device_kind),
        "platform": str(device.platform),
        "jax_version": jax.__version__,
        "flax_version": flax_version,
    }


def device_memory_bytes() -> int | None:
    """The default device's memory limit (GPU/TPU ``bytes_limit``), else ``None``."""
    import jax

    stats = _memory_stats(jax.devices()[0])
    limit = stats.get("bytes_limit") if stats else None
    return int(limit) if isinstance(limit, int) and limit > 0 else None


def fingerprint(args: Any) -> str:
    """A short hash of the argument tree's structure, shapes and dtypes (not values)."""
    import hashlib

    import jax

    leaves, treedef = jax.tree_util.tree_flatten(args)
    parts = [str(treedef)]
    for leaf in leaves:
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        parts.append(f"{tuple(shape) if shape is not None else type(leaf).__name__}:{dtype}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def measure(
    problem: Problem,
    schedule: Schedule,
    *,
    budget_bytes: int | None = None,
    time_budget: float = 5.0,
    min_repeats: int | None = None,
    max_repeats: int = 20,
    run: bool = True,
) -> Measurement:
    """Compile, size and time ``problem``'s step under ``schedule``.

    ``problem.build(schedule)`` then ``measure_step`` (see there for the
    arguments); a build that raises is recorded as ``"build failed: ..."``.
    """
    from autoremat._compiled import compile_schedule, time_compiled

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
    time_budget: float = 5.0,
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
      budget_bytes: when given, a step whose ``total_bytes`` exceeds it is
        not run (``status="over_budget"``).
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
    from autoremat._compiled import compile_step, time_compiled

    compiled = compile_step(step, args, budget_bytes=budget_bytes, label=label,
                            arg_names=arg_names)
    if not run or compiled.executable is None:
        return compiled.measurement
    return time_compiled(compiled, budget_bytes=budget_bytes, time_budget=time_budget,
                         min_repeats=min_repeats, max_repeats=max_repeats, on_output=on_output)


def _memory_parts(compiled: Any) -> dict[str, int | None]:
    """``memory_analysis()`` sizes; ``None`` where missing or negative."""
    try:
        analysis = compiled.memory_analysis()
    except Exception:
        analysis = None
    if isinstance(analysis, (list, tuple)):  # some versions: one per device
        analysis = analysis[0] if analysis else None
    names = {"argument": "argument_size_in_bytes", "output": "output_size_in_bytes",
             "temp": "temp_size_in_bytes", "alias": "alias_size_in_bytes"}
    parts: dict[str, int | None] = {}
    for part, attr in names.items():
        value = getattr(analysis, attr, None) if analysis is not None else None
        parts[part] = int(value) if isinstance(value, int) and value >= 0 else None
    return parts


def _total(parts: dict[str, int | None]) -> int | None:
    """argument + output + temp - alias; ``None`` when XLA reported nothing usable."""
    core = [parts["argument"], parts["output"], parts["temp"]]
    if any(v is None for v in core) or sum(v for v in core if v is not None) == 0:
        return None
    return sum(v for v in core if v is not None) - (parts["alias"] or 0)


def _memory_stats(device: Any) -> dict[str, Any] | None:
    try:
        stats = device.memory_stats()
    except Exception:
        return None
    return stats if isinstance(stats, dict) else None


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


def _kind_of_failure(e: BaseException, stage: str) -> str:
    text = str(e)
    if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower():
        return f"out of memory at {stage}"
    return f"{stage} failed"


def _one_line(e: BaseException, limit: int = 300) -> str:
    raw = str(e)
    if "Traceback (most recent call last)" in raw:
        # A Python error raised inside the computation (a host callback): JAX
        # embeds its whole traceback; keep the text before it and its last line.
        head, _, tail = raw.partition("Traceback (most recent call last)")
        last = [line for line in tail.splitlines() if line.strip()]
        raw = f"{head.rstrip(' :')}: {last[-1].strip()}" if last else head
    text = " ".join(raw.split()) or type(e).__name__
    text = f"{type(e).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_finite_number(x: Any) -> bool:
    """``x`` is a real, finite number (not ``None``/NaN/inf)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
