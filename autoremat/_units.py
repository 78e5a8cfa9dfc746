"""Byte counts and durations as people write them, and their formatting.

Bytes: ``4GB``, ``4GiB``, ``512MB``, ``1.5G``.

Units (case-insensitive, an optional space before the unit):

* decimal (SI), powers of 1000: ``K``/``KB`` = 10^3, ``M``/``MB`` = 10^6,
  ``G``/``GB`` = 10^9, ``T``/``TB`` = 10^12. A bare letter is decimal:
  ``1.5G`` is 1,500,000,000 bytes.
* binary (IEC), powers of 1024: ``KiB`` = 2^10, ``MiB`` = 2^20, ``GiB`` = 2^30,
  ``TiB`` = 2^40 (``Ki``/``Mi``/``Gi``/``Ti`` too).
* no unit or ``B``: bytes, e.g. ``4000000000``.
* a capital prefix with a lowercase ``b`` (``4Gb``, ``512Mb``) is the usual spelling of
  bits: refused, naming the unit, rather than read as bytes.

The result is rounded to whole bytes and must be at least one byte.

Durations, one syntax for every option that takes one (``--time-limit``,
``--time-budget``, ``--heartbeat``): ``90``, ``90s``, ``5m``, ``1.5h`` (a plain number is
seconds; ``s``, ``m``, ``h``: seconds, minutes, hours).
"""

from __future__ import annotations

import math
import re
from typing import Final

from autoremat._errors import BudgetError, TuneError

_BYTE_UNITS: Final[dict[str, int]] = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6,
    "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20,
    "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}
_BIT_WORDS: Final = {"K": "kilo", "M": "mega", "G": "giga", "T": "tera"}
_POWERS: Final = {"K": 3, "M": 6, "G": 9, "T": 12}
_PATTERN: Final = re.compile(r"(\d+(?:\.\d+)?|\.\d+) ?([a-zA-Z]*)")

ACCEPTED_FORMS: Final = (
    "accepted: a byte count (4000000000) or a number with a unit: 512MB, 4GB, 1.5G "
    "(decimal K/KB, M/MB, G/GB, T/TB = 10^3..10^12) or 4GiB "
    "(binary KiB, MiB, GiB, TiB = 2^10..2^40)"
)


def parse_bytes(text: str | int, name: str = "budget") -> int:
    """Read a byte count such as ``4GB`` (4 * 10^9) or ``4GiB`` (4 * 2^30).

    Raises:
      BudgetError: one line naming ``name``, the bad text and the accepted forms.
    """
    if isinstance(text, bool):
        raise BudgetError(f"{name}: cannot read {text!r}; {ACCEPTED_FORMS}")
    if isinstance(text, int):
        if text < 1:
            raise BudgetError(f"{name}: must be at least 1 byte, got {text}; {ACCEPTED_FORMS}")
        return text
    if not isinstance(text, str):
        raise BudgetError(f"{name}: cannot read {text!r}; {ACCEPTED_FORMS}")
    if text.strip().startswith("-"):
        raise BudgetError(f"{name}: {text.strip()!r} is negative; give a size of at least "
                          f"one byte; {ACCEPTED_FORMS}")
    match = _PATTERN.fullmatch(text.strip())
    unit = match.group(2).lower() if match else None
    if match is not None and re.fullmatch(r"[KMGT]b", match.group(2)):
        prefix = match.group(2)[0]
        raise BudgetError(f"{name}: {text.strip()!r} reads as {_BIT_WORDS[prefix]}bits (a "
                          f"lowercase b is a bit); for bytes write {match.group(1)}{prefix}B "
                          f"({prefix}B = 10^{_POWERS[prefix]} bytes) or {match.group(1)}"
                          f"{prefix}iB (2^{_POWERS[prefix] // 3 * 10} bytes)")
    if match is None or unit not in _BYTE_UNITS:
        raise BudgetError(f"{name}: cannot read {text!r}; {ACCEPTED_FORMS}")
    value = float(match.group(1)) * _BYTE_UNITS[unit]
    if not math.isfinite(value) or round(value) < 1:
        raise BudgetError(f"{name}: {text!r} is less than one byte; {ACCEPTED_FORMS}")
    return round(value)


def format_bytes(n: float | None) -> str:
    """Decimal units, three significant figures: ``6.27 GB``, ``5.4 MB``, ``812 B``."""
    if n is None:
        return "-"
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def format_seconds(s: float | None) -> str:
    """Three significant figures in s, ms or us: ``1.23 s``, ``4.5 ms``, ``812 us``."""
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def has_unit(text: str | int) -> bool:
    """Whether a budget names its unit (``16GB``, ``16B``); ``16`` and an int do not."""
    match = _PATTERN.fullmatch(text.strip()) if isinstance(text, str) else None
    return match is not None and match.group(2) != ""


_DURATION_UNITS: Final = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
DURATION_FORMS: Final = "a duration > 0 such as 90, 90s, 5m or 1.5h"


def parse_duration(value: float | int | str, name: str = "time_limit") -> float:
    """Seconds in ``value``: a number of seconds, or text ``<number>[s|m|h]``.

    Raises:
      TuneError: ``name: expected ...`` when it is not a positive duration.
    """
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*", value.lower())
        if match:
            seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise TuneError(f"{name}: expected {DURATION_FORMS}, got {value!r}")
    return seconds


def parse_whole_seconds(value: int | str, name: str = "heartbeat") -> int:
    """Whole seconds >= 1 in ``value``: an int, or text such as ``60``, ``90s``, ``5m``.

    Raises:
      TuneError: ``name: expected ...`` for anything else (a float, ``1.5``, ``0``).
    """
    seconds = None
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = parse_duration(value, name)
        except TuneError:
            seconds = None
    if seconds is None or seconds < 1 or not seconds.is_integer():
        raise TuneError(f"{name}: expected whole seconds >= 1 such as 60, 90s or 5m, "
                        f"got {value!r}")
    return int(seconds)
