"""Durations as people write them: ``90``, ``90s``, ``5m``, ``1.5h`` (stdlib only)."""

from __future__ import annotations

import math
import re
from typing import Final

from autoremat._errors import TuneError

_UNITS: Final = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


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
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise TuneError(f"{name}: expected a duration > 0 such as 90, 90s, 5m or 1.5h, "
                        f"got {value!r}")
    return seconds
