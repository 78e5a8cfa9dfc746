"""A step's own device memory, read where each platform books it.

Two ways a device's allocator books a compiled step's memory, so two methods, one per
platform (``need`` picks it: ``reserved_need``, ``gap_need``), each checked against the
truth (``autoremat._measure.within.bisect_need``) before its figure is used
(``VALIDATED``):

**TPU: the program's reservation** (``reserved_need``). The TPU runtime books a
program's temporaries as a reservation at the bottom of HBM (``bytes_reserved``), made
when the program first runs and held while its executable is loaded; ``bytes_in_use``
and ``peak_bytes_in_use`` never see them. The reservation is the *largest* over the
loaded programs, not a sum (figures: ``studies/results/tpu.md``). So a step's
own need is its outputs (the rise of ``bytes_in_use`` over its first run) plus its
reservation: ``bytes_reserved`` after that run when it rose -- exact (the outputs' rise
includes the program's code, loaded at its first run); when it did not,
a loaded program reserves more and this one's is hidden under it (``None``), unless
what was reserved before is under ``CHUNK`` (then that is the bound). So before the run,
executables nobody holds are collected (``gc.collect``) and what loaded programs still
reserve is taken back: the runtime gives a reservation up when an allocation needs its
room (a filler of all that is not in use, freed at once). Compiling takes no device
memory there.

**GPU: fill the gap, then watch the mark** (``gap_need``). XLA:GPU's allocator books
everything in ``bytes_in_use``; its ``peak_bytes_in_use`` only ever grows over a process
(JAX has no way to reset it), so the peak after a trial is the high-water mark of
everything before it, XLA:GPU's compile-time autotuning scratch included. Before a piece
of work (a compile, a warm-up run) each device's gap between ``bytes_in_use`` and
``peak_bytes_in_use`` is filled with a throwaway buffer, held while the work runs, so
the device is *at* its high-water mark when the work starts: every byte the work
allocates raises the mark, and ``peak after - in use before`` is exactly what the work
needed above what was already live. The filler is allocated in chunks of at least
``CHUNK`` bytes (``chunks``), so up to ``CHUNK`` of gap may stay unfilled: when the mark did
not rise, the work needed at most that residual gap (the figure's resolution). A work
that runs out of memory with a filler held runs once more without it, and its figure
is recorded only if the mark rose above the old peak anyway (else ``None``).

``VALIDATED`` names the platforms whose method was checked against the truth on a real
device (``studies/device_check.py``; its results in ``studies/results/``):
``measured`` returns a figure only there -- elsewhere ``None``, and ``unmeasured_reason``
says why, so an unchecked method never prints a number as measured.

Everything here reads devices through ``meters()``, one ``Meter`` per local device that
reports ``bytes_in_use`` and ``peak_bytes_in_use`` (read by ``autoremat._measure.allocator``,
the one reader of ``memory_stats()``); on a CPU there is none, so nothing is
filled or recorded and ``measured`` is just a call. Tests replace ``meters`` with
stand-in devices that simulate an allocator (``tests/test_device_memory.py``).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol, TypeVar

from autoremat._measure.allocator import Stats, read
from autoremat._measure.failure import is_out_of_memory
from autoremat._schedules.platforms import RESERVING_PLATFORMS

T = TypeVar("T")

#: Held while the device is measured: its memory around a piece of work (``need``,
#: ``within.runs_within``) and a step's timing (``timing.time_compiled``); and by every lowering
#: (``measure.compile_step``). A tuner's compile thread (``autoremat._search.planning.compile_pool``)
#: builds and lowers its step under it -- a build may put arrays on the device, a trace
#: holds the GIL a timed run waits for -- so a figure is the work's alone; only XLA's
#: compile, outside the GIL, runs beside a timing.
MEASURE_LOCK: Final = threading.RLock()

#: The smallest filler chunk (bytes): the resolution of a figure whose work stayed
#: under the old mark.
CHUNK: Final = 1 << 20

#: Filler chunks are ``CHUNK`` times a power of this: four sizes up to a 16-GiB chip (1 MiB
#: to 4 GiB), where powers of two meet a dozen. A device compiles a fill of zeros once per
#: size, on the measuring thread under ``MEASURE_LOCK``
#: (``studies/results/tune_time_v5e_workers.md``).
LADDER: Final = 16

#: Platforms whose method was checked against ``within.bisect_need`` on a real device, and where
#: that check is written down. ``measured`` gives a figure only on these.
VALIDATED: Final[Mapping[str, str]] = {
    "tpu": "studies/results/tpu.md: within 0.5% of the bisected need for every step of "
           "80 MB or more; 0.5-1.7 MB over it (never under) for steps of 1-4 MB",
}


class Meter(Protocol):
    """One device's memory, as ``measured`` reads and fills it."""

    @property
    def platform(self) -> str:
        """The device's platform (``tpu``, ``gpu``, ...): which method measures it."""

    def stats(self) -> Stats | None:
        """The allocator's figures now (``None``: unreadable)."""

    def fill(self, nbytes: int, exact: bool = False) -> Callable[[], None]:
        """Hold about ``nbytes`` on the device (chunks of ``CHUNK`` and up, the rest under
        ``CHUNK`` left out unless ``exact``); returns the function that frees it. Raises
        when the device cannot hold it."""


