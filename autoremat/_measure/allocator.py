"""The one reader of a device's allocator: ``device.memory_stats()`` (GPU, TPU), whose
keys are named here only.

``read(device)`` is one reading as ``Stats`` (``None`` where the device reports no
``bytes_in_use`` and ``peak_bytes_in_use``: a CPU); ``limit_bytes()`` is the default
device's ``bytes_limit`` (the command's default budget). ``autoremat._measure.device_memory``
measures a step's own need, and the process's high-water mark, from these readings.
Each function imports jax when called (``import autoremat`` stays jax-free).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

#: The allocator's keys: bytes held now, the process's high-water mark (it never goes
#: down), what loaded programs reserve (TPU), and what it may hand out in all.
IN_USE: Final = "bytes_in_use"
PEAK: Final = "peak_bytes_in_use"
RESERVED: Final = "bytes_reserved"
LIMIT: Final = "bytes_limit"


@dataclass(frozen=True)
class Stats:
    """One reading of a device's allocator.

    Attributes:
      in_use: ``bytes_in_use``.
      peak: ``peak_bytes_in_use`` (the process's high-water mark).
      reserved: ``bytes_reserved`` (TPU: the largest loaded program's temporaries).
      limit: ``bytes_limit`` (what the allocator may hand out in all).
    """

    in_use: int
    peak: int
    reserved: int | None = None
    limit: int | None = None


def read(device: Any) -> Stats | None:
    """``device``'s allocator now; ``None`` where it reports no ``bytes_in_use`` and
    positive ``peak_bytes_in_use`` (a CPU, or a backend without ``memory_stats``)."""
    try:
        raw = device.memory_stats()
    except Exception:
        return None
    return stats(raw) if isinstance(raw, Mapping) else None


def stats(raw: Mapping[str, Any] | None) -> Stats | None:
    """A ``memory_stats()`` mapping as ``Stats`` (``read``)."""
    if not raw:
        return None
    in_use, peak = raw.get(IN_USE), raw.get(PEAK)
    if not isinstance(in_use, int) or not isinstance(peak, int) or peak <= 0:
        return None
    reserved, limit = raw.get(RESERVED), raw.get(LIMIT)
    return Stats(in_use, max(peak, in_use), reserved if isinstance(reserved, int) else None,
                 limit if isinstance(limit, int) and limit > 0 else None)


def limit_bytes() -> int | None:
    """The default device's memory limit (GPU/TPU ``bytes_limit``), else ``None``."""
    import jax

    reading = read(jax.devices()[0])
    return None if reading is None else reading.limit
