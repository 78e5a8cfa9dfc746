"""A step run with only a budget free on the device: the proof of fit, and the truth.

**The proof of fit** (``runs_within``): the step runs once with only ``free_bytes`` free
beyond what is live on each device -- a filler holds the rest. ``tune`` runs its pick so
with only the budget on the device before writing it (``autoremat._search.proof``).

**The truth** (``bisect_need``): the least free memory beyond what is live in which the
step runs, found by bisection with a filler holding the rest (``runs_within``), each try a
freshly loaded program (``fresh_run``: its code counts). Each platform's method of
``autoremat._measure.device_memory`` is checked against it on a real device before its
figures are used (``device_memory.VALIDATED``; ``studies/device_check.py``).

Devices are read through ``device_memory.meters()`` (tests replace it with stand-ins),
under ``device_memory.MEASURE_LOCK``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

from autoremat._measure import device_memory
from autoremat._measure.device_memory import Meter
from autoremat._measure.failure import is_out_of_memory


def runs_within(work: Callable[[], Any], free_bytes: int,
                devices: Sequence[Meter] | None = None) -> tuple[bool | None, str]:
    """Run ``work`` once with only ``free_bytes`` free beyond what is live on each device (a
    filler holds the rest): ``(True, "")`` it ran, ``(False, why)`` it ran out of memory,
    ``(None, why)`` nothing can be proved here (a CPU; no room for the filler). What else
    ``work`` raises is raised.

    On a TPU a loaded program's reservation needs no care: it lies inside what is not in
    use, so the step can reuse at most ``free_bytes`` of it, and a filler that needs its
    room makes the runtime give it back (``bytes_reserved`` is 0 after).
    """
    devices = device_memory.meters() if devices is None else devices
    if not devices:
        return None, "no device memory to fill (a CPU)"
    with device_memory.MEASURE_LOCK:
        return _runs_within(work, free_bytes, devices)


def _runs_within(work: Callable[[], Any], free_bytes: int,
                 devices: Sequence[Meter]) -> tuple[bool | None, str]:
    gc.collect()
    releases: list[Callable[[], None]] = []
    try:
        for m in devices:
            s = m.stats()
            if s is None or s.limit is None:
                return None, "the device reports no bytes_limit"
            hold = s.limit - s.in_use - free_bytes
            if hold > 0:
                try:
                    releases.append(m.fill(hold, exact=True))
                except Exception as e:
                    return None, f"no room for a {hold}-byte filler: {str(e)[:120]}"
        try:
            work()
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            text = " ".join(str(e).split())
            return False, text[max(0, text.find("RESOURCE_EXHAUSTED")):][:300]
        return True, ""
    finally:
        for release in releases:
            release()


def free_outputs(out: Any) -> None:
    """Free a run's outputs at once: a proof or a bisection try must not keep them."""
    import jax

    for leaf in jax.tree_util.tree_leaves(out):
        if isinstance(leaf, jax.Array):
            leaf.delete()


def fresh_run(step: Callable[..., Any], args: Sequence[Any]) -> Callable[[], None]:
    """A work for ``runs_within``/``bisect_need``: compile ``step`` anew and run it once, then
    free its outputs and the program. A fresh program is what the truth is about: loading it
    takes its code as well as its temporaries and outputs (``bytes_in_use`` rises by the
    outputs plus ``generated_code_size_in_bytes`` at the first run: ``studies/results/tpu.md``),
    which a loaded one already holds. A new wrapper each time, so no in-process cache hands back a
    loaded program; with JAX's persistent compilation cache on, each compile is a load."""
    import jax

    def once() -> None:
        def fresh(*a: Any) -> Any:
            return step(*a)

        executable = jax.jit(fresh).lower(*args).compile()
        free_outputs(executable(*args))
        del executable
        gc.collect()

    return once


def bisect_need(work: Callable[[], Any], high: int, *, resolution: int = 256 << 10,
                devices: Sequence[Meter] | None = None) -> int | None:
    """The least free memory beyond what is live in which ``work`` runs, to within
    ``resolution`` bytes (bisection with ``runs_within``): the truth the methods are
    checked against. ``high``: a size it surely runs in (checked first). ``None`` where
    nothing can be proved, or when it does not run in ``high``."""
    ok, _ = runs_within(work, high, devices)
    if not ok:
        return None
    low = 0  # every step needs some bytes: its outputs at least
    while high - low > resolution:
        mid = (low + high) // 2
        ok, _ = runs_within(work, mid, devices)
        if ok is None:
            return None
        low, high = (low, mid) if ok else (mid, high)
    return high
