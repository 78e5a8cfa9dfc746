"""The environment a test's subprocess runs in: this checkout first on the module path, and
the module path this run has after it (on a machine where jax or the packages come from
``PYTHONPATH``, a TPU machine's, replacing it would lose them)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_path() -> str:
    """``PYTHONPATH`` for a subprocess: the checkout, then this run's entries."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    return os.pathsep.join([str(ROOT), *rest])
