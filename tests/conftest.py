"""Shared fixtures: a PostgreSQL server for the tests marked ``postgres``; quick XLA
compiles for the default suite, on the CPU; the accelerator for the tests marked ``device``;
a check that no test writes into the ``runs/`` folder of the folder pytest runs in (the
user's own studies: a test's studies go to its ``tmp_path``).

``.ci/run`` starts a throwaway server on 127.0.0.1 and exports
``AUTOREMAT_TEST_POSTGRES_URL``; locally, point it at any server you may
create databases on. Without it (or when the server does not answer) those
tests are skipped with the reason, never passed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

OPT_FLAG = "--xla_backend_optimization_level"
#: XLA:CPU's older code generation for fused loops, where the jaxlib still has it.
EMITTER_FLAG = "--xla_cpu_use_fusion_emitters"
CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
POSTGRES_ENV = "AUTOREMAT_TEST_POSTGRES_URL"
NO_POSTGRES = f"no PostgreSQL server: set {POSTGRES_ENV} (.ci/run starts one)"
#: The folder pytest runs in: its ``runs/`` (the default studies, the last study) is the
#: user's, and no test may change it.
USER_RUNS = Path.cwd().resolve() / "runs"


def pytest_configure(config: pytest.Config) -> None:
    """Where the suite runs, and how fast it compiles.

    **xdist's workers run on the CPU** (``JAX_PLATFORMS=cpu`` unless set): on a machine
    with an accelerator the default suite is the same as on any CPU -- its memory
    assertions are the CPU compiler's, its values compared at the CPU's precision -- and
    several workers never fight over a device that one process at a time may hold (a
    TPU). The tests marked ``device`` check the accelerator itself: they run in one
    process that holds it, ``python -m pytest -m device -n 0``, and skip elsewhere.

    The default suite (no ``-m`` that selects ``slow`` or ``device``) compiles with XLA's
    LLVM backend at -O0. Most of the suite's time is XLA compiling small steps; -O0 cuts
    that by ~40% and changes nothing a default test checks (values, gradients and compiled
    memory are decided before the backend's code generation; the generated code runs ~3x
    slower, and no default test asserts a time). Set in the environment before jax starts,
    so the CLI subprocesses get it too. ``-m slow`` (the benchmarks) and ``-m device`` keep
    full optimization, and so does an ``XLA_FLAGS`` that sets the level itself.

    The default suite also turns XLA:CPU's fusion emitters off (``EMITTER_FLAG=false``:
    the older code generation of fused loops), where the jaxlib has that flag: there a
    step compiles in about half the time, and the suite takes about a third less
    (``studies/results/suite_time.md``). Values and gradients come from the same program
    and are compared with references compiled alike; compiled memory is the same on the
    seed LSTM and a few hundred bytes apart on the bf16 layer stack (a figure no test
    pins).
    Newer jaxlibs have only the emitters, and an XLA flag a jaxlib does not know aborts
    the process, so the first process asks a throwaway one whether it starts with it.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") and "JAX_PLATFORMS" not in os.environ:
        os.environ["JAX_PLATFORMS"] = "cpu"
    flags = os.environ.get("XLA_FLAGS", "")
    selects = config.option.markexpr.replace("not slow", "")
    if "slow" not in selects and "device" not in selects and OPT_FLAG not in flags:
        flags = f"{flags} {OPT_FLAG}=0".strip()
        if not os.environ.get("PYTEST_XDIST_WORKER") and EMITTER_FLAG not in flags:
            flags = _with_if_known(flags, f"{EMITTER_FLAG}=false")  # workers inherit it
        os.environ["XLA_FLAGS"] = flags
    if CACHE_ENV not in os.environ:  # the first process (xdist's workers inherit it)
        # Many tests compile the same small steps (the tiny and seed problems, the CLI's
        # subprocesses): JAX's persistent compilation cache, for this session only,
        # compiles each once. Compiled memory is read from the cached executable alike.
        cache = tempfile.mkdtemp(prefix="autoremat-tests-xla-")
        atexit.register(shutil.rmtree, cache, ignore_errors=True)
        os.environ[CACHE_ENV] = cache
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The server URL from ``AUTOREMAT_TEST_POSTGRES_URL``, checked to answer."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(NO_POSTGRES)
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(url)
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
    except Exception as e:
        from autoremat._search.storage import redact

        pytest.skip(f"no PostgreSQL server at {redact(url)} ({type(e).__name__}: "
                    f"{' '.join(str(e).split())[:200]}); {NO_POSTGRES}")
    return url


@pytest.fixture()
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database on that server for one test (dropped afterwards)."""
    import sqlalchemy

    name = f"autoremat_t_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    url = sqlalchemy.make_url(postgres_server).set(database=name)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _with_if_known(flags: str, flag: str) -> str:
    """``flags`` with ``flag`` added where a CPU backend starts with it (a flag the jaxlib
    does not know aborts the process), else ``flags``."""
    env = {**os.environ, "XLA_FLAGS": f"{flags} {flag}".strip(), "JAX_PLATFORMS": "cpu"}
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"], env=env,
                           capture_output=True, timeout=300, check=False)
    return env["XLA_FLAGS"] if probe.returncode == 0 else flags


def runs_snapshot(folder: Path = USER_RUNS) -> dict[str, tuple[int, int]] | None:
    """Every file under ``folder``: its size and modification time (``None``: no folder)."""
    if not folder.is_dir():
        return None
    return {str(f.relative_to(folder)): (f.stat().st_size, f.stat().st_mtime_ns)
            for f in folder.rglob("*") if f.is_file()}


@pytest.fixture(autouse=True)
def leaves_the_users_runs_alone() -> Iterator[None]:
    """Fails the test that made, changed or removed anything in the user's ``runs/``
    (a study in the default storage, a last-study record): give it ``tmp_path``."""
    before = runs_snapshot()
    yield
    after = runs_snapshot()
    if after != before:
        pytest.fail(f"this test wrote into {USER_RUNS} (the user's studies); run it in "
                    "tmp_path (monkeypatch.chdir) or give it a storage there", pytrace=False)


@pytest.fixture(autouse=True, scope="module")
def no_bound_outside_its_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """``tune`` compiles what scheduling can save at most before it searches
    (``autoremat._search.bound``), and on a problem whose scans hold almost none of its
    memory -- the tiny RNN most tests search -- times the plain scan alone. That is
    checked in ``tests/test_bound.py`` (and by the commands tests run in a process of
    their own); the other in-process tests (module-scoped searches too) search as they
    test, with the same compiles and trial sequences, so the bound is not measured there."""
    if request.module.__name__.rsplit(".", 1)[-1] == "test_bound":
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("autoremat._search.tune.start_bound", lambda *_a, **_k: None)
        yield
