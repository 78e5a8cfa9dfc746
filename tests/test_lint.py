"""The code base is ruff clean and mypy clean (both configured in pyproject.toml)."""

from __future__ import annotations

import ast
import re
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


def test_library_messages_name_no_cli_flag() -> None:
    """Only the CLI modules name flags (``--seq-len``); the library names its arguments
    and settings, and the CLI adds its own wording. Docstrings may name either."""
    import argparse

    from autoremat.cli import _parser

    def options(parser: argparse.ArgumentParser) -> set[str]:
        found = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    found |= options(sub)
        return found

    ours = sorted(options(_parser()) - {"--help"}, key=len, reverse=True)
    assert "--seq-len" in ours
    flag = re.compile(r"(?<![\w=-])(" + "|".join(map(re.escape, ours)) + r")(?![\w-])")
    package = ROOT / "autoremat"
    cli = {package / "cli.py", *(package / "_cli").glob("*.py")}
    assert len(cli) > 1 and list(package.glob("_*/*.py"))
    found = []
    for path in sorted(package.glob("**/*.py")):
        if path in cli:
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr)}
        found += [f"{path.relative_to(ROOT)}:{n.lineno}: {n.value}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and id(n) not in docs and flag.search(n.value)]
    assert found == []
