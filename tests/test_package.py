"""The wheel installs and works without the checkout: a file missing from the package is caught.

Builds the wheel from a copy of the checkout (nothing is written into the checkout), installs it
with ``--no-deps`` into a scratch venv that sees the dependencies this test runs with (a ``.pth``
file naming this interpreter's site-packages: in a virtual environment those are the venv's, which
``--system-site-packages`` would miss), and from a folder outside the checkout runs ``autoremat --help``
and imports ``autoremat``, ``autoremat.linen`` and ``autoremat.nnx`` -- checking they come from
the venv, not from the checkout or an editable install. The build runs without build isolation
when the installed setuptools meets ``[build-system] requires``, else with it (pip fetches
setuptools from the package index); with neither possible the test is skipped with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "dist", "runs", ".venv",
                                ".*_cache", ".hypothesis", "*.db", "*.png")
OFFLINE = ("No matching distribution", "Could not find a version", "NewConnectionError",
           "Temporary failure in name resolution", "Network is unreachable", "ProxyError")


def _env() -> dict[str, str]:
    """The environment without this test run's ``PYTHONPATH`` (it would shadow the wheel)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(*cmd: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True,
                          check=False, timeout=300)


def _setuptools_floor() -> tuple[int, ...]:
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'"setuptools>=([\d.]+)"', text)
    assert found, "pyproject.toml: [build-system] requires names no setuptools floor"
    return tuple(int(p) for p in found.group(1).split("."))


def _can_build_in_place() -> bool:
    """The installed setuptools meets the floor (>= 70.1 writes wheels without the ``wheel`` package)."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(p) for p in re.findall(r"\d+", setuptools.__version__)[:2])
    return version >= _setuptools_floor()


def _build_wheel(src: Path, out: Path) -> Path:
    flags = ["--no-build-isolation"] if _can_build_in_place() else []
    result = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", *flags, "-w", out, src, cwd=src)
    if result.returncode != 0:
        log = result.stdout + result.stderr
        if not flags and any(s in log for s in OFFLINE):
            pytest.skip("cannot build the wheel: the installed setuptools is older than pyproject's "
                        "[build-system] floor and the package index is unreachable for an isolated "
                        f"build ({log.strip().splitlines()[-1]})")
        pytest.fail(f"pip wheel failed:\n{log[-3000:]}")
    wheels = list(out.glob("autoremat-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _see_these_dependencies(python: Path, cwd: Path) -> None:
    """Let the scratch venv import what this interpreter imports (jax, optax, pip, ...): a
    ``.pth`` file in its site-packages naming ours and this run's ``PYTHONPATH`` folders but
    the checkout, as plain paths, so no ``.pth`` file of ours runs there (an editable install
    of autoremat would shadow the wheel)."""
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    if site.ENABLE_USER_SITE and Path(site.getusersitepackages()).is_dir():
        ours.add(site.getusersitepackages())
    # where jax itself comes from PYTHONPATH (a TPU machine's): those folders, not the checkout
    ours |= {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
             if p and Path(p).is_dir() and Path(p).resolve() != ROOT.resolve()}
    theirs = _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=cwd)
    assert theirs.returncode == 0, theirs.stderr
    pth = Path(theirs.stdout.strip()) / "_test_dependencies.pth"
    pth.write_text("".join(f"{p}\n" for p in sorted(ours)))


def test_the_wheel_installs_and_runs_outside_the_checkout(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=IGNORE)
    wheel = _build_wheel(src, tmp_path / "dist")

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        license_text = next((z.read(n).decode() for n in names
                             if re.fullmatch(r"autoremat-[^/]+\.dist-info/licenses/LICENSE", n)), "")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text, names
    assert "autoremat/py.typed" in names and "autoremat/cli.py" in names
    assert "autoremat/_schedules/maxtext_names.json" in names  # MaxText's pinned names

    venv = tmp_path / "venv"
    made = _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    _see_these_dependencies(python, tmp_path)
    installed = _run(python, "-m", "pip", "install", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    helped = _run(venv / "bin" / "autoremat", "--help", cwd=elsewhere)
    assert helped.returncode == 0, helped.stderr
    assert "tune" in helped.stdout and "pareto" in helped.stdout

    code = ("import autoremat, autoremat.linen, autoremat.nnx\n"
            "for m in (autoremat, autoremat.linen, autoremat.nnx): print(m.__file__)\n"
            "print(autoremat.root(100, 2).describe())\n")
    imported = _run(python, "-c", code, cwd=elsewhere)
    assert imported.returncode == 0, imported.stderr
    *files, described = imported.stdout.strip().splitlines()
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                     cwd=elsewhere).stdout.strip())
    for f in files:
        assert Path(f).resolve().is_relative_to(site.resolve()), (f, site)
    assert described.startswith("10x10"), described
