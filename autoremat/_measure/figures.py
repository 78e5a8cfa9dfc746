"""The records a ``Measurement`` is made of, each flattening itself into a study's attrs.

``Sizes`` (what the compiler said), ``DevicePeaks`` (what the device's allocator said),
``Timing`` (the runs), ``Where`` (the device and software, the mesh), ``Failure`` (where
and why it failed) and ``Proof`` (the proof of fit). ``autoremat._measure.measure`` says
what each figure means (its module doc); ``Measurement`` documents them one by one.

At the study boundary every record is flat: ``to_attrs`` gives its fields under their
own names, JSON-safe (pairs as lists), and ``from_attrs`` reads them back from a mapping
holding other keys too (a trial's user attrs, a schedule's ``meta``), a field left out
keeping its default. Field names are unique across the records, so the flat attrs of a
``Measurement`` are those of a single flat record: studies written before the records
read the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final, TypeVar

from autoremat._measure.failure import FailedAt

R = TypeVar("R")

Pairs = tuple[tuple[str, int], ...]
Named = tuple[tuple[str, str], ...]


def _pairs(value: Any) -> Pairs:
    """``(name, bytes)`` pairs from pairs (trial attrs) or a mapping (``meta``)."""
    items = value.items() if isinstance(value, Mapping) else (value or ())
    return tuple((str(name), int(size)) for name, size in items)


def _named(value: Any) -> Named:
    """``(name, text)`` pairs from pairs (trial attrs) or a mapping (``meta``)."""
    items = value.items() if isinstance(value, Mapping) else (value or ())
    return tuple((str(name), str(how)) for name, how in items)


#: How a field stored as a list reads back (every other field reads back as stored).
_READ: Final = {"argument_parts": _pairs, "argument_sharding": _named,
                "step_samples": lambda v: tuple(v or ())}


def to_attrs(record: Any) -> dict[str, Any]:
    """``record``'s fields by name, tuples as lists (JSON-safe)."""
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        out[f.name] = ([list(v) if isinstance(v, tuple) else v for v in value]
                       if isinstance(value, tuple) else value)
    return out


def from_attrs(cls: type[R], attrs: Mapping[str, Any]) -> R:
    """A ``cls`` record of the keys of ``attrs`` that are its fields (others ignored)."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    return cls(**{n: _READ.get(n, _same)(attrs[n]) for n in names if n in attrs})


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Sizes:
    """What the compiler said (``memory_analysis()``), in bytes per device; ``stacked``
    and ``carry`` from the step's autoremat scans (``None``: none recorded)."""

    total_bytes: int | None = None
    temp_bytes: int | None = None
    argument_bytes: int | None = None
    output_bytes: int | None = None
    alias_bytes: int | None = None
    argument_parts: Pairs = ()
    stacked_bytes: int | None = None
    carry_bytes: int | None = None


@dataclass(frozen=True)
class DevicePeaks:
    """What the device's allocator said (GPU, TPU; ``None`` elsewhere)."""

    peak_bytes: int | None = None
    runtime_peak_bytes: int | None = None
    compile_scratch_bytes: int | None = None


@dataclass(frozen=True)
class Timing:
    """The compile's and the runs' seconds; the length they ran at (short runs)."""

    step_seconds: float | None = None
    step_samples: tuple[float, ...] = field(default_factory=tuple)
    compile_seconds: float | None = None
    loss: float | None = None
    cut_seconds: float | None = None
    timed_seq_len: int | None = None
    short_seq_len: int | None = None
    short_seconds: float | None = None
    extrapolated_seconds: float | None = None


@dataclass(frozen=True)
class Where:
    """The device, the software and the mesh it was measured on."""

    device_kind: str = ""
    platform: str = ""
    jax_version: str = ""
    flax_version: str = ""
    devices: int = 1
    mesh: str = ""
    argument_sharding: Named = ()


@dataclass(frozen=True)
class Failure:
    """Where it failed (``""``: it did not), whether for want of memory, and the size the
    compiler stated when it refused so."""

    failed_at: FailedAt = ""
    out_of_memory: bool = False
    compiler_bytes: int | None = None


@dataclass(frozen=True)
class Proof:
    """The proof of fit: the bytes it passed with, or why it failed (``""``: it did not)."""

    fit_proof_bytes: int | None = None
    fit_proof_failed: str = ""


#: The records of a ``Measurement``, by its field name.
RECORDS: Final[dict[str, type]] = {"sizes": Sizes, "peaks": DevicePeaks, "timing": Timing,
                                   "where": Where, "failure": Failure, "proof": Proof}
#: Each flat figure's record (``Measurement``'s field name): the names are unique.
OWNER: Final[dict[str, str]] = {f.name: name for name, cls in RECORDS.items()
                                for f in fields(cls)}
