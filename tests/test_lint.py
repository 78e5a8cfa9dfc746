"""The code base is ruff clean and mypy clean (both configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean() -> None:
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (it comes with the 'test' extra)")
    result = subprocess.run(
        ["ruff", "check", "autoremat", "tests", "examples", "studies"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_clean() -> None:
    """``autoremat/`` type-checks (mypy and its stubs come with the 'test' extra)."""
    pytest.importorskip("mypy", reason="mypy is not installed (it comes with the 'test' extra)")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--hide-error-context"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_public_surface_imports() -> None:
    code = "import autoremat, sys; print(sorted(autoremat.__all__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "scan" in out.stdout and "Schedule" in out.stdout
