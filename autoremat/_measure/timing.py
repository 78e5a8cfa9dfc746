"""Timing a compiled step: its warm-up, then runs until their median is known.

A step ``measure.compile_step`` sized and did not rule out runs once as a warm-up (its
loss and every floating output must be finite), then ``repeats`` more times, where
``repeats`` adapts to the warm-up time so timing one schedule takes about ``time_budget`` seconds
(between ``min_repeats`` and ``max_repeats`` runs; by default, when the warm-up alone was
longer than ``time_budget``, that one run is the figure); so timing takes at most
``max(time_budget, min_repeats * step)``. It stops sooner once the runs are steady: after
``min_repeats`` runs, as soon as three of them and all but at most one lie within
``STEADY`` (1%) of their median -- more runs would hardly move it: a TPU's runs mostly
agree so (``studies/results/tune_time.md``), and a big model's trial times in three or
four runs instead of ``time_budget``'s worth (12); a busy CPU's seldom do, and time on as
before -- or, from the fifth run, once the last three do: runs that settled after early
outliers (a step's first runs may be slower; by the fifth the median is already the
settled one). By default the warm-up counts as one of those three when it lies within 1%
of the first two runs (it then had no one-time cost to speak of): one run fewer.
``step_seconds`` is the median wall time of those runs, each ended by
``jax.block_until_ready``. On a GPU, ``peak_bytes`` is the device's
``memory_stats()["peak_bytes_in_use"]`` after the runs -- a high-water mark of the whole
process's buffers, an upper bound for this step, shown as the process's; on a TPU there
is none (``device_memory.process_peak``).

The warm-up also gives the step's runtime peak where the platform's method was checked
(``device_memory``; ``measure``'s module doc says what the figures mean), and a step
whose runtime peak is over the budget is not timed further.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from autoremat._errors import one_line
from autoremat._measure import device_memory
from autoremat._measure.failure import RUN, is_out_of_memory, words
from autoremat._measure.measurement import ERROR, OK, OVER_BUDGET, Measurement, Status, fit_figure

#: About how long timing one schedule may take, in seconds (``time_budget``).
DEFAULT_TIME_BUDGET: Final = 5.0
#: Timing stops once ``min_repeats`` runs or more lie within this fraction of their
#: median, one outlier aside (the module doc).
STEADY: Final = 0.01
#: A schedule whose first run takes this many times the best step that fits is cut
#: (``time_compiled``'s ``best``): that run says it is not the pick.
CUT_RATIO: Final = 1.3
#: ... and one whose first ``RANKED_AFTER`` runs all take longer than the best by this
#: fraction is timed no further: it is not the pick, and its median already ranks it
#: (timing it until steady would cost seconds of a tune); nor one whose runs all take less
#: than the best by it: the new best, whatever its median. Only a step within this
#: fraction of the best is timed until its runs are steady: there the order is in doubt
#: (``studies/results/tune_time.md``).
BEATEN: Final = 0.02
#: Runs after which ``BEATEN`` decides (with the default ``min_repeats``; else that many):
#: two runs 2% off the best rank a step as three do where runs agree within 1%, as an
#: accelerator's mostly do (``studies/results/tune_time.md``).
RANKED_AFTER: Final = 2


class TimingGate:
    """A step's timing against other threads' short Python after a compile -- the
    persistent cache's entry writes, which serialize an executable with the GIL kept, and
    a compile's sizing (``measure.compile_step``): a write waits for a timing on another
    thread to end, and a timing for the writes under way (the timing thread's own writes --
    a filler's, a check's -- go through). Writes do not wait for each other, nor for the
    lowerings under ``device_memory.MEASURE_LOCK``: a write queued behind lowerings would
    hold its compile back from the device. One thread times at a time."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._timer: int | None = None
        self._depth = 0
        self._writes = 0

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """The block runs no other thread's write (re-entrant on one thread)."""
        me = threading.get_ident()
        with self._changed:
            self._changed.wait_for(lambda: self._timer == me or (
                self._timer is None and self._writes == 0))
            self._timer, self._depth = me, self._depth + 1
        try:
            yield
        finally:
            with self._changed:
                self._depth -= 1
                if self._depth == 0:
                    self._timer = None
                self._changed.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        """The block waits for a timing on another thread to end."""
        me = threading.get_ident()
        with self._changed:
            self._changed.wait_for(lambda: self._timer in (None, me))
            self._writes += 1
        try:
            yield
        finally:
            with self._changed:
                self._writes -= 1
                self._changed.notify_all()

    def writing(self) -> bool:
        """Whether a write is under way (on any thread)."""
        with self._changed:
            return self._writes > 0


#: The process's gate between timings (``time_compiled``, ``retime.interleaved``)
#: and the compile cache's writes (``autoremat._measure.compile_cache``).
TIMING_GATE: Final = TimingGate()


