"""The scan under sharding, on 4 forced CPU devices: run by ``tests/test_mesh.py`` in a
subprocess (so the rest of the suite keeps one device); prints one JSON record per check.

For each front-end (``autoremat.scan``, ``autoremat.linen.scan``,
``autoremat.nnx.scan``), each way of running on many devices (``jit`` with a
data-parallel batch, ``jit`` with FSDP-sharded parameters, inside
``shard_map``, under ``pmap``) and each schedule kind, the loss and gradients
are compared with the same program built on the plain scan (``lax.scan``,
``nn.scan``, ``nnx.scan``; rtol 1e-5, with an atol scaled to the float32 rounding
of the sums behind each gradient, see ``tests.helpers.assert_close``), and the compiled HLO's collectives
are counted for both. One process runs them all: compiling is the cost.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4")

import json
import re
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import autoremat
from autoremat import Schedule
from autoremat._measure.mesh import make_mesh
from autoremat._models.seed_lstm import fsdp_axis
from tests.helpers import close_or_why, in_float64

T, B, D, H = 16, 8, 4, 8
KINDS = {"plain": autoremat.plain(T), "nested": autoremat.nested([4, 4]),
         "binomial": autoremat.binomial(4),
         "binomial_static": autoremat.binomial(4, backward="static")}
COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")
Loss = Callable[[Any, jax.Array], jax.Array]


def shard_map(f: Callable[..., Any], **kw: Any) -> Callable[..., Any]:
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, **kw)
    from jax.experimental.shard_map import shard_map as old  # jax < 0.7

    return old(f, **kw)


def zeros_carry(xs: jax.Array) -> jax.Array:
    """A zero carry made from the inputs, so inside ``shard_map`` it varies as they do."""
    return xs[0] @ jnp.zeros((D, H), xs.dtype)


def scan_loss(schedule: Schedule | None) -> tuple[Loss, Any]:
    k1, k2 = jax.random.split(jax.random.PRNGKey(1))
    params = {"w": jax.random.normal(k1, (H, H)) * 0.4, "u": jax.random.normal(k2, (D, H)) * 0.4}

    def loss(p: Any, xs: jax.Array) -> jax.Array:
        def step(c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            c = jnp.tanh(c @ p["w"] + x @ p["u"])
            return c, c * c

        if schedule is None:
            c, ys = lax.scan(step, zeros_carry(xs), xs)
        else:
            c, ys = autoremat.scan(step, zeros_carry(xs), xs, schedule=schedule)
        return ys.sum() + (c * c).sum()

    return loss, params


class Cell(nn.Module):
    @nn.compact
    def __call__(self, c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        w = self.param("w", nn.initializers.normal(0.4), (H, H))
        u = self.param("u", nn.initializers.normal(0.4), (D, H))
        c = jnp.tanh(c @ w + x @ u)
        return c, c * c


def linen_loss(schedule: Schedule | None) -> tuple[Loss, Any]:
    kw: dict[str, Any] = {"variable_broadcast": "params", "split_rngs": {"params": False}}
    scanned = (nn.scan(Cell, **kw) if schedule is None
               else autoremat.linen.scan(Cell, schedule=schedule, **kw))
    xs0 = jnp.zeros((T, B, D))
    params = nn.scan(Cell, **kw)().init(jax.random.PRNGKey(2), zeros_carry(xs0), xs0)["params"]

    def loss(p: Any, xs: jax.Array) -> jax.Array:
        c, ys = scanned().apply({"params": p}, zeros_carry(xs), xs)
        return ys.sum() + (c * c).sum()

    return loss, params


class NCell(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.w = nnx.Param(jax.random.normal(rngs.params(), (H, H)) * 0.4)
        self.u = nnx.Param(jax.random.normal(rngs.params(), (D, H)) * 0.4)

    def __call__(self, c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        c = jnp.tanh(c @ self.w[...] + x @ self.u[...])
        return c, c * c


def nnx_loss(schedule: Schedule | None) -> tuple[Loss, Any]:
    graphdef, state = nnx.split(NCell(nnx.Rngs(3)))
    axes: dict[str, Any] = {"in_axes": (nnx.Carry, None, 0), "out_axes": (nnx.Carry, 0)}

    def body(c: jax.Array, cell: NCell, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return cell(c, x)

    scanned = (nnx.scan(body, **axes) if schedule is None
               else autoremat.nnx.scan(body, schedule=schedule, **axes))

    def loss(s: Any, xs: jax.Array) -> jax.Array:
        c, ys = scanned(zeros_carry(xs), nnx.merge(graphdef, s), xs)
        return ys.sum() + (c * c).sum()

    return loss, state


FRONT_ENDS = {"scan": scan_loss, "linen": linen_loss, "nnx": nnx_loss}


def place(tree: Any, mesh: jax.sharding.Mesh, spec: Callable[[Any], P]) -> Any:
    return jax.tree_util.tree_map(lambda a: jax.device_put(a, NamedSharding(mesh, spec(a))),
                                  tree)


def run_jit(loss: Loss, params: Any, xs: jax.Array, fsdp: bool) -> tuple[Any, str]:
    """``jit`` with the batch split over every device; ``fsdp``: parameters too."""
    mesh = make_mesh("data=2,fsdp=2" if fsdp else "data=4")
    batch = P(None, tuple(mesh.axis_names))

    def param_spec(a: Any) -> P:
        axis = fsdp_axis(tuple(a.shape), 2) if fsdp else None
        return P() if axis is None else P(*([None] * axis), "fsdp")

    args = (place(params, mesh, param_spec), place(xs, mesh, lambda _: batch))
    compiled = jax.jit(jax.value_and_grad(loss)).lower(*args).compile()
    return compiled(*args), compiled.as_text()


def run_shard_map(loss: Loss, params: Any, xs: jax.Array) -> tuple[Any, str]:
    mesh = make_mesh("data=4")
    inner = shard_map(lambda p, x: lax.psum(loss(p, x), "data"), mesh=mesh,
                      in_specs=(P(), P(None, "data")), out_specs=P())
    args = (place(params, mesh, lambda _: P()), place(xs, mesh, lambda _: P(None, "data")))
    compiled = jax.jit(jax.value_and_grad(inner)).lower(*args).compile()
    return compiled(*args), compiled.as_text()


def run_pmap(loss: Loss, params: Any, xs: jax.Array) -> tuple[Any, str]:
    def local(p: Any, x: jax.Array) -> Any:
        return lax.psum(jax.value_and_grad(loss)(p, x), "i")

    split = xs.reshape(T, 4, B // 4, D).transpose(1, 0, 2, 3)
    compiled = jax.pmap(local, axis_name="i", in_axes=(None, 0)).lower(params, split).compile()
    return jax.tree_util.tree_map(lambda a: a[0], compiled(params, split)), compiled.as_text()


def count(hlo: str) -> dict[str, Any]:
    """Collectives of a compiled program's HLO text: ``total`` per op, ``in_loop`` (in a
    while body or what it calls: run every step) per op, and ``gathers``: the result
    shapes of every op, so that a re-gather of the same parameter is told from a new one."""
    comps: dict[str, list[str]] = {}
    name = ""
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            name = head.group(1)
            comps[name] = []
        elif name:
            comps[name].append(line)
    calls = {c: set(re.findall(r"(?:body|condition|to_apply|calls|branch_computations)="
                               r"\{?%?([\w.\-]+)", "\n".join(body))) for c, body in comps.items()}
    loop = {b for body in comps.values() for line in body
            for b in re.findall(r"body=%?([\w.\-]+)", line)}
    todo = list(loop)
    while todo:
        for callee in calls.get(todo.pop(), ()):
            if callee not in loop:
                loop.add(callee)
                todo.append(callee)
    total = {op: 0 for op in COLLECTIVES}
    in_loop = {op: 0 for op in COLLECTIVES}
    shapes: set[str] = set()
    for c, body in comps.items():
        for line in body:
            m = re.search(r"= (.*?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(", line)
            if m:
                total[m.group(2)] += 1
                in_loop[m.group(2)] += c in loop
                parts = sorted(re.sub(r"\{[^}]*\}|[()]", "", m.group(1)).split(", "))
                shapes.add(m.group(2) + " " + ", ".join(parts))
    return {"total": total, "in_loop": in_loop, "shapes": sorted(shapes)}


def run(context: str, loss: Loss, params: Any, xs: jax.Array) -> tuple[Any, str]:
    if context in ("jit_data", "jit_fsdp"):
        return run_jit(loss, params, xs, context == "jit_fsdp")
    if context == "shard_map":
        return run_shard_map(loss, params, xs)
    return run_pmap(loss, params, xs)


def problem_checks() -> None:
    """The built-in problem on a mesh: per-device argument bytes (XLA's) are the replicated
    arguments plus the sharded ones / 4; the fingerprint and the stale check see the mesh."""
    import warnings

    from autoremat import measure, seed_lstm
    from autoremat._measure.device import arguments_fingerprint
    from autoremat._measure.stale import schedule_mismatches

    def emit(check: str, ok: bool, detail: str) -> None:
        print(json.dumps({"check": check, "ok": bool(ok), "detail": detail}), flush=True)

    prints = {}
    for mesh in (None, "data=4", "data=2,fsdp=2"):
        problem = seed_lstm(seq_len=24, batch=8, hidden=8, mesh=mesh)
        _, args = problem.build(autoremat.plain(24))
        prints[mesh] = arguments_fingerprint(args)
        m = measure(problem, autoremat.nested([4, 6]), run=False)
        whole = [a.nbytes for a in jax.tree_util.tree_leaves(args)]
        split = [a.sharding.shard_shape(a.shape) != a.shape for a in jax.tree_util.tree_leaves(args)]
        expected = sum(w // 4 if s else w for w, s in zip(whole, split, strict=True))
        if mesh == "data=2,fsdp=2":  # parameters split 2 ways (over fsdp), the batch 4 ways
            expected = sum(a.nbytes // (a.size // int(np.prod(a.sharding.shard_shape(a.shape))))
                           for a in jax.tree_util.tree_leaves(args))
        emit(f"argument_bytes {mesh}", m.argument_bytes == expected
             and sum(b for _, b in m.argument_parts) == expected
             and m.devices == (1 if mesh is None else 4) and m.mesh == (mesh or ""),
             f"memory_analysis {m.argument_bytes}, expected {expected}, parts "
             f"{m.argument_parts}, devices {m.devices}, mesh {m.mesh!r}, {m.argument_sharding}")
        if mesh == "data=4":
            emit("sharding data=4", dict(m.argument_sharding) == {
                "params": "replicated", "opt_state": "replicated", "x": "sharded",
                "y": "sharded"}, str(m.argument_sharding))
    emit("fingerprints differ by mesh", len(set(prints.values())) == 3, str(prints))
    tuned = autoremat.nested([4, 6]).with_meta(devices=4, mesh="data=4", fingerprint=prints["data=4"])
    fsdp = seed_lstm(seq_len=24, batch=8, hidden=8, mesh="data=2,fsdp=2")
    found = schedule_mismatches(tuned, fsdp)
    emit("stale names both meshes", any("mesh data=4" in f and "mesh data=2,fsdp=2" in f
                                        for f in found), "; ".join(found))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import tempfile

        from autoremat import load_schedule, save_schedule

        with tempfile.TemporaryDirectory() as d:
            save_schedule(tuned, f"{d}/s.yaml")
            load_schedule(f"{d}/s.yaml", problem=fsdp)
    emit("StaleScheduleWarning", any(w.category is autoremat.StaleScheduleWarning
                                     and "data=2,fsdp=2" in str(w.message) for w in caught),
         "; ".join(str(w.message) for w in caught))


def main(front_ends: list[str], problems: bool = True) -> None:
    if problems:
        problem_checks()
    xs = jax.random.normal(jax.random.PRNGKey(0), (T, B, D))
    for front in front_ends:
        ref_loss, params = FRONT_ENDS[front](None)
        exact = in_float64(jax.value_and_grad(ref_loss), params, xs)  # on one device
        for context in ("jit_data", "jit_fsdp", "shard_map", "pmap"):
            want, ref_hlo = run(context, ref_loss, params, xs)
            for kind, schedule in KINDS.items():
                if kind in ("plain", "binomial_static") and front != "scan":  # same builders
                    continue
                record: dict[str, Any] = {"front": front, "context": context, "kind": kind}
                try:
                    got, hlo = run(context, FRONT_ENDS[front](schedule)[0], params, xs)
                    record.update(error="", mismatch=close_or_why(got, want, exact),
                                  collectives=count(hlo), plain_collectives=count(ref_hlo))
                except Exception as e:  # recorded, so one failure does not hide the others
                    record["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
                print(json.dumps(record), flush=True)


if __name__ == "__main__":  # [--fronts-only] [front ...]: all fronts by default
    args = [a for a in sys.argv[1:] if a != "--fronts-only"]
    main(args or list(FRONT_ENDS), problems="--fronts-only" not in sys.argv[1:])
