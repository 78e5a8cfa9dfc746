"""Facts about the device a step is measured on: what it is, and a fingerprint of the
arguments a schedule was tuned with (the stale check). Its memory is read by
``autoremat._measure.allocator``.

Each function imports jax when called (``import autoremat`` stays jax-free).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Final

from autoremat._measure.device_memory import MEASURE_LOCK
from autoremat._measure.mesh import sharding_text

#: Bytes copied each way when the host link is timed (``host_bandwidth``).
HOST_PROBE_BYTES: Final = 1 << 26


def environment() -> dict[str, str]:
    """Device kind, platform and jax/flax versions of the default device."""
    import jax

    try:
        import flax

        flax_version = flax.__version__
    except ImportError:  # pragma: no cover - flax is a dependency
        flax_version = ""
    device = jax.devices()[0]
    return {
        "device_kind": str(device.device_kind),
        "platform": str(device.platform),
        "jax_version": jax.__version__,
        "flax_version": flax_version,
    }


def arguments_fingerprint(args: Any) -> str:
    """A short hash of the argument tree's structure, shapes and dtypes (not values), and
    on many devices of the mesh and each leaf's partition spec (``mesh.sharding_text``)."""
    import hashlib

    import jax

    leaves, treedef = jax.tree_util.tree_flatten(args)
    parts = [str(treedef)]
    for leaf in leaves:
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        parts.append(f"{tuple(shape) if shape is not None else type(leaf).__name__}:{dtype}")
    sharded = sharding_text(args)  # empty on one device: its fingerprints are unchanged
    if sharded:
        parts.append(sharded)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


@functools.cache
def host_bandwidth() -> float | None:
    """Bytes per second over the default device's link to its pinned host memory: the
    faster direction's best of three copies of ``HOST_PROBE_BYTES`` (``None``: the device
    has no host memory to copy to). An offloading schedule moves what it offloads over
    this link and back within each step, so its step takes at least those bytes over this
    figure (``autoremat._search.planning.offload_twins``). Timed once per process, when first asked."""
    import jax
    import jax.numpy as jnp

    seconds: list[float] = []

    def put(a: Any, sharding: Any) -> Any:
        start = time.perf_counter()
        out = jax.block_until_ready(jax.device_put(a, sharding))
        seconds.append(time.perf_counter() - start)
        return out

    try:
        with MEASURE_LOCK:  # the device is the copies' alone
            x = jax.device_put(jnp.zeros((HOST_PROBE_BYTES,), jnp.uint8), jax.devices()[0])
            for _ in range(3):
                put(put(x, x.sharding.with_memory_kind("pinned_host")), x.sharding)
    except Exception:  # no pinned_host memory kind here, or no room for the copy
        return None
    best = min(seconds, default=math.inf)
    return HOST_PROBE_BYTES / best if 0 < best < math.inf else None
