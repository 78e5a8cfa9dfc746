"""Shared test helpers: cells, inputs, the plain-``lax.scan`` reference, tolerances,
the brute-force Revolve DP and the matrix of every schedule kind's examples.

Test files import from here (``from tests.helpers import ...``, the one style for
every helper module), never from each other.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import autoremat
from autoremat import Schedule
from autoremat._schedules import KINDS

RTOL = 1e-5
ATOL = 1e-6
BATCH, FEAT, HID = 3, 5, 6


def _flax_cell(cell: nn.Module) -> tuple[Callable[..., Any], Any, Any]:
    """A flax RNN cell as a pure step ``f(params)(carry, x)``, its params, carry."""
    key = jax.random.PRNGKey(0)
    carry = cell.initialize_carry(key, (BATCH, FEAT))
    params = cell.init(key, carry, jnp.zeros((BATCH, FEAT)))["params"]

    def make(p: Any) -> Callable[..., Any]:
        return lambda c, x: cell.apply({"params": p}, c, x)

    return make, params, carry


def _dict_cell() -> tuple[Callable[..., Any], Any, Any]:
    """Pure JAX: dict carry, a tuple of inputs, a tuple of outputs."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(1))
    params = {
        "w": jax.random.normal(k1, (HID, HID)) * 0.3,
        "u": jax.random.normal(k2, (FEAT, HID)) * 0.3,
    }
    carry = {"h": jnp.zeros((BATCH, HID)), "n": jnp.zeros((BATCH,))}

    def make(p: Any) -> Callable[..., Any]:
        def f(c: Any, x: Any) -> Any:
            a, b = x
            h = jnp.tanh(c["h"] @ p["w"] + a @ p["u"]) * (1.0 + 0.1 * jnp.sin(b)[:, None])
            return {"h": h, "n": c["n"] + h.mean(-1)}, (h, h.sum(-1))

        return f

    return make, params, carry


CELLS: dict[str, Callable[[], tuple[Callable[..., Any], Any, Any]]] = {
    "lstm": lambda: _flax_cell(nn.OptimizedLSTMCell(HID)),
    "gru": lambda: _flax_cell(nn.GRUCell(HID)),
    "dict": _dict_cell,
}


def _inputs(cell: str, steps: int, axis: int) -> Any:
    key = jax.random.PRNGKey(steps)
    shape = (steps, BATCH, FEAT) if axis == 0 else (BATCH, steps, FEAT)
    a = jax.random.normal(key, shape)
    if cell == "dict":
        return (a, jax.random.normal(jax.random.fold_in(key, 1), shape[:2]))
    return a


def _loss_and_grads(
    cell: str, schedule: Schedule | None, steps: int, *, axis: int = 0, reverse: bool = False
) -> Any:
    """value_and_grad w.r.t. params, initial carry and inputs; None = plain lax.scan."""
    if schedule is None:
        return _reference(cell, steps, axis, reverse)
    return _compute_loss_and_grads(cell, schedule, steps, axis, reverse)


@functools.cache
def _reference(cell: str, steps: int, axis: int, reverse: bool) -> Any:
    """The plain ``lax.scan`` result, computed once per setting for every kind."""
    return _compute_loss_and_grads(cell, None, steps, axis, reverse)


def _compute_loss_and_grads(
    cell: str, schedule: Schedule | None, steps: int, axis: int, reverse: bool
) -> Any:
    make, params, carry = CELLS[cell]()
    xs = _inputs(cell, steps, axis)

    def loss(p: Any, c0: Any, xs: Any) -> jax.Array:
        f = make(p)
        if schedule is None:
            moved = jax.tree_util.tree_map(lambda x: jnp.moveaxis(x, axis, 0), xs)
            c, ys = lax.scan(f, c0, moved, reverse=reverse)
            ys = jax.tree_util.tree_map(lambda y: jnp.moveaxis(y, 0, axis), ys)
        else:
            c, ys = autoremat.scan(f, c0, xs, schedule=schedule, reverse=reverse, axis=axis)
        weights = jnp.cos(jnp.arange(steps, dtype=jnp.float32))
        y = ys[0] if isinstance(ys, tuple) else ys
        y = jnp.moveaxis(y, axis, 0)
        return sum(jnp.sum(v**2) for v in jax.tree_util.tree_leaves(c)) + jnp.sum(
            weights[:, None, None] * y
        )

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(params, carry, xs)


