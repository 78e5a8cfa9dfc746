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

The module docstrings of ``examples/*.py`` show commands too: every indented line starting
``python examples/`` or ``autoremat `` is one. Each is checked (the file it names exists,
an ``autoremat`` line parses, ``--problem file.py:name`` names a top-level name) and run,
an example's commands in order in one scratch folder, at the small size ``SMALL`` gives it
(its size variables; size flags appended to its ``python`` lines; a two-trial ``tune``),
unless its trailing comment says ``# not run: REASON``. ``SMALL`` marks an example whose
commands tune as ``slow``.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
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
    logger = logging.getLogger("autoremat")  # a snippet may show tune's log: not afterwards
    handlers, level = list(logger.handlers), logger.level
    try:
        for block in runnable:
            if block.lang == "bash":
                _run_bash(block, tmp_path, env)
            else:
                _run_python(block, namespace)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        logger.handlers[:] = handlers
        logger.setLevel(level)


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


# -- the commands the examples' docstrings show -------------------------------------------

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
SHOWN = re.compile(r"^ {4,}((?:python examples/|autoremat )\S.*?)\s*$")
COMMENT = re.compile(r"\s+#\s?(.*)$")
DOC_NOT_RUN = re.compile(r"^not run:(.*)$")
TUNE_SMALL = "--trials 2 --time-budget 0.05 --no-progress"  # appended to a shown tune


@dataclass(frozen=True)
class Small:
    """An example's commands at a small size: ``env``, its size variables; ``flags``,
    appended to each of its ``python examples/...`` lines (a repeated flag's last value
    wins); ``slow``, why they run only under ``-m slow`` (empty: in the default suite)."""

    env: Mapping[str, str] = field(default_factory=dict)
    flags: str = ""
    slow: str = ""


def _stack(prefix: str) -> dict[str, str]:
    sizes = {"LAYERS": "2", "D_MODEL": "16", "HEADS": "2", "MLP": "32", "SEQ_LEN": "8", "BATCH": "2"}
    return {f"{prefix}_{k}": v for k, v in sizes.items()}


TUNES = "tunes a problem (15-25 s with its other commands, at this size on 2 cores)"
SMALL: dict[str, Small] = {
    "data_parallel.py": Small(flags="--seq-len 16 --hidden 8",
                              slow="two runs on a forced 4-device host, about 12 s; "
                              "docs/many_devices.md runs it in the default suite"),
    "equinox_stack.py": Small(env=_stack("EQX_STACK"), slow=TUNES),
    "nnx_stack.py": Small(env=_stack("NNX_STACK"), slow=TUNES),
    "seed_lstm.py": Small(flags="--seq-len 24 --hidden 8 --batch 2",
                          slow="four runs of the script, about 4 s each; tests/test_parity.py "
                               "and tests/test_fuse.py run its main() in the default suite"),
    "seed_lstm_nnx.py": Small(env={"SEED_LSTM_NNX_SEQ_LEN": "24", "SEED_LSTM_NNX_HIDDEN": "8"},
                              flags="--seq-len 24 --hidden 8", slow=TUNES),
    # T=64: remat_scans' default min_length
    "seed_unmodified.py": Small(env={"SEED_SEQ_LEN": "64", "SEED_STEPS": "2"}, slow=TUNES),
    "user_transformer.py": Small(env=_stack("USER"), slow=TUNES),
}


@dataclass(frozen=True)
class Shown:
    """One command an example's docstring shows."""

    example: Path
    line: int  # 1-based line in the example
    command: str  # as shown, less its trailing comment
    not_run: str | None  # the reason, when its comment is ``not run: REASON``

    @property
    def where(self) -> str:
        return f"{self.example.relative_to(ROOT)}:{self.line}"


def shown(example: Path) -> list[Shown]:
    """The commands of ``example``'s module docstring, in order."""
    source = example.read_text()
    first = ast.parse(source).body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
        return []
    lines = source.splitlines()
    out = []
    for n in range(first.lineno, (first.end_lineno or first.lineno) + 1):
        match = SHOWN.match(lines[n - 1])
        if match:
            command, comment = COMMENT.split(match.group(1), maxsplit=1)[0], COMMENT.search(match.group(1))
            marker = DOC_NOT_RUN.match(comment.group(1).strip()) if comment else None
            out.append(Shown(example, n, command, marker.group(1).strip() if marker else None))
    return out


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_every_command_an_example_shows_is_known_and_parses() -> None:
    from autoremat._cli.settings import UsageError
    from autoremat.cli import _parser

    commands = [c for e in EXAMPLES for c in shown(e)]
    assert len(commands) >= 10, "the examples' docstrings show fewer commands than expected"
    for c in commands:
        assert c.not_run is None or c.not_run, f"{c.where}: write # not run: REASON with a reason"
        assert c.example.name in SMALL or c.not_run, (
            f"{c.where}: say in SMALL (tests/test_docs.py) how {c.example.name}'s commands run small")
        words = shlex.split(c.command)
        if words[0] == "python":
            assert (ROOT / words[1]).is_file(), f"{c.where}: no file {words[1]}"
            continue
        try:
            args = _parser().parse_args(words[1:])
        except (SystemExit, UsageError) as e:
            raise AssertionError(f"{c.where}: {c.command!r} is a usage error: {e}") from e
        problem = getattr(args, "problem", None)
        if problem and ".py:" in problem:
            path, name = problem.rsplit(":", 1)
            assert name in _top_level_names(ROOT / path), f"{c.where}: {path} defines no {name}"


def _example_params() -> list[Any]:
    params = []
    for example in EXAMPLES:
        if any(c.not_run is None for c in shown(example)) and example.name in SMALL:
            marks = [pytest.mark.slow] if SMALL[example.name].slow else []
            params.append(pytest.param(example, marks=marks, id=example.name))
    return params


@pytest.mark.parametrize("example", _example_params())
def test_the_commands_of_an_example_run(example: Path, tmp_path: Path) -> None:
    small = SMALL[example.name]
    env = {**_sandbox(tmp_path), **small.env}
    for c in shown(example):
        if c.not_run is not None:
            continue
        extra = (small.flags if c.command.startswith("python ")
                 else TUNE_SMALL if c.command.startswith("autoremat tune ") else "")
        _run_bash(Block(example, c.line, "bash", f"{c.command} {extra}\n", None), tmp_path, env)
