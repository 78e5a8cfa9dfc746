"""Many devices: mesh specs and what a step's arguments are laid out on.

A step measured with sharded arguments (``jax.device_put(x, NamedSharding)``)
is compiled by JAX's SPMD partitioner into one program per device; XLA's
``memory_analysis()`` then sizes *one device's* share -- every figure
autoremat records is per device. This module says on how many devices and
which mesh (``layout``), how big each argument is per device and whether it
is replicated or sharded (``leaf_bytes``), and spells a mesh as ``data=4`` or
``data=2,fsdp=2`` (``parse_mesh``/``format_mesh``, stdlib only: the CLI
checks ``--mesh`` without importing jax).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autoremat._errors import ProblemError

if TYPE_CHECKING:
    import jax

MeshAxes = tuple[tuple[str, int], ...]


def parse_mesh(spec: str) -> MeshAxes:
    """``"data=4"`` or ``"data=2,fsdp=2"`` as ``(("data", 4), ...)``.

    Raises:
      ValueError: not ``name=size[,name=size...]`` with distinct names and sizes >= 1.
    """
    axes: list[tuple[str, int]] = []
    for part in str(spec).split(","):
        name, sep, size = part.strip().partition("=")
        name = name.strip()
        if not sep or not name.isidentifier() or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(f"expected axis=size[,axis=size...] such as data=4 or "
                             f"data=2,fsdp=2, got {spec!r}")
        if name in dict(axes):
            raise ValueError(f"axis {name!r} is named twice in {spec!r}")
        axes.append((name, int(size)))
    return tuple(axes)


def format_mesh(axes: MeshAxes | Mapping[str, int]) -> str:
    """``data=2,fsdp=2`` (empty for no mesh)."""
    items = axes.items() if isinstance(axes, Mapping) else axes
    return ",".join(f"{n}={s}" for n, s in items)


def mesh_devices(mesh: str) -> int:
    """The number of devices a mesh spec spans (1 for ``""``)."""
    count = 1
    for _, size in parse_mesh(mesh) if mesh else ():
        count *= size
    return count


def device_note(devices: int, mesh: str) -> str:
    """``per device, 4 devices, mesh data=4``: what every memory figure is."""
    where = f"{devices} device{'s' if devices != 1 else ''}"
    return f"per device, {where}" + (f", mesh {mesh}" if mesh else "")


def make_mesh(spec: str | jax.sharding.Mesh) -> jax.sharding.Mesh:
    """A ``jax.sharding.Mesh`` over the first devices, from a spec like ``data=4``.

    Raises:
      ProblemError: a bad spec, or more devices than this process has.
    """
    import jax
    import numpy as np

    if isinstance(spec, jax.sharding.Mesh):
        return spec
    try:
        axes = parse_mesh(spec)
    except ValueError as e:
        raise ProblemError(f"mesh: {e}") from None
    need = mesh_devices(format_mesh(axes))
    have = jax.devices()
    if need > len(have):
        raise ProblemError(
            f"mesh: {format_mesh(axes)} needs {need} devices, this process has {len(have)} "
            f"{have[0].platform} device{'s' if len(have) != 1 else ''} (on CPU, set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={need} before jax starts)")
    devices = np.array(have[:need]).reshape(tuple(s for _, s in axes))
    return jax.sharding.Mesh(devices, tuple(n for n, _ in axes))


def put(value: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """``jax.device_put(value, sharding)`` of a value every process holds whole; where the
    sharding spans other processes' devices too (a multi-controller job), each process
    places only its own shards from its copy (``jax.make_array_from_callback``)."""
    import jax
    import numpy as np

    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def leaf_bytes(leaf: Any) -> tuple[int, int]:
    """``(per-device bytes, whole bytes)`` of one array (equal when it is not sharded)."""
    import numpy as np

    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is None or dtype is None:
        return 0, 0
    item = int(dtype.itemsize)  # typed PRNG keys too (np.dtype cannot read key<fry>)
    whole = int(np.prod(shape, dtype=np.int64)) * item
    sharding = getattr(leaf, "sharding", None)
    shard_shape = getattr(sharding, "shard_shape", None)
    if shard_shape is None:
        return whole, whole
    return int(np.prod(shard_shape(tuple(shape)), dtype=np.int64)) * item, whole


def layout(args: Any) -> tuple[int, str]:
    """``(devices, mesh)`` the arguments are laid out on: the most devices any leaf
    spans, and the first ``NamedSharding``'s mesh as ``data=4`` (``""``: none)."""
    import jax

    devices, mesh = 1, ""
    for leaf in jax.tree_util.tree_leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            continue
        devices = max(devices, len(sharding.device_set))
        if not mesh and isinstance(sharding, jax.sharding.NamedSharding) and devices > 1:
            mesh = format_mesh(dict(sharding.mesh.shape))
    return devices, mesh


def sharding_text(args: Any) -> str:
    """The mesh and every leaf's partition spec, for the fingerprint (``""``: one device)."""
    import jax

    devices, mesh = layout(args)
    if devices == 1:
        return ""
    specs = [str(getattr(getattr(leaf, "sharding", None), "spec", "-"))
             for leaf in jax.tree_util.tree_leaves(args)]
    return f"mesh={mesh};devices={devices};" + ",".join(specs)
