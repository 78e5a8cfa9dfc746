"""A measurement's failure as data (``autoremat._measure.failure``): where it failed, for
want of memory or not, the compiler's stated size; the worker reads them, not the words."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from autoremat._measure.failure import stated_bytes, words
from autoremat._measure.measure import measure_step
from autoremat._measure.measurement import ERROR, OVER_BUDGET, Measurement
from autoremat._search.worker import compile_failed

# Messages XLA gave on the TPU v5e (jax 0.10.2), verbatim starts.
TPU_COMPILE_OOM = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. ... the total memory "
                   "required for HLO temporaries (64.06G) exceeds available HBM (15.75G)")
TPU_LOAD_OOM = ("RESOURCE_EXHAUSTED: E0101: RuntimeProgramAllocationFailure:\nError loading "
                "program 'jit_train_step': Attempting to reserve 938.52M at the bottom of "
                "memory. That ...")


@pytest.mark.parametrize(("text", "size"), [
    (TPU_COMPILE_OOM, int(64.06 * 2**30)),  # XLA's "G" is GiB
    (TPU_LOAD_OOM, int(938.52 * 2**20)),
    ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 123456 bytes.", 123456),
    ("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 17.50G of 15.75G hbm.",
     int(17.5 * 2**30)),
    ("RESOURCE_EXHAUSTED: out of memory", None),  # no size stated
    ("INTERNAL: async-start expects the shape of operand 0 to match", None),
])
def test_stated_bytes_reads_the_compilers_size(text: str, size: int | None) -> None:
    assert stated_bytes(RuntimeError(text)) == size


def _raising(message: str) -> Any:
    """A stand-in for a compile that fails on a device (raised while tracing, inside
    ``compile_step``'s compile): the CPU never runs out of memory at compile."""
    def step(x: Any) -> Any:
        raise RuntimeError(message)
    return step


def test_out_of_memory_at_compile_is_a_size_another_failure_is_not() -> None:
    oom = measure_step(_raising(TPU_COMPILE_OOM), (np.ones(3, np.float32),), budget_bytes=10**9)
    assert oom.status == OVER_BUDGET and not oom.feasible
    assert oom.compiler_bytes == int(64.06 * 2**30) and oom.size_bytes == oom.compiler_bytes
    assert oom.total_bytes is None and oom.step_seconds is None
    assert oom.reason.startswith("out of memory at compile") and "64.06G" in oom.reason
    assert Measurement.from_attrs(oom.to_attrs()) == oom
    for message in ("RESOURCE_EXHAUSTED: out of memory", "INTERNAL: something else"):
        failed = measure_step(_raising(message), (np.ones(3, np.float32),))
        assert failed.status == ERROR and failed.compiler_bytes is None
        assert failed.failed_at == "compile"
        assert failed.size_bytes is None
    assert (oom.failed_at, oom.out_of_memory) == ("compile", True)
    assert Measurement.from_attrs(oom.to_attrs()) == oom


def test_the_words_are_the_printed_ones() -> None:
    assert [words("build"), words("compile"), words("run")] == [
        "build failed", "compile failed", "run failed"]
    assert words("compile", True) == "out of memory at compile"


def test_the_worker_reads_where_it_failed_not_the_words() -> None:
    """A build or compile failure (at full length or a short run's) measured nothing; the
    reason's words play no part: a resumed study's attrs hold ``failed_at``."""
    failed = Measurement("k", ERROR, "at T'=4000: anything at all", failed_at="compile")
    assert compile_failed(Measurement.from_attrs(failed.to_attrs()))
    assert compile_failed(replace(failed, failed_at="build"))
    assert not compile_failed(replace(failed, failed_at="run", reason="compile failed: x"))
    assert not compile_failed(replace(failed, status=OVER_BUDGET))  # a size, not a failure