class JaxMeter:
    """A JAX device's ``memory_stats()``; the filler is uint8 arrays on that device."""

    def __init__(self, device: Any) -> None:
        self.device = device

    @property
    def platform(self) -> str:
        return str(self.device.platform)

    def stats(self) -> Stats | None:
        return read(self.device)

    def fill(self, nbytes: int, exact: bool = False) -> Callable[[], None]:
        import jax
        import jax.numpy as jnp

        held: list[Any] = []

        def free() -> None:
            for arr in held:
                arr.delete()
            held.clear()

        try:
            for size in chunks(nbytes, exact=exact):
                try:
                    held.append(jnp.zeros((size,), jnp.uint8, device=self.device))
                except TypeError:  # a jax without zeros(device=...)
                    held.append(jax.device_put(jnp.zeros((size,), jnp.uint8), self.device))
            jax.block_until_ready(held)  # allocated before the baseline is read
        except BaseException:
            free()
            raise
        return free


def chunks(nbytes: int, exact: bool = False) -> list[int]:
    """``nbytes`` as chunks of ``CHUNK`` times a power of ``LADDER``, largest first, at most
    ``LADDER - 1`` of a size; the rest, under ``CHUNK``, is left out -- or, with ``exact``,
    one last chunk of its own."""
    size = CHUNK
    while size * LADDER <= nbytes:
        size *= LADDER
    sizes: list[int] = []
    rest = nbytes
    while size >= CHUNK:
        count, rest = divmod(rest, size)
        sizes += [size] * count
        size //= LADDER
    return [*sizes, rest] if exact and rest > 0 else sizes


def meters() -> list[Meter]:
    """One ``Meter`` per local device that reports ``bytes_in_use`` and
    ``peak_bytes_in_use`` (GPU, TPU); empty on a CPU."""
    import jax

    found: list[Meter] = []
    for device in jax.local_devices():
        meter = JaxMeter(device)
        if meter.stats() is not None:
            found.append(meter)
    return found


def process_peak() -> int | None:
    """The process's high-water mark: the largest ``peak_bytes_in_use`` over the
    ``meters()`` (``None``: none reports one). ``None`` on a TPU: its mark counts no
    program's temporaries, and taking a reservation back (``reserved_need``, while the
    search holds its best's executable for the proof) lifts it to the chip's size."""
    readings = [m.stats() for m in meters() if m.platform not in RESERVING_PLATFORMS]
    return max((s.peak for s in readings if s is not None), default=None)


def unmeasured_reason(platform: str) -> str:
    """Why a device figure is ``-`` on ``platform`` ("" where it is measured: ``VALIDATED``;
    on a CPU, which has no device memory to read)."""
    if platform in VALIDATED or platform in ("", "cpu"):
        return ""
    return (f"not measured: the {platform} method ({_method_name(platform)}) has not yet been "
            "checked against a bisection on the device (studies/device_check.py)")


def _method_name(platform: str) -> str:
    return ("the program's reservation" if platform in RESERVING_PLATFORMS
            else "fill the gap, watch the mark")


def measured(work: Callable[[], T], devices: Sequence[Meter] | None = None, *,
             compiling: bool = False) -> tuple[T, int | None]:
    """``work()``, and the device memory it needed above what was live before it: the
    largest over the devices (module doc). ``None`` on a device without ``memory_stats``
    (CPU), on a platform whose method is not ``VALIDATED``, or where it could not be
    isolated. ``compiling``: the work compiles (a TPU compile takes no device memory:
    ``None`` there).
    """
    devices = meters() if devices is None else devices
    if not devices:
        return work(), None
    platform = devices[0].platform
    if platform not in VALIDATED or (compiling and platform in RESERVING_PLATFORMS):
        return work(), None
    return need(work, devices)


