"""One set of arguments for compiled steps whose arguments are alike.

Each compile of a problem's step builds its own arguments (``measure.compile_schedule``):
on a device, a big model's parameters and optimizer state once per executable kept. The
planner's sized candidates and the contenders re-timed in turn (``retime``) share one
set where the arguments are alike (``device.arguments_fingerprint``: shapes, dtypes and
shardings).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autoremat._measure.device import arguments_fingerprint
from autoremat._measure.measure import Compiled


class SharedArguments:
    """The first arguments seen (or ``args``, built before), given to every compiled step
    whose arguments are alike."""

    def __init__(self, args: Sequence[Any] | None = None) -> None:
        self.args = args
        self.fingerprint = None if args is None else arguments_fingerprint(args)

    def share(self, compiled: Compiled) -> None:
        """``compiled`` runs on the shared arguments when its own are alike (its own are
        dropped); the first with an executable sets them."""
        if compiled.executable is None:
            return
        fp = arguments_fingerprint(compiled.args)
        if self.fingerprint is None:
            self.args, self.fingerprint = compiled.args, fp
        elif fp == self.fingerprint and self.args is not None:
            compiled.args = self.args