#: How many times the reference's own float32 error (against its float64 value) a
#: schedule's result may differ by. A schedule adds the same terms in another order, so
#: its rounding is of the same size as the reference's; a wrong gradient (a step counted
#: twice or left out, a wrong cotangent) is off by a term, thousands of times more.
ROUNDING_FACTOR = 8


def in_float64(f: Callable[..., Any], *args: Any) -> Any:
    """``f(*args)`` computed in float64 (x64 on for the call; float32 leaves cast up).

    The exact answer a float32 result is judged against: its rounding is ~1e-16 of the
    terms, far below any float32 tolerance.
    """
    enable_x64 = getattr(jax, "enable_x64", None)
    if enable_x64 is None:  # an older jax: the experimental spelling
        from jax.experimental import enable_x64
    with enable_x64(True):
        up = jax.tree_util.tree_map(
            lambda a: jnp.asarray(a, jnp.float64) if jnp.asarray(a).dtype == jnp.float32
            else a, args)
        return jax.tree_util.tree_map(np.asarray, f(*up))


def _key_data(a: Any) -> Any:
    if jax.dtypes.issubdtype(jnp.asarray(a).dtype, jax.dtypes.prng_key):
        return jax.random.key_data(a)
    return a


def close_or_why(got: Any, want: Any, exact: Any = None) -> str:
    """Empty when ``got`` matches ``want`` (see :func:`assert_close`), else the first
    leaf that does not, by its path."""
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    if got_tree != want_tree:
        return f"tree structure differs: {got_tree} vs {want_tree}"
    exact_leaves = ([None] * len(want_leaves) if exact is None
                    else jax.tree_util.tree_leaves(exact))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(want)]
    for path, g, w, e in zip(paths, got_leaves, want_leaves, exact_leaves, strict=True):
        w = np.asarray(_key_data(w))
        scale = float(np.max(np.abs(w))) if w.size else 0.0
        atol = max(ATOL, RTOL * scale)
        if e is not None and w.size:  # the float32 rounding of the sum behind each entry
            rounding = float(np.max(np.abs(w.astype(np.float64) - np.asarray(e))))
            atol = max(atol, ROUNDING_FACTOR * rounding)
        try:
            np.testing.assert_allclose(np.asarray(_key_data(g)), w, rtol=RTOL, atol=atol)
        except AssertionError as err:
            return f"{path or 'value'}: {' '.join(str(err).split())[:400]}"
    return ""


def assert_close(got: Any, want: Any, exact: Any = None) -> None:
    """Same tree structure; every leaf within rtol 1e-5 and an atol of 1e-5 of the leaf's
    largest magnitude (at least 1e-6); typed PRNG keys compared by their data.

    Parameter gradients are sums over steps (and devices); a schedule adds them in
    another order, so float32 rounding moves an entry by ~1e-7 of the *terms* summed,
    which can be far larger than the entry itself when they cancel. The scale-relative
    atol covers what the leaf's own size shows. ``exact`` (``want`` computed in float64,
    see :func:`in_float64`) shows the rest: the atol then also covers
    :data:`ROUNDING_FACTOR` times ``want``'s own largest float32 error, the rounding
    this very sum makes, and nothing a wrong term would add.
    """
    why = close_or_why(got, want, exact)
    assert not why, why


def _temp_bytes(problem: Any, schedule: Schedule) -> int:
    step, args = problem.build(schedule)
    analysis = jax.jit(step).lower(*args).compile().memory_analysis()
    return int(analysis.temp_size_in_bytes)


@functools.cache
def brute_advances(length: int, slots: int) -> int:
    """Fewest advances, by exhaustive recursion over the first snapshot position."""
    if length == 1:
        return 0
    if slots == 1:
        return length - 1 + brute_advances(length - 1, 1)
    return min(m + brute_advances(length - m, slots - 1) + brute_advances(m, slots)
               for m in range(1, length))


# -- the gradient-equality matrix over every kind ------------------------------------

