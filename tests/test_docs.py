"""The README and docs/ say what runs: every fenced command is run, or says why not.

The convention (CONTRIBUTING.md, "Commands and snippets in the docs"): in ``README.md`` and every
``docs/*.md`` (picked up automatically), each ```` ```bash ```` block is run with ``bash -e`` and
each ```` ```python ```` block is executed, in page order, in a scratch folder per page (a copy of
``examples/`` and ``studies/``, a small ``schedule.yaml``; ``python`` and ``autoremat`` are this
interpreter and this checkout). Python blocks of one page share one namespace, which starts with
the names of ``_names()`` (a tiny scan: ``step``, ``init``, ``xs``, ``ys``, ``readout``). A
block is skipped only when the line just before its fence is ``<!-- not run: REASON -->`` with a
non-empty reason (say what runs instead). ```` ```yaml ```` blocks that are schedules (a
``version:`` key) must load. Every relative link must point at an existing file, and
``docs/index.md`` must link every page of ``docs/``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.env import module_path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"^<!--\s*not run:(.*)-->$")
FENCE = re.compile(r"^(`{3,})(\S*)\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
RUN = ("bash", "python")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    not_run: str | None  # the reason, when the line before the fence marks it

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, in order."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == opening.group(1)), None)
        assert end is not None, f"{page.relative_to(ROOT)}:{i + 1}: a fence that is never closed"
        marker = NOT_RUN.match(lines[i - 1].strip()) if i > 0 else None
        out.append(Block(page, i + 1, opening.group(2), "\n".join(lines[i + 1:end]) + "\n",
                         marker.group(1).strip() if marker else None))
        i = end + 1
    return out


def _names() -> dict[str, Any]:
    """What python blocks may use without defining: a tiny tanh RNN over T=24 (time-major)."""
    import jax
    import jax.numpy as jnp

    k = jax.random.split(jax.random.key(0), 4)
    w = jax.random.normal(k[0], (3 + 4, 4)) * 0.3  # input 3, hidden 4
    v = jax.random.normal(k[1], (4, 2)) * 0.3  # readout to 2

    def step(carry: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = jnp.tanh(jnp.concatenate([x, carry], -1) @ w)
        return h, h

    return {"step": step, "init": jnp.zeros((2, 4)),  # batch 2
            "xs": jax.random.normal(k[2], (24, 2, 3)), "ys": jax.random.normal(k[3], (24, 2, 2)),
            "readout": lambda h: h @ v}


def _sandbox(tmp: Path) -> dict[str, str]:
    """A scratch folder like a checkout's root; returns the environment to run commands in."""
    ignore = shutil.ignore_patterns("__pycache__", "*.tmp")
    for name in ("examples", "studies"):
        shutil.copytree(ROOT / name, tmp / name, ignore=ignore)
    (tmp / "schedule.yaml").write_text("version: 1\nkind: nested\nlevels:\n"
                                       "  - {length: 6, policy: nothing_saveable}\n"
                                       "  - {length: 4, policy: dots_saveable}\n")
    bin_dir = tmp / ".bin"
    bin_dir.mkdir()
    for name, args in (("python", ""), ("autoremat", " -m autoremat.cli")):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}"{args} "$@"\n')
        shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = module_path()
    env["MPLBACKEND"] = "Agg"
    env.pop("AUTOREMAT_STORAGE", None)  # studies go to the scratch folder's runs/
    return env


def _run_bash(block: Block, cwd: Path, env: dict[str, str]) -> None:
    result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, (
        f"{block.where}: exit {result.returncode}\n{block.text}\n--- output ---\n"
        f"{textwrap.shorten(result.stdout, 3000)}\n{result.stderr[-3000:]}")


def _run_python(block: Block, namespace: dict[str, Any]) -> None:
    try:
        exec(compile(block.text, block.where, "exec"), namespace)
    except Exception as e:
        raise AssertionError(f"{block.where}: {type(e).__name__}: {e}\n{block.text}") from e


def _runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.lang in RUN and b.not_run is None]


WITH_COMMANDS = [p for p in PAGES if _runnable(p)]


@pytest.mark.parametrize("page", WITH_COMMANDS, ids=[str(p.relative_to(ROOT)) for p in WITH_COMMANDS])
def test_the_commands_of_a_page_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runnable = _runnable(page)
    env = _sandbox(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace = {"__name__": "__docs__", **_names()}
    saved = dict(os.environ)  # a snippet may set XLA_FLAGS: not for the next page's commands
    try:
        for block in runnable:
            if block.lang == "bash":
                _run_bash(block, tmp_path, env)
            else:
                _run_python(block, namespace)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_every_not_run_marker_gives_a_reason_and_sits_on_a_fence() -> None:
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            marker = NOT_RUN.match(line.strip())
            if "not run" in line and line.strip().startswith("<!--"):
                assert marker and marker.group(1).strip(), (
                    f"{page.relative_to(ROOT)}:{i + 1}: write <!-- not run: REASON --> with a reason")
                assert i + 1 < len(lines) and FENCE.match(lines[i + 1]), (
                    f"{page.relative_to(ROOT)}:{i + 1}: the marker must be the line just before a fence")


def test_schedules_shown_in_the_docs_load() -> None:
    from autoremat._schedules import parse_schedule

    shown = [b for page in PAGES for b in blocks(page) if b.lang == "yaml" and "version:" in b.text]
    assert shown, "the docs show no schedule file"
    for block in shown:
        try:
            parse_schedule(block.text)
        except Exception as e:
            raise AssertionError(f"{block.where}: {e}") from e


def test_relative_links_point_at_files() -> None:
    for page in [*PAGES, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            assert path.exists(), f"{page.relative_to(ROOT)}: link to {target}: no such file"


def test_the_docs_index_links_every_page() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    linked = {(ROOT / "docs" / t.split("#", 1)[0]).resolve() for t in LINK.findall(index)}
    for page in PAGES[1:]:
        if page.name != "index.md":
            assert page.resolve() in linked, f"docs/index.md does not link docs/{page.name}"
    assert "docs/index.md" in (ROOT / "README.md").read_text()


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move the detail into docs/"
