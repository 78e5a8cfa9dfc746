"""Compiles paid once (``autoremat._measure.compile_cache``): JAX's persistent compilation
cache in the folder given for the block, its hits counted, JAX's settings as they were
after; a cache the user set is used as it is."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.compilation_cache import compilation_cache

from autoremat._cli.printing import cache_words
from autoremat._measure.compile_cache import no_persistent_cache, persistent_cache
from autoremat._measure.measure import compile_step
from autoremat._measure.timing import TIMING_GATE, TimingGate
from autoremat._search.study import TuneResult
from autoremat._search.tune import compile_cache_folder


def compile_twice() -> None:
    """Two compiles of one step, each from a new ``jit`` (as each of a tune's schedules is)."""
    x = jnp.ones((8, 8))
    for _ in range(2):
        assert compile_step(lambda a: jnp.tanh(a @ a).sum(), (x,)).executable is not None


@pytest.fixture
def no_users_cache() -> Iterator[None]:
    """No cache configured (the suite sets one for itself): restored after."""
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        compilation_cache.reset_cache()


def test_a_program_compiled_twice_is_read_back_the_second_time(
        tmp_path: Path, no_users_cache: None) -> None:
    folder = tmp_path / "xla_cache"
    with persistent_cache(folder) as use:
        compile_twice()
    found = use()
    assert found.own and found.folder == str(folder)
    assert found.hits >= 1 and found.misses >= 1 and found.rate is not None
    assert any(folder.iterdir())  # the executable is on disk: a later tune reads it back
    assert jax.config.jax_compilation_cache_dir is None  # as it was
    result = TuneResult("s", "sqlite://", 1, None, None, None, None, 0, 0, compile_cache=found)
    words = f"{found.hits} of {found.hits + found.misses} schedule compiles read back"
    assert words in cache_words(result)
    with persistent_cache(folder) as again:  # a repeated tune: nothing compiled anew
        compile_twice()
    assert again().misses == 0 and again().hits >= 2


def test_only_a_schedules_compile_is_counted(tmp_path: Path, no_users_cache: None) -> None:
    """A helper's compile (the problem's initialization, a filler) is cached as well but
    not counted: read back on a repeated tune, it would raise the schedules' rate."""
    x = jnp.ones((4, 4))
    folder = tmp_path / "xla_cache"
    for _ in range(2):
        with persistent_cache(folder) as use:
            jax.jit(lambda a: jnp.cos(a @ a).sum()).lower(x).compile()
        assert (use().hits, use().misses) == (0, 0)
    with persistent_cache(folder) as use:
        compile_twice()
    assert (use().hits, use().misses) == (1, 1)


def test_an_entry_is_written_inside_the_timing_gate(
        tmp_path: Path, no_users_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compile thread's cache entry write (the executable serialized: the GIL kept) goes
    through ``TIMING_GATE.write``: it waits for a step's timing to end, where beside one it
    made the timed runs read slow. On leaving, JAX's function is its own again."""
    jax_cache = importlib.import_module("jax._src.compilation_cache")
    gated: list[bool] = []
    real = jax_cache.put_executable_and_time

    def spy(*args: Any, **kwargs: Any) -> Any:
        gated.append(TIMING_GATE.writing())
        return real(*args, **kwargs)

    monkeypatch.setattr(jax_cache, "put_executable_and_time", spy)
    with persistent_cache(tmp_path / "xla_cache"):
        thread = threading.Thread(target=compile_twice)  # as a compile thread does
        thread.start()
        thread.join()
    assert gated and all(gated)
    assert jax_cache.put_executable_and_time is spy


def test_the_gate_holds_other_threads_writes_while_a_step_is_timed() -> None:
    """While one thread times, another's write waits (the timing thread's own go through);
    a timing waits for the writes under way; writes do not wait for each other."""
    gate = TimingGate()
    entered, release = threading.Event(), threading.Event()

    def write() -> None:
        with gate.write():
            entered.set()
            release.wait()

    with gate.timing():
        with gate.write():  # the timing thread's own write (a filler's compile)
            pass
        other = threading.Thread(target=write)
        other.start()
        assert not entered.wait(0.2)  # held while the step is timed
    assert entered.wait(30)  # the timing ended: the write runs
    with gate.write():  # beside the other write: writes do not wait for each other
        assert gate.writing()
    timed = threading.Event()

    def time_a_step() -> None:
        with gate.timing():
            timed.set()

    timer = threading.Thread(target=time_a_step)
    timer.start()
    assert not timed.wait(0.2)  # a timing waits for the write under way
    release.set()
    other.join()
    assert timed.wait(30)
    timer.join()


def test_the_entries_are_zstd_frames(tmp_path: Path, no_users_cache: None) -> None:
    """The cache's entries are compressed with zstd (the zstandard dependency, or Python
    3.14's own), not zlib: zlib took ten times as long on a TPU's executables
    (``studies/results/tune_time_v5e_workers.md``). A zstd frame starts with 28 b5 2f fd."""
    folder = tmp_path / "xla_cache"
    with persistent_cache(folder):
        compile_twice()
    entries = [f.read_bytes() for f in folder.rglob("*") if f.is_file() and f.stat().st_size > 64]
    assert entries and all(e[:4] == bytes.fromhex("28b52ffd") for e in entries)


def test_a_cache_the_user_set_is_used_as_it_is(tmp_path: Path) -> None:
    users = jax.config.jax_compilation_cache_dir
    if not users:
        pytest.skip("no cache configured by the suite (tests/conftest.py sets one)")
    with persistent_cache(tmp_path / "xla_cache") as use:
        compile_twice()
    assert not use().own and use().folder == users
    assert not (tmp_path / "xla_cache").exists()
    assert jax.config.jax_compilation_cache_dir == users


def test_no_persistent_cache_compiles_everything_and_restores_the_cache(
        tmp_path: Path, no_users_cache: None) -> None:
    """A lockstep tune's compiles: none read back, not even from a cache set up around it
    (a tune's own, which then reports no folder); JAX's setting as it was after."""
    folder = tmp_path / "xla_cache"
    with persistent_cache(folder):
        compile_twice()  # the program is on disk
    before = jax.config.jax_enable_compilation_cache
    with no_persistent_cache(), persistent_cache(folder) as use:
        compile_twice()
    assert (use().folder, use().hits, use().misses) == ("", 0, 0)
    assert jax.config.jax_enable_compilation_cache == before
    with persistent_cache(folder) as again:  # on again after it
        compile_twice()
    assert again().hits >= 2


def test_the_cache_sits_beside_the_studys_storage() -> None:
    assert compile_cache_folder(None) == Path("runs/xla_cache")
    assert compile_cache_folder("sqlite:///a/b.db") == Path("a/xla_cache")
    assert compile_cache_folder("sqlite:///:memory:") is None
    assert compile_cache_folder("postgresql://u@h/db") == Path("runs/xla_cache")
