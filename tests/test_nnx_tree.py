"""autoremat.nnx.scan is nnx.scan: tree mode, scan over layers, its errors, its metadata.

Each case runs the same code through ``nnx.scan`` and through
``autoremat.nnx.scan`` under a nested and a binomial schedule and compares the
loss, the gradients w.r.t. the ``nnx.Param`` state (float32, rtol 1e-5) and
the final state of the modules; errors must be nnx.scan's own (type and text).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import autoremat
import autoremat.nnx
from autoremat import Schedule
from autoremat._scan.records import record_scans
from tests.helpers import assert_close

T, H = 7, 3  # 7 = 2*2 + 3: the nested schedule has a remainder
SCHEDULES = {"nested": autoremat.nested([2, 2]), "binomial": autoremat.binomial(2)}
KINDS = pytest.mark.parametrize("schedule", list(SCHEDULES.values()), ids=list(SCHEDULES))
#: What this Flax's nnx.scan accepts (tree mode came with flax 0.12.6; the floor is 0.12.0).
SCAN_KWARGS = frozenset(inspect.signature(nnx.scan).parameters)
ALL_MODES: tuple[dict[str, Any], ...] = ({"graph": False}, {"graph_updates": False}, {})
HERE_MODES = [m for m in ALL_MODES if set(m) <= SCAN_KWARGS]
MODES = pytest.mark.parametrize("mode", [
    pytest.param(m, id=", ".join(f"{k}={v}" for k, v in m.items()) or "graph",
                 marks=pytest.mark.skipif(m not in HERE_MODES,
                                          reason=f"this flax's nnx.scan has no {', '.join(m)}"))
    for m in ALL_MODES])
Scan = Callable[..., Any]


def ours(schedule: Schedule) -> Scan:
    return functools.partial(autoremat.nnx.scan, schedule=schedule)




class Cell(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear = nnx.Linear(H, H, rngs=rngs)
        self.steps = nnx.BatchStat(jnp.array(0))


def xs() -> jax.Array:
    return jax.random.normal(jax.random.key(1), (T, H), jnp.float32)


def cell_run(scan: Scan, mode: dict[str, Any]) -> tuple[Any, Any, Any]:
    """A carried module (written each step), a broadcast scale, a scanned input."""
    def loss(cell: Cell, scale: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        @scan(in_axes=(nnx.Carry, None, 0), out_axes=(nnx.Carry, 0), **mode)
        def step(carry: tuple[Cell, jax.Array], scale: jax.Array,
                 x: jax.Array) -> tuple[tuple[Cell, jax.Array], jax.Array]:
            cell, h = carry
            cell.steps[...] += 1
            h = jnp.tanh(cell.linear(h) * scale + x)
            return (cell, h), h

        (_, h), ys = step((cell, jnp.zeros(H)), scale, x)
        return jnp.sum(ys * jnp.cos(ys)) + jnp.sum(h), ys

    cell = Cell(nnx.Rngs(0))
    (value, ys), grads = nnx.value_and_grad(loss, has_aux=True)(cell, jnp.float32(0.9), xs())
    return (value, ys), grads, nnx.state(cell)


@KINDS
@MODES
def test_tree_and_graph_modes_match_nnx_scan(schedule: Schedule, mode: dict[str, Any]) -> None:
    ref = cell_run(nnx.scan, mode)
    got = cell_run(ours(schedule), mode)
    assert_close(got, ref)
    assert int(got[2]["steps"][...]) == T


def layers_run(scan: Scan, mode: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Scan over layers: the step creates a module, stacked along axis 0; a second
    scan applies the stacked layers to a carried activation."""
    @nnx.split_rngs(splits=T)
    @scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0), length=T, **mode)
    def create(_: None, rngs: nnx.Rngs) -> tuple[None, nnx.Linear]:
        return None, nnx.Linear(H, H, rngs=rngs)

    _, stack = create(None, nnx.Rngs(0))
    assert stack.kernel.shape == (T, H, H)

    def loss(stack: nnx.Linear, x: jax.Array) -> jax.Array:
        @scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry, **mode)
        def apply(h: jax.Array, layer: nnx.Linear) -> jax.Array:
            return jnp.tanh(layer(h))

        return jnp.sum(jnp.sin(apply(x, stack)))

    value, grads = nnx.value_and_grad(loss)(stack, xs()[0])
    return value, grads, nnx.state(stack)


@KINDS
@MODES
def test_scan_over_layers_matches_nnx_scan(schedule: Schedule, mode: dict[str, Any]) -> None:
    assert_close(layers_run(ours(schedule), mode), layers_run(nnx.scan, mode))