#: (cell, T, axis, reverse): every cell, T in {1, 7, 97, 1000, 1009}, both axes,
#: both directions. A kind's i-th example (``Schedule.examples``) runs on
#: setting ``i`` (cyclically), so a new kind in ``autoremat._schedules.KINDS`` is
#: in the matrix without a test edit.
SETTINGS = [
    ("lstm", 1, 0, False),
    ("lstm", 7, 1, False),
    ("lstm", 97, 1, True),
    ("lstm", 1000, 1, False),
    ("lstm", 1009, 0, True),
    ("lstm", 97, 0, False),
    ("gru", 1, 1, True),
    ("gru", 7, 0, False),
    ("gru", 97, 1, False),
    ("gru", 1009, 1, True),
    ("dict", 1, 0, False),
    ("dict", 7, 0, True),
    ("dict", 97, 1, True),
    ("dict", 1000, 0, False),
    ("dict", 1009, 1, False),
]


def kind_matrix() -> list[Any]:
    """``pytest.param(cell, T, axis, reverse, schedule)`` for every example of every kind."""
    out = []
    for name, kind in KINDS.items():
        for i, schedule in enumerate(kind.examples()):
            cell, steps, axis, reverse = SETTINGS[i % len(SETTINGS)]
            label = f"{name}-{schedule.describe()}-{cell}-T{steps}-axis{axis}"
            out.append(pytest.param(cell, steps, axis, reverse, schedule,
                                    id=label + ("-reverse" if reverse else "")))
    return out


def one_per_kind() -> list[Schedule]:
    """The first example of every kind."""
    return [kind.examples()[0] for kind in KINDS.values()]


# -- remat_scans (test_rewrite*.py): a pure lax.scan RNN over batch-major x ------------------

REWRITE_T = 200
REWRITE_X = jax.random.normal(jax.random.PRNGKey(1), (2, REWRITE_T, 3))
REWRITE_W = {"w": jax.random.normal(jax.random.PRNGKey(2), (8, 8)) * 0.3,
             "u": jax.random.normal(jax.random.PRNGKey(3), (3, 8)) * 0.3}


def rnn_step(p: Any, h: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.tanh(h @ p["w"] + x @ p["u"])


def scan_loss(p: Any, x: jax.Array) -> jax.Array:
    """A ``lax.scan`` RNN over batch-major ``x`` (moved to time-major first)."""
    def step(h: jax.Array, xt: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = rnn_step(p, h, xt)
        return h, h

    _, hs = lax.scan(step, jnp.zeros((x.shape[0], 8)), jnp.moveaxis(x, 1, 0))
    return jnp.mean(hs ** 2)


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str, env: Mapping[str, str] | None = None) -> ModuleType:
    """``examples/<name>.py`` imported as a module (``_example_<name>``), with ``env`` set
    while it loads (the examples read their sizes from the environment)."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in (env or {}).items():
            mp.setenv(k, v)
        spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # flax modules are dataclasses: their module is looked up
        spec.loader.exec_module(module)
    return module


def add_measured_trial(study: Any, schedule: Schedule, total: int, step: float | None,
                       status: str | None = None) -> None:
    """A finished trial holding a measurement as ``tune`` records it: ``total_bytes``, and
    ``step_seconds`` where it was timed (``status`` ``ok``; else ``over_budget``, not timed)."""
    import optuna

    status = status or ("ok" if step is not None else "over_budget")
    attrs = {"measured": True, "status": status, "feasible": status == "ok",
             "total_bytes": total, "step_seconds": step, "schedule": schedule.to_data(),
             "schedule_key": schedule.key(), "reason": ""}
    study.add_trial(optuna.trial.create_trial(
        values=[float(total), step if step is not None else float("inf")], user_attrs=attrs))


#: Two schedules of a 4-layer stack over its own tags (the stack examples' tests).
STACK_SCHEDULES = [
    autoremat.nested([2, 2], ["nothing_saveable", {"save_only_these_names": ["ffn_up"]}]),
    autoremat.groups([(1, {"save_only_these_names": ["attn_qkv", "ffn_down"]}),
                      (3, "nothing_saveable")]),
]


def stack_sizes(prefix: str) -> dict[str, str]:
    """A stack example's tiny sizes, as the environment variables it reads
    (``<prefix>_LAYERS``, ...): 4 layers, width 16, 2 heads, MLP 32, 8 tokens, batch 2."""
    sizes = {"LAYERS": 4, "D_MODEL": 16, "HEADS": 2, "MLP": 32, "SEQ_LEN": 8, "BATCH": 2}
    return {f"{prefix}_{k}": str(v) for k, v in sizes.items()}
