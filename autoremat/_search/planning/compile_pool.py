"""Compiles in parallel with timing: threads that compile what the planner looks at next.

XLA compiles outside the GIL, so while the device times one schedule on the main
thread, threads can compile (``measure.compile_schedule``) the candidates the
planner will screen next (``CompilesAhead.prefetch``): when one comes up, its
``Compiled`` is ready. Only the main thread reads the results (``take``), so the
planner's models and pool change there alone; a thread runs one compile and nothing
else. One thread more is kept for the compile the planner needs now (``urgent``), so the
device times another schedule meanwhile instead of waiting for it.

**How many** (``compile_workers``): the compiles under way at once, the main
thread's included: one per ``CORES_PER_COMPILE`` host cores (a compile uses
threads of its own, and the timing's host thread needs a core), at most
``MAX_WORKERS``; and 1 on a CPU platform, whose timed step runs on those same
cores (a compile beside it would slow the figure). So 1 on a 2-core machine, 6 on
a 13-core host: most of an accelerator tune's time is compiles, so more at once end
the search sooner where cores are free (``studies/results/tune_time_v5e_workers.md``).
The variable ``WORKERS_ENV`` (AUTOREMAT_COMPILE_WORKERS) overrides the rule; a problem
compiled on every process of a lockstep tune (``autoremat._measure.peers``) gets 1, so
its compiles reach the others in one order. With 1 there is no thread: every compile
runs on the main thread when the planner needs it -- the sequential search, unchanged.

**Device memory**: a compile taken ahead and not yet consumed holds its executable,
so at most one per thread is held (``CompilePool.capacity``); one the planner no
longer wants (``keep_only``) is released, and ``close`` releases the rest.

**What runs beside a timing**: XLA's compile alone. A thread builds and lowers its
step under ``device_memory.MEASURE_LOCK``, which a timing holds (a build may put
arrays on the device, inside a measured warm-up; Python holds the GIL that a timed
run waits for: an accelerator's step runs slower beside a trace, even with a 0.1-ms
switch interval, and no slower beside XLA compiles, ``studies/results/tune_time.md``),
and sizes it behind ``timing.TIMING_GATE`` (not beside a timing, nor behind the other
threads' lowerings); on a platform whose
compiles take device memory and run on it (XLA:GPU's autotuning; not a TPU) it
compiles under it too. A thread traces only
under the main thread's JAX trace context (``jax.default_matmul_precision`` and the
like are set per thread): where they differ it hands the compile back, and the main
thread compiles it when it comes up.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Final

from autoremat._errors import TuneError
from autoremat._measure import device_memory
from autoremat._measure.measure import Compiled, compile_schedule
from autoremat._measure.peers import peers_of
from autoremat._measure.problem import Problem, Step
from autoremat._schedules.base import Schedule
from autoremat._schedules.platforms import RESERVING_PLATFORMS

#: Host cores per compile under way (``compile_workers``).
CORES_PER_COMPILE: Final = 2
#: The most compiles under way at once, the main thread's included.
MAX_WORKERS: Final = 6
#: Overrides ``compile_workers``'s rule: a whole number >= 1 (1: no compile threads).
WORKERS_ENV: Final = "AUTOREMAT_COMPILE_WORKERS"

CompileFn = Callable[[Schedule], Compiled]


class ContextDiffers(RuntimeError):
    """A compile thread's JAX trace context is not the main thread's: not compiled there."""


def compile_workers(platform: str, cores: int | None = None, *, in_order: bool = False) -> int:
    """Compiles under way at once, the main thread's included (the module doc's rule);
    ``in_order``: every compile must come in the planner's order (a lockstep tune), so 1."""
    if in_order:
        return 1
    override = os.environ.get(WORKERS_ENV, "").strip()
    if override:
        if not override.isdigit() or int(override) < 1:
            raise TuneError(f"{WORKERS_ENV}: expected a whole number >= 1 (1: compile on "
                            f"the main thread only), got {override!r}")
        return int(override)
    if platform in ("", "cpu"):
        return 1
    cores = os.cpu_count() if cores is None else cores
    return max(1, min(MAX_WORKERS, (cores or 1) // CORES_PER_COMPILE))


def compile_quietly(problem: Problem, schedule: Schedule, budget_bytes: int | None,
                    platform: str, built: tuple[Step, tuple[Any, ...]] | None = None,
                    ) -> Compiled:
    """``compile_schedule`` from a compile thread: its build (``built``: done already) and
    its lowering (``compile_step``) under ``device_memory.MEASURE_LOCK``, and its XLA
    compile too where compiling takes device memory (not a TPU)."""
    if platform not in RESERVING_PLATFORMS:
        with device_memory.MEASURE_LOCK:
            return compile_schedule(problem, schedule, budget_bytes=budget_bytes, built=built)
    if built is None:
        try:
            with device_memory.MEASURE_LOCK:
                built = problem.build(schedule)
        except Exception:  # compile_schedule builds it again and records the failure
            with device_memory.MEASURE_LOCK:
                return compile_schedule(problem, schedule, budget_bytes=budget_bytes)
    return compile_schedule(problem, schedule, budget_bytes=budget_bytes, built=built)


def traces_as(expected: object) -> bool:
    """Whether JAX traces on this thread as on the thread whose ``trace_context()`` is
    ``expected`` (its context managers, ``jax.default_matmul_precision`` and the like, set
    the flags per thread): a thread compiles for another only where it does."""
    from autoremat._jax import trace_context

    return bool(trace_context() == expected)


class CompilePool:
    """Compiles taken ahead, by schedule key (module doc). Called from the main thread only.

    Attributes:
      threads: compile threads (``workers - 1``; 0: none, nothing is taken ahead).
      capacity: compiles ahead held at once, running or done and not taken.
      submitted, taken, released, cancelled: compiles handed to the threads; taken by
        the planner; compiled, not wanted and released; dropped before they started, or
        handed back (``ContextDiffers``, or the thread raised).
    """

    def __init__(self, compile: CompileFn, workers: int) -> None:
        self.compile = compile
        self.threads = max(0, workers - 1)
        self.capacity = self.threads
        # one thread more, for the compile the planner needs now (``urgent``)
        self._executor = (ThreadPoolExecutor(self.threads + 1,
                                             thread_name_prefix="autoremat-compile")
                          if self.threads else None)
        self._ahead: dict[str, Future[Compiled]] = {}
        self._urgent: set[str] = set()  # kept by ``keep_only`` until taken
        self._dropped: list[Future[Compiled]] = []  # not wanted, still compiling
        self._ended: dict[str, float] = {}  # when each compile ahead ended (``ended``)
        self.submitted = self.taken = self.released = self.cancelled = 0

    @classmethod
    def for_problem(cls, problem: Problem, budget_bytes: int, platform: str) -> CompilePool:
        """A pool of ``compile_workers(platform)`` compiling ``problem``'s schedules (1, no
        thread, for a problem compiled on every process)."""
        return cls(lambda s: compile_quietly(problem, s, budget_bytes, platform),
                   compile_workers(platform, in_order=peers_of(problem) is not None))

    def __contains__(self, key: str) -> bool:
        return key in self._ahead

    @property
    def room(self) -> int:
        """How many more compiles may be taken ahead now."""
        self._reap()
        return 0 if self._executor is None else max(0, self.capacity - self.held)

    def submit(self, key: str, schedule: Schedule) -> bool:
        """Compile ``schedule`` on a thread (``False``: no room, or already ahead)."""
        if key in self._ahead or self.room <= 0 or self._executor is None:
            return False
        self._hand(key, schedule)
        return True

    def _hand(self, key: str, schedule: Schedule) -> None:
        from autoremat._jax import trace_context  # imports jax

        assert self._executor is not None
        context = contextvars.copy_context()  # the study's settings (offered names, ...)
        self._ahead[key] = self._executor.submit(context.run, self._compile, key, schedule,
                                                 trace_context())
        self.submitted += 1

    def urgent(self, key: str, schedule: Schedule) -> bool:
        """``key`` is compiling on a thread, not done: taken ahead, or handed now to the
        thread kept for it when every other is busy or full (``False``: done, or no thread
        free, and the caller compiles it). While it compiles, the device may time another."""
        future = self._ahead.get(key)
        if future is not None:
            return not future.done()
        busy = sum(not f.done() for f in [*self._ahead.values(), *self._dropped])
        if self._executor is None or busy > self.threads:
            return False
        self._hand(key, schedule)
        self._urgent.add(key)
        return True

    def wait_other(self, key: str) -> bool:
        """Wait until ``key``'s compile ahead is done or another one under way is: ``True``
        when another finished first (the device may time it while ``key`` compiles on)."""
        future = self._ahead.get(key)
        others = [f for k, f in self._ahead.items() if k != key and not f.done()]
        if future is None or future.done() or not others:
            return False
        done, _ = wait([future, *others], return_when=FIRST_COMPLETED)
        return future not in done

    def ready(self, key: str) -> bool:
        """``key`` was compiled ahead and is done: ``take`` returns without waiting."""
        future = self._ahead.get(key)
        return future is not None and future.done()

    def take(self, key: str) -> Compiled | None:
        """The compile of ``key`` taken ahead (waiting for it), or ``None``: none was, or
        its thread raised (the caller compiles it, and sees the error itself)."""
        self._urgent.discard(key)
        future = self._ahead.pop(key, None)
        if future is None:
            return None
        try:
            compiled = future.result()
        except Exception:
            self.cancelled += 1
            return None
        self.taken += 1
        return compiled

    def _compile(self, key: str, schedule: Schedule, expected: object) -> Compiled:
        """On a thread: ``compile(schedule)`` when JAX traces there as on the main thread."""
        if not traces_as(expected):
            raise ContextDiffers("JAX's trace context differs from the main thread's")
        compiled = self.compile(schedule)
        self._ended[key] = time.monotonic()
        return compiled

    def ended(self, key: str) -> float | None:
        """When the compile of ``key`` taken ahead ended (``time.monotonic()``; ``None``:
        none was), read once."""
        return self._ended.pop(key, None)

    def keep_only(self, keys: Iterable[str]) -> None:
        """Drop every compile ahead but those of ``keys`` (released once compiled)."""
        keep = set(keys) | self._urgent
        for key in [k for k in self._ahead if k not in keep]:
            self._drop(self._ahead.pop(key))
        self._reap()

    def close(self, wait: bool = False) -> None:
        """Drop every compile ahead and stop the threads: those not started are cancelled,
        those compiled released; one still compiling is released by its thread when done
        (``wait``: wait for them here), so the search's end never waits for a compile."""
        self._urgent.clear()
        self.keep_only(())
        for future in self._dropped:
            future.add_done_callback(_release)
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=True)
            self._executor = None
        self._reap()

    @property
    def held(self) -> int:
        """Compiles held: taken ahead (running, or done and not taken) and dropped ones
        still running."""
        return len(self._ahead) + len(self._dropped)

    def wait(self) -> None:
        """Wait for every compile under way to end; release those dropped."""
        for future in [*self._ahead.values(), *self._dropped]:
            with contextlib.suppress(Exception):
                future.exception()  # waits, raising nothing
        self._reap()

    def _drop(self, future: Future[Compiled]) -> None:
        if future.cancel():
            self.cancelled += 1
        else:
            self._dropped.append(future)

    def _reap(self) -> None:
        """Release the dropped compiles that have finished (on the calling thread)."""
        running: list[Future[Compiled]] = []
        for future in self._dropped:
            if not future.done():
                running.append(future)
            elif future.cancelled() or future.exception() is not None:
                self.cancelled += 1
            else:
                future.result().release()
                self.released += 1
        self._dropped = running


def _release(future: Future[Compiled]) -> None:
    """Release a dropped compile once done (on its thread: nobody else holds it)."""
    if not future.cancelled() and future.exception() is None:
        future.result().release()
