"""A step's own device memory, on devices that report it (``memory_stats()``: GPU, TPU).

The device's allocator reports ``bytes_in_use`` and ``peak_bytes_in_use``; the peak
only ever grows over a process (JAX has no reset, jax issue 8096). So in the tuner,
where every trial runs in one process, the peak after a trial is the high-water mark
of everything before it: the arrays of earlier trials, and XLA:GPU's compile-time
autotuning scratch (measured on an H200: compiling a T=10^4 LSTM step lifted the peak
from 137 to 255-275 MB with nothing more in use, for steps that need 17-137 MB).

**Method: fill the gap, then watch the mark** (``measured``). Before a piece of work
(a compile, a warm-up run) each device's gap between ``bytes_in_use`` and
``peak_bytes_in_use`` is filled with a throwaway buffer, held while the work runs, so
the device is *at* its high-water mark when the work starts: every byte the work
allocates raises the mark, and ``peak after - in use before`` is exactly what the work
needed above what was already live (the filler counted as live). The filler is freed
right after. The filler is allocated in power-of-two chunks of at least ``CHUNK``
bytes (one small compiled fill per size, cached), so up to ``CHUNK`` of gap may stay
unfilled: when the mark did not rise, the work needed at most that residual gap, and
that bound is recorded (it is the figure's resolution).

Why this and not a fresh process per trial: a process costs ~5 s of device start-up
and imports on a GPU (longer than most trials), and the tuner screens and times in
one process, sharing compiled executables and arguments; the filler costs one
allocation and one free per measured piece of work. What it costs instead: while the
work runs, the device holds the process's old peak plus the work's need, which may
not fit where the work alone would. A work that runs out of memory with a filler held
is therefore run once more without it, and its figure is recorded only if the mark
rose above the old peak anyway (else unknown, ``None``) -- never a number that
includes earlier trials.

Everything here reads devices through ``meters()``, one ``Meter`` per local device
that reports ``bytes_in_use`` and ``peak_bytes_in_use``; on a CPU there is none, so
nothing is filled or recorded and ``measured`` is just a call. Tests replace
``meters`` with stand-in devices that simulate an allocator (``tests/test_device_memory.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from autoremat._measure.device import memory_stats, peak_bytes_in_use

T = TypeVar("T")

#: The smallest filler chunk (bytes): the resolution of a figure whose work stayed
#: under the old mark. Chunks are powers of two from here up.
CHUNK: Final = 1 << 20


@dataclass(frozen=True)
class Stats:
    """One reading of a device's allocator.

    Attributes:
      in_use: ``bytes_in_use``.
      peak: ``peak_bytes_in_use`` (the process's high-water mark).
    """

    in_use: int
    peak: int


class Meter(Protocol):
    """One device's memory, as ``measured`` reads and fills it."""

    def stats(self) -> Stats | None:
        """The allocator's figures now (``None``: unreadable)."""

    def fill(self, nbytes: int) -> Callable[[], None]:
        """Hold about ``nbytes`` (at most; chunks of ``CHUNK`` and up) on the device;
        returns the function that frees it. Raises when the device cannot hold it."""


class JaxMeter:
    """A JAX device's ``memory_stats()``; the filler is uint8 arrays on that device."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def stats(self) -> Stats | None:
        return _stats(memory_stats(self.device))

    def fill(self, nbytes: int) -> Callable[[], None]:
        import jax
        import jax.numpy as jnp

        held: list[Any] = []

        def free() -> None:
            for arr in held:
                arr.delete()
            held.clear()

        try:
            for size in chunks(nbytes):
                try:
                    held.append(jnp.zeros((size,), jnp.uint8, device=self.device))
                except TypeError:  # a jax without zeros(device=...)
                    held.append(jax.device_put(jnp.zeros((size,), jnp.uint8), self.device))
            jax.block_until_ready(held)  # allocated before the baseline is read
        except BaseException:
            free()
            raise
        return free


def chunks(nbytes: int) -> list[int]:
    """``nbytes`` as powers of two of at least ``CHUNK``, largest first (the rest,
    under ``CHUNK``, is left out)."""
    low = CHUNK.bit_length() - 1
    return [1 << k for k in range(nbytes.bit_length() - 1, low - 1, -1) if nbytes >> k & 1]


def _stats(raw: dict[str, Any] | None) -> Stats | None:
    if not raw:
        return None
    in_use, peak = raw.get("bytes_in_use"), raw.get("peak_bytes_in_use")
    if not isinstance(in_use, int) or not isinstance(peak, int) or peak <= 0:
        return None
    return Stats(in_use, max(peak, in_use))


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
    ``meters()``, else over every device reporting a peak (``device.peak_bytes_in_use``;
    ``None`` when none does)."""
    readings = [m.stats() for m in meters()]
    known = [s.peak for s in readings if s is not None]
    return max(known) if known else peak_bytes_in_use()


def is_out_of_memory(e: BaseException) -> bool:
    """The device ran out of memory (XLA's ``RESOURCE_EXHAUSTED``)."""
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


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


def measured(work: Callable[[], T], devices: Sequence[Meter] | None = None) -> tuple[T, int | None]:
    """``work()``, and the device memory it needed above what was live before it: the
    largest over the devices (module doc). ``None`` on a device without
    ``memory_stats`` (CPU) or where it could not be isolated.

    A work that runs out of memory with a filler held runs once more without one;
    anything else it raises is raised.
    """
    devices = meters() if devices is None else devices
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