def counted_run(scan: Scan, mode: dict[str, Any]) -> tuple[list[int], Any]:
    """One scanned function (a module broadcast, an input scanned) called twice,
    then differentiated: how often its step was traced after the calls and after
    the gradient, and the values and gradients."""
    traces = 0

    @scan(in_axes=(nnx.Carry, None, 0), out_axes=(nnx.Carry, 0), **mode)
    def step(h: jax.Array, cell: Cell, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        nonlocal traces
        traces += 1
        h = jnp.tanh(cell.linear(h) + x)
        return h, h * x

    cell = Cell(nnx.Rngs(0))
    h1, _ = step(jnp.zeros(H), cell, xs())
    h2, ys = step(h1, cell, xs())
    counts = [traces]

    def loss(cell: Cell) -> jax.Array:
        h, ys = step(h1, cell, xs())
        return jnp.sum(ys * jnp.cos(ys)) + jnp.sum(h)

    value, grads = nnx.value_and_grad(loss)(cell)
    counts.append(traces)
    return counts, (h1, h2, ys, value, grads)


@KINDS
@MODES
def test_the_step_is_traced_no_more_often_than_under_nnx_scan(
        schedule: Schedule, mode: dict[str, Any]) -> None:
    """Flax's test_cache_tracing_*: calling the scanned function again does not
    retrace the step (its trace is cached as lax.scan caches it)."""
    ref_counts, reference = counted_run(nnx.scan, mode)
    counts, values = counted_run(ours(schedule), mode)
    assert ref_counts[0] == 1
    assert counts == ref_counts
    assert_close(values, reference)


def test_the_schedule_runs_the_loop() -> None:
    """Flax's scan reaches autoremat's loop (not jax.lax.scan) in every mode."""
    for mode in HERE_MODES:
        f = autoremat.nnx.scan(lambda c, x: (c + x, c), schedule=SCHEDULES["nested"], **mode)
        with record_scans() as records:
            c, ys = f(jnp.float32(0), jnp.arange(5.0))
        assert len(records) == 1 and float(c) == 10.0 and ys.shape == (5,)


def test_transform_metadata_is_passed_through() -> None:
    """The scanned axis is annotated (PARTITION_NAME) as nnx.scan does."""
    def run(scan: Scan) -> tuple[Any, ...]:
        @nnx.split_rngs(splits=T)
        @scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0), length=T,
              transform_metadata={nnx.PARTITION_NAME: "layers"})
        def create(_: None, rngs: nnx.Rngs) -> tuple[None, nnx.Linear]:
            init = nnx.with_metadata(nnx.initializers.lecun_normal(),
                                     out_sharding=("din", "dout"))
            return None, nnx.Linear(H, H, kernel_init=init, rngs=rngs)

        names = ("layers", "din", "dout")
        mesh = jax.make_mesh((1, 1, 1), names, axis_types=(jax.sharding.AxisType.Auto,) * 3)
        with jax.set_mesh(mesh):
            _, stack = create(None, nnx.Rngs(0))
        return stack.kernel.shape, stack.kernel.get_metadata().get("out_sharding")

    got, want = run(ours(SCHEDULES["binomial"])), run(nnx.scan)
    assert got == want and got[0] == (T, H, H)
    if "graph" in SCAN_KWARGS:  # the Flax of tree mode annotates the scanned axis
        assert got[1] == ("layers", "din", "dout")


def _error(make: Callable[[Scan], Any], scan: Scan) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as info:
        make(scan)
    return type(info.value), str(info.value)


MISUSES: dict[str, Callable[[Scan], Any]] = {
    "carry in in_axes only": lambda s: s(lambda c, x: (c, x), in_axes=(nnx.Carry, 0),
                                         out_axes=0)(0.0, jnp.ones(3)),
    "two carries": lambda s: s(lambda c, d: (c, d), in_axes=(nnx.Carry, nnx.Carry),
                               out_axes=(nnx.Carry, 0))(0.0, 0.0),
    "Carry with two arguments": lambda s: s(lambda c, x: c, in_axes=nnx.Carry,
                                            out_axes=nnx.Carry, length=3)(0.0, 1.0),
    "broadcast output": lambda s: s(lambda c, x: (c, x), in_axes=(nnx.Carry, 0),
                                    out_axes=(nnx.Carry, None))(0.0, jnp.ones(3)),
    "new carry Variable": lambda s: s(lambda c, x: (nnx.Variable(c[...] + 1), x),
                                      graph_updates=False)(
        nnx.Variable(jnp.array(0)), jnp.ones(3)),
}


@pytest.mark.parametrize("misuse", list(MISUSES))
def test_misuse_raises_nnx_scans_own_error(misuse: str) -> None:
    if misuse == "new carry Variable" and "graph_updates" not in SCAN_KWARGS:
        pytest.skip("this flax's nnx.scan has no graph_updates")
    make = MISUSES[misuse]
    expected = _error(make, nnx.scan)
    got = _error(make, ours(SCHEDULES["binomial"]))
    assert got == expected
