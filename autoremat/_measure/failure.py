"""A measurement's failure as data: where it failed, whether for want of device memory,
and the size the compiler stated.

``Measurement.failed_at`` says where a measurement stopped (``BUILD``: ``problem.build``
raised; ``COMPILE``; ``RUN``: the warm-up or a timed run raised, or gave a non-finite
output), ``Measurement.out_of_memory`` whether the device ran out of memory (XLA's
``RESOURCE_EXHAUSTED``) and ``Measurement.compiler_bytes`` the size the compiler said it
needed (``stated_bytes``). They are stored in a trial's attrs like every figure, so a
reader (the search's worker, a resumed study) asks them, never the reason's words;
``words`` makes those words (``build failed``, ``out of memory at compile``), which
start the printed ``reason``.
"""

from __future__ import annotations

import re
from typing import Final, Literal

#: Where a measurement failed (``""``: it did not).
FailedAt = Literal["", "build", "compile", "run"]
BUILD: Final[FailedAt] = "build"
COMPILE: Final[FailedAt] = "compile"
RUN: Final[FailedAt] = "run"


def words(at: FailedAt, out_of_memory: bool = False) -> str:
    """How the reason of a failure at ``at`` starts: ``compile failed``, or
    ``out of memory at compile`` when the device ran out of memory."""
    return f"out of memory at {at}" if out_of_memory else f"{at} failed"


def is_out_of_memory(e: BaseException) -> bool:
    """The device ran out of memory (XLA's ``RESOURCE_EXHAUSTED``)."""
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


#: Where XLA states a size when it runs out of device memory: the first number is the
#: size asked for ("the total memory required for HLO temporaries (64.06G) exceeds
#: available HBM (15.75G)" at compile on a TPU; "Attempting to reserve 938.52M at the
#: bottom of memory" loading a program there; "... to allocate 123456 bytes").
_STATED: Final = (
    re.compile(r"memory required for [^()]*\((\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\)"),
    re.compile(r"Used\s+(\d+(?:\.\d+)?)([KMGT]?)(?:i?B)? of "),
    re.compile(r"(?:reserve|allocate)\s+(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B|\s*bytes)?\b"),
)
#: XLA prints sizes with binary units (tsl ``HumanReadableNumBytes``: "G" is 2^30 bytes,
#: not 10^9), so "64.06G" is 64.06 GiB.
_UNITS: Final = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def stated_bytes(e: BaseException | str) -> int | None:
    """The size XLA says a program needed when it ran out of device memory (bytes, the
    first size its message states; ``_STATED``), or ``None``: the message names none."""
    text = str(e)
    for pattern in _STATED:
        match = pattern.search(text)
        if match:
            return int(float(match.group(1)) * _UNITS[match.group(2)])
    return None
