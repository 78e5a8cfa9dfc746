"""Compiles paid once: JAX's persistent compilation cache in a study's folder.

A tune compiles a schedule more than once: to size it, again to re-time it beside its
rivals (``autoremat._search.retime``), to time it at full length
(``autoremat._search.confirm``), to prove it fits (``autoremat._search.proof``), and again
in a resumed or repeated tune. JAX can keep each compiled executable on disk, keyed by
the program, the compiler's options and the device, and read it back instead of
compiling (its compiled memory figures read alike). ``persistent_cache`` turns that on
for one tune, in the folder given (``tune``: beside the study's storage), and counts what
it read back: ``CacheUse``, which the tune's summary reports.

Costs: disk (each executable once, with no limit: delete the folder to reclaim it) and
the time to key, serialize, compress and write each one on the compile threads: small
against the compile with zstd (the ``zstandard`` dependency), about ten times as long
with zlib, JAX's fallback, on a TPU's executables
(``studies/results/tune_time_v5e_workers.md``). An entry's write waits for a step's
timing to end (``timing.TIMING_GATE``, ``autoremat._jax.cache_writes_under``): the
executable's serialization keeps the GIL, and beside a timing it made the timed runs read
slow. A cache the user configured
(JAX's ``jax_compilation_cache_dir``, from the environment or ``jax.config``) is used as
it is, and counted; one turned off (``jax_enable_compilation_cache`` false) stays off. On
leaving, JAX's settings are as they were.

A lockstep tune (``autoremat._search.lockstep``) compiles with the cache off on every
process (``no_persistent_cache``): an executable read back from it has another
fingerprint than the same program compiled (jax 0.12 on a CPU), and a multi-process run's
launch id, on which the processes' collectives meet, comes from that fingerprint -- one
process reading back what another compiles would wait forever in the step's first
collective. Its cost: every compile of such a tune is paid, a resumed one's too.

The counts are JAX's monitoring events (``jax.monitoring``): a compile that looked in the
cache found its executable (a hit) or did not (a miss). A program JAX does not cache (one
with host callbacks) is neither. Only a schedule's compile counts (``counted``, around
``measure.compile_step``'s): the helpers a tune compiles beside them -- the problem's
initialization, a device's filler programs, JAX's own small programs -- are read back
as well on a repeated tune, and would make its rate say more than the schedules' own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from autoremat._measure.timing import TIMING_GATE

#: JAX's events for a compile that found its executable in the cache, and one that did not.
HIT: Final = "/jax/compilation_cache/cache_hits"
MISS: Final = "/jax/compilation_cache/cache_misses"


@dataclass(frozen=True)
class CacheUse:
    """What the persistent compilation cache did during one tune.

    Attributes:
      folder: where it is (``""``: no cache was used).
      hits: schedule compiles read back from it.
      misses: schedule compiles it did not hold (compiled, then written to it).
      own: ``folder`` is the study's (``False``: the user's own cache).
    """

    folder: str = ""
    hits: int = 0
    misses: int = 0
    own: bool = True

    @property
    def rate(self) -> float | None:
        """Hits over compiles that looked in the cache (``None``: none did)."""
        looked = self.hits + self.misses
        return None if looked == 0 else self.hits / looked


class _Depth(threading.local):
    """Per thread, how deep it is in ``counted`` (JAX records a compile's event on the
    thread that compiles)."""

    depth = 0


_SCHEDULE_COMPILES: Final = _Depth()


@contextlib.contextmanager
def counted() -> Iterator[None]:
    """The block compiles a schedule's step: its cache hit or miss is counted (module doc)."""
    _SCHEDULE_COMPILES.depth += 1
    try:
        yield
    finally:
        _SCHEDULE_COMPILES.depth -= 1


class _Counts:
    """Hits and misses of the schedules' compiles (``counted``), counted from JAX's events
    (compile threads record them too)."""

    def __init__(self) -> None:
        self.hits = self.misses = 0
        self.lock = threading.Lock()
        self.closed = False  # a jax with no way to unregister a listener: it stops counting

    def __call__(self, event: str, **kwargs: Any) -> None:
        if event in (HIT, MISS) and not self.closed and _SCHEDULE_COMPILES.depth > 0:
            with self.lock:
                if event == HIT:
                    self.hits += 1
                else:
                    self.misses += 1


@contextlib.contextmanager
def persistent_cache(folder: Path | None) -> Iterator[Callable[[], CacheUse]]:
    """JAX's persistent compilation cache in ``folder`` for the block (module doc); what
    is yielded returns the ``CacheUse`` so far. ``folder`` ``None``: no cache of the
    study's (a user's own is still counted)."""
    import jax
    import jax.monitoring
    from jax.experimental.compilation_cache import compilation_cache

    from autoremat._jax import cache_writes_under

    config = jax.config
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = {name: getattr(config, name) for name in names}
    users = before["jax_compilation_cache_dir"]
    enabled = bool(getattr(config, "jax_enable_compilation_cache", True))
    ours = enabled and not users and folder is not None
    if ours:
        assert folder is not None
        folder.mkdir(parents=True, exist_ok=True)
        config.update("jax_compilation_cache_dir", str(folder))
        config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # every compile
        config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        compilation_cache.reset_cache()  # a cache JAX set up before reads the new folder
    counts = _Counts()
    where = str(folder) if ours else (str(users) if enabled and users else "")
    jax.monitoring.register_event_listener(counts)
    try:
        with cache_writes_under(TIMING_GATE.write) if where else contextlib.nullcontext():
            yield lambda: CacheUse(where, counts.hits, counts.misses, own=ours)
    finally:
        unregister = getattr(jax.monitoring, "unregister_event_listener", None)
        if unregister is not None:
            unregister(counts)
        counts.closed = True
        if ours:
            for name, value in before.items():
                config.update(name, value)
            compilation_cache.reset_cache()


@contextlib.contextmanager
def no_persistent_cache() -> Iterator[None]:
    """JAX's persistent compilation cache off for the block, as it was after: every
    compile inside is compiled, none read back (the module doc says why a lockstep tune
    needs that)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    before = bool(getattr(jax.config, "jax_enable_compilation_cache", True))
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # JAX decides once whether it reads the cache
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()
