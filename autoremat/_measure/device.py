"""Facts about the device a step is measured on: what it is, and a fingerprint of the
arguments a schedule was tuned with (the stale check). Its memory is read by
``autoremat._measure.allocator``.

Each function imports jax when called (``import autoremat`` stays jax-free).
"""

from __future__ import annotations

from typing import Any

from autoremat._measure.mesh import sharding_text


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