def need(work: Callable[[], T], devices: Sequence[Meter]) -> tuple[T, int | None]:
    """``work()`` and its need by its platform's method, validated or not (what
    ``studies/device_check.py`` checks; ``measured`` is this where it was checked).
    Holds ``MEASURE_LOCK``."""
    with MEASURE_LOCK:
        if devices and devices[0].platform in RESERVING_PLATFORMS:
            return reserved_need(work, devices)
        return gap_need(work, devices)


# --------------------------------------------------------------------------- TPU


def reserved_need(work: Callable[[], T], devices: Sequence[Meter]) -> tuple[T, int | None]:
    """The TPU method (module doc): outputs + the program's reservation, per device."""
    gc.collect()  # an executable nobody holds gives its reservation back
    for m in devices:
        _evict(m)
    before = [m.stats() for m in devices]
    result = work()
    after = [m.stats() for m in devices]
    needs = [_program_need(b, a) for b, a in zip(before, after, strict=True)]
    known = [n for n in needs if n is not None]
    return result, (max(known) if known and len(known) == len(needs) else None)


def _evict(meter: Meter) -> None:
    """Make the runtime give back what loaded programs reserve, where it is over ``CHUNK``:
    a filler of all that is not in use needs that room (best effort)."""
    s = meter.stats()
    if s is None or s.limit is None or s.reserved is None or s.reserved < CHUNK:
        return
    with contextlib.suppress(Exception):  # no room: the figure says so (None)
        meter.fill(s.limit - s.in_use - CHUNK)()


def _program_need(before: Stats | None, after: Stats | None) -> int | None:
    if before is None or after is None or before.reserved is None or after.reserved is None:
        return None
    outputs = max(0, after.in_use - before.in_use)
    if after.reserved > before.reserved:
        return outputs + after.reserved
    return outputs + before.reserved if before.reserved < CHUNK else None


# --------------------------------------------------------------------------- GPU


class _Window:
    """One device during one piece of work: filled (or not), its baseline, its rise."""

    def __init__(self, meter: Meter, fill: bool) -> None:
        self.meter = meter
        self.release: Callable[[], None] | None = None
        before = meter.stats()
        gap = 0 if before is None else before.peak - before.in_use
        if fill and gap >= CHUNK:
            try:
                self.release = meter.fill(gap)
            except Exception:  # no room for it: not isolated, said by the figure
                self.release = None
        self.filled = self.release is not None
        self.base = meter.stats()

    def rise(self) -> int | None:
        """What the work needed above the baseline (bytes): exact when the mark rose;
        else at most the unfilled gap -- that bound when it is under ``CHUNK``, else
        unknown (``None``)."""
        after = self.meter.stats()
        if self.base is None or after is None:
            return None
        if after.peak > self.base.peak:
            return after.peak - self.base.in_use
        gap = self.base.peak - self.base.in_use
        return gap if gap < CHUNK else None

    def close(self) -> None:
        if self.release is not None:
            self.release()
            self.release = None


def gap_need(work: Callable[[], T], devices: Sequence[Meter]) -> tuple[T, int | None]:
    """The GPU method (module doc). A work that runs out of memory with a filler held
    runs once more without one; anything else it raises is raised."""
    if not devices:
        return work(), None
    windows = _open(devices, fill=True)
    try:
        return _finish(work, windows)
    except Exception as e:
        if not (is_out_of_memory(e) and any(w.filled for w in windows)):
            raise
    return _finish(work, _open(devices, fill=False))


def _open(devices: Sequence[Meter], *, fill: bool) -> list[_Window]:
    windows: list[_Window] = []
    try:
        for meter in devices:
            windows.append(_Window(meter, fill))
    except BaseException:
        for w in windows:
            w.close()
        raise
    return windows


def _finish(work: Callable[[], T], windows: list[_Window]) -> tuple[T, int | None]:
    """Run ``work`` in the opened windows, read each rise, then free every filler."""
    try:
        result = work()
        rises = [w.rise() for w in windows]
    finally:
        for w in windows:
            w.close()
    known = [r for r in rises if r is not None]
    return result, (max(known) if known and len(known) == len(rises) else None)