@dataclass
class Compiled:
    """A step compiled and sized, not yet timed (``measure.compile_step``).

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


def time_compiled(compiled: Compiled, *, budget_bytes: int | None = None,
                  time_budget: float = DEFAULT_TIME_BUDGET, min_repeats: int | None = None,
                  max_repeats: int = 20,
                  on_output: Callable[[Any], None] | None = None,
                  best: float | None = None) -> Measurement:
    """Run a ``compile_step`` result: a warm-up, then the timed runs (module doc).

    ``min_repeats``: the fewest timed runs; by default 3 -- but when the warm-up
    alone took longer than ``time_budget`` (a step of seconds, T=10^5 on a CPU)
    that run is the figure (and the cut test): its one-time costs and its
    run-to-run noise are small against its length, and more runs would
    multiply the cost of every trial.

    ``best``: the best step that fits, in seconds (``None``: time in full). When the
    warm-up and then one timed run each take longer than ``CUT_RATIO`` times it, stop
    there: the measurement has ``step_seconds=None`` and ``cut_seconds`` = that run's
    time -- two runs instead of ``repeats + 1`` for a schedule already slower than one
    measured, and no claim about its median. Once ``RANKED_AFTER`` runs (or, with
    ``min_repeats``, that many) all take longer than ``1 + BEATEN`` times it, or all less
    than ``1 - BEATEN`` times it, stop too, with their median: precision matters where the
    order is in doubt, not behind the pick or clearly ahead of it.
    """
    if compiled.executable is None:
        return compiled.measurement
    # no compile thread traces, nor writes a cache entry, while the step is timed
    with device_memory.MEASURE_LOCK, TIMING_GATE.timing():
        return _Timing(compiled).run(budget_bytes=budget_bytes, time_budget=time_budget,
                                     min_repeats=min_repeats, max_repeats=max_repeats,
                                     on_output=on_output, best=best)


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
            best: float | None) -> Measurement:
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
            cut_after = None if best is None else CUT_RATIO * best
            if cut_after is not None and warmup > cut_after:  # one run decides
                if not samples:
                    samples.append(self.once()[0])
                if samples[0] > cut_after:
                    return self.measurement(OK, loss=loss, cut_seconds=samples[0])
            fewest = 3 if min_repeats is None else min_repeats
            ranked_after = RANKED_AFTER if min_repeats is None else fewest
            repeats = 1 if long_step else max(
                fewest, min(max_repeats, int(time_budget / max(warmup, 1e-6))))
            warm = [warmup] if min_repeats is None and not long_step else []
            while len(samples) < repeats and not (
                    (len(samples) >= fewest and steady(samples))
                    or (len(samples) >= ranked_after and _ranked(samples, best))):
                samples.append(self.once()[0])
                if warm and len(samples) == fewest - 1 and steady(warm + samples):
                    samples = warm + samples  # the warm-up ran as the runs did: it counts
                    break
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


def _ranked(samples: Sequence[float], best: float | None) -> bool:
    """Every run is slower than ``best`` by more than ``BEATEN``, or every run faster by
    more than it: more runs would not change which of the two is faster."""
    return best is not None and (min(samples) > (1 + BEATEN) * best
                                 or max(samples) < (1 - BEATEN) * best)


def steady(samples: Sequence[float]) -> bool:
    """Three samples or more, and all but at most one, lie within ``STEADY`` of their
    median; or five or more, and the last three do (settled after early outliers):
    timing may stop (the module doc)."""
    return _agree(samples, outliers=1) or (len(samples) >= 5 and _agree(samples[-3:], 0))


def spread(samples: Sequence[float]) -> float:
    """How far apart a step's own timed runs lie: their range over their median, the
    slowest left out from four runs on (one outlier, as ``steady`` allows one); 0.0 for
    fewer than two runs (no spread is known). Two timings of one program differ by about
    this much, so step times closer than it are not told apart (a TPU's runs mostly agree
    within ``STEADY``, a busy CPU's seldom do)."""
    runs = sorted(samples)
    if len(runs) >= 4:
        runs = runs[:-1]
    if len(runs) < 2:
        return 0.0
    mid = statistics.median(runs)
    return (runs[-1] - runs[0]) / mid if mid > 0 else 0.0


def _agree(samples: Sequence[float], outliers: int) -> bool:
    """Three or more of ``samples``, and all but ``outliers``, within ``STEADY`` of their
    median."""
    mid = statistics.median(samples)
    near = sum(abs(x - mid) <= STEADY * mid for x in samples)
    return mid > 0 and near >= 3 and near >= len(samples) - outliers


def _check_finite(out: Any) -> tuple[float | None, str]:
    """The scalar loss (if any) and a description of the first non-finite output. The
    check runs where the outputs are (one small compiled program per output structure):
    only a flag per output comes back, not the outputs (a big model's parameters and
    optimizer state, 52 MB from a TPU after every warm-up)."""
    import jax
    import numpy as np

    floating = [(path, leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(out)
                if np.issubdtype(leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype,
                                 np.floating)]
    if not floating:
        return None, ""
    loss = next((float(np.asarray(leaf).reshape(())) for _, leaf in floating
                 if np.size(leaf) == 1), None)
    flags = np.asarray(_finite_flags()([leaf for _, leaf in floating]))
    for (path, _), finite in zip(floating, flags, strict=True):
        if not finite:
            return loss, f"output {jax.tree_util.keystr(path) or '()'} has NaN/inf"
    return loss, ""


@functools.cache
def _finite_flags() -> Callable[[list[Any]], Any]:
    """A compiled check: for each array, whether every element is finite."""
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda leaves: jnp.stack([jnp.isfinite(x).all() for x in leaves]))
