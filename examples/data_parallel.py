"""Your own ``Problem`` on many devices: a data-parallel (and FSDP) LSTM step, per device.

autoremat measures what it is handed: a step whose arguments are sharded
over a mesh compiles (JAX's SPMD partitioner) to one program per device, and
every figure -- the budget too -- is then one device's. Two ways to say how
the arguments are laid out, both in ``build`` below:

1. sharded arguments: ``jax.device_put(x, NamedSharding(mesh, P("data")))``;
2. shardings for ``jit``: the same ``in_shardings`` tree you would give
   ``jax.jit(step, in_shardings=...)``, applied with ``jax.device_put(args,
   in_shardings)`` -- the measuring core compiles ``jax.jit(step)`` with the
   arguments' own shardings, so the two are one thing. Inside the step,
   ``jax.lax.with_sharding_constraint`` pins intermediates as usual.

On CPU, this script asks XLA for 4 host devices (set before jax starts)::

    python examples/data_parallel.py                   # data=4, T=200
    python examples/data_parallel.py --fsdp            # data=2,fsdp=2: parameters split too

It measures the plain scan and a nested schedule (compile only) and prints
the per-device memory, which arguments are replicated and which sharded.
"""

from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=4")

import argparse
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import autoremat


def lstm_problem(seq_len: int, batch: int, hidden: int, fsdp: bool) -> autoremat.Problem:
    """A small LSTM regression step whose batch is split over the mesh."""
    if len(jax.devices()) < 4:
        raise SystemExit("needs 4 devices: on CPU run with "
                         "XLA_FLAGS=--xla_force_host_platform_device_count=4")
    shape, names = ((2, 2), ("data", "fsdp")) if fsdp else ((4,), ("data",))
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(shape), names)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w": jax.random.normal(k1, (hidden + 8, 4 * hidden)) * 0.1,
              "out": jax.random.normal(k2, (hidden, 1)) * 0.1}
    tx = optax.adam(1e-3)
    x = jax.random.normal(k3, (batch, seq_len, 8))
    y = jnp.cos(jnp.cumsum(x[..., :1], axis=1) / 10)

    def build(schedule: autoremat.Schedule) -> tuple[Any, tuple[Any, ...]]:
        def loss_fn(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
            def cell(carry: Any, xt: jax.Array) -> tuple[Any, jax.Array]:
                h, c = carry
                i, f, g, o = jnp.split(jnp.concatenate([h, xt], -1) @ p["w"], 4, -1)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                h = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (h, c), h

            zeros = jnp.zeros((x.shape[0], hidden))
            _, hs = autoremat.scan(cell, (zeros, zeros), x, schedule=schedule, axis=1)
            return jnp.mean((hs @ p["out"] - y) ** 2)  # hs: (B, T, H), as x

        def step(p: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
            loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
            updates, opt_state = tx.update(grads, opt_state, p)
            return optax.apply_updates(p, updates), opt_state, loss

        batch_split = NamedSharding(mesh, P(names))  # the batch over every mesh axis
        if not fsdp:
            # 1. sharded arguments: put each array where it lives.
            replicated = NamedSharding(mesh, P())
            args = (jax.device_put(params, replicated), jax.device_put(tx.init(params), replicated),
                    jax.device_put(x, batch_split), jax.device_put(y, batch_split))
            return step, args
        # 2. shardings for jit: one tree like jax.jit's in_shardings (here FSDP: an array
        # split over "fsdp" on its last axis when it divides, else replicated), then device_put.
        def fsdp_spec(a: Any) -> NamedSharding:
            split = a.ndim > 0 and a.shape[-1] % 2 == 0
            return NamedSharding(mesh, P(*([None] * (a.ndim - 1)), "fsdp") if split else P())

        opt_state = tx.init(params)
        in_shardings = (jax.tree_util.tree_map(fsdp_spec, params),
                        jax.tree_util.tree_map(fsdp_spec, opt_state), batch_split, batch_split)
        return step, jax.device_put((params, opt_state, x, y), in_shardings)

    kind = "data=2,fsdp=2" if fsdp else "data=4"
    return autoremat.Problem(f"lstm(T={seq_len},B={batch},H={hidden},{kind})", seq_len, build,
                             arg_names=("params", "opt_state", "x", "y"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-len", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--fsdp", action="store_true", help="split parameters too (data=2,fsdp=2)")
    a = parser.parse_args()
    problem = lstm_problem(a.seq_len, a.batch, a.hidden, a.fsdp)
    for schedule in (autoremat.plain(a.seq_len), autoremat.nested([10, 20])):
        m = autoremat.measure(problem, schedule, run=False)
        if not m.feasible:
            raise SystemExit(f"{schedule.describe()}: {m.reason}")
        how = dict(m.argument_sharding)
        print(f"{schedule.describe()}: per device ({m.devices} devices, mesh {m.mesh}): "
              f"total {m.total_bytes} B, temp {m.temp_bytes} B; arguments "
              + ", ".join(f"{n} {b} B {how[n]}" for n, b in m.argument_parts))


if __name__ == "__main__":
    main()
