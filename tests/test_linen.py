"""autoremat.linen.scan against flax.linen.scan (float32, rtol 1e-5).

The seed's SimpleLSTM is switched by exactly two edits (``import autoremat``;
``nn.scan`` -> ``autoremat.linen.scan`` with ``schedule=``): outputs, the
parameter tree and gradients must equal ``nn.scan``'s, for plain, 2- and
3-level schedules, including lengths the schedule does not tile.
"""

from __future__ import annotations

import doctest
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat
import autoremat.linen
from autoremat import Schedule, ScheduleError
from tests.helpers import RTOL, assert_close

BATCH, FEAT, HID, OUT = 2, 4, 8, 3
ScanFn = Callable[..., Any]


def seed_model(scan_fn: ScanFn, seq2seq: bool) -> nn.Module:
    """The seed's model, with ``nn.scan`` replaced by ``scan_fn``."""

    class SimpleLSTM(nn.Module):
        hidden_size: int
        output_dim: int
        seq2seq: bool

        def setup(self) -> None:
            self.cell = nn.OptimizedLSTMCell(self.hidden_size)
            self.linear = nn.Dense(self.output_dim)

        @functools.partial(scan_fn, variable_broadcast="params", in_axes=1, out_axes=1,
                           split_rngs={"params": False})
        def forward(self, carry: Any, x: jax.Array) -> Any:
            return self.cell(carry, x)

        def __call__(self, x: jax.Array) -> jax.Array:
            carry = self.cell.initialize_carry(jax.random.PRNGKey(0), x[:, 0].shape)
            _, outputs = self.forward(carry, x)
            return self.linear(outputs) if self.seq2seq else self.linear(outputs[:, -1])

    return SimpleLSTM(HID, OUT, seq2seq)


def autoremat_scan(schedule: Schedule) -> ScanFn:
    return functools.partial(autoremat.linen.scan, schedule=schedule)


def data(steps: int) -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(1), (BATCH, steps, FEAT), jnp.float32)


def runner(model: nn.Module) -> Callable[[Any, jax.Array], tuple[jax.Array, Any]]:
    """Jitted: output, and gradients w.r.t. params and inputs of a fixed projection."""

    def loss(p: Any, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        y = model.apply(p, x)
        w = jnp.cos(jnp.arange(y.size, dtype=y.dtype)).reshape(y.shape)
        return jnp.sum(y * w), y

    grad = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))

    def run(params: Any, x: jax.Array) -> tuple[jax.Array, Any]:
        grads, y = grad(params, x)
        return y, grads

    return run


@functools.cache
def reference_runner(seq2seq: bool) -> Callable[[Any, jax.Array], tuple[jax.Array, Any]]:
    """nn.scan's runner, compiled once per input shape and reused by every test."""
    return runner(seed_model(nn.scan, seq2seq))


@functools.cache
def reference_params() -> Any:
    """nn.scan's init (param shapes do not depend on the sequence length)."""
    return jax.jit(seed_model(nn.scan, True).init)(jax.random.PRNGKey(0), data(13))


@functools.cache
def reference(seq2seq: bool, steps: int) -> tuple[jax.Array, Any]:
    """nn.scan's output and gradients."""
    return reference_runner(seq2seq)(reference_params(), data(steps))


def shapes(tree: Any) -> Any:
    return jax.tree_util.tree_map(jnp.shape, tree)


def cell_params(name: str) -> Any:
    """The seed's trained LSTM cell params under another module name."""
    return {"params": {name: reference_params()["params"]["cell"]}}


MIXED3 = ("nothing_saveable", "dots_saveable", "none")


@pytest.mark.parametrize(
    ("seq2seq", "steps", "schedule"),
    [
        (True, 13, autoremat.plain(13)),
        (True, 13, autoremat.nested([2, 3])),  # 13 = 2*6 + 1: a remainder piece
        (False, 13, autoremat.nested([2, 2, 2], MIXED3)),  # 3 levels, 13 = 3*4 + 1
        (False, 13, autoremat.nested([2, 16], ("nothing_saveable", "dots_saveable"))),  # T < chunk
        (True, 13, autoremat.binomial(3)),
        (False, 13, autoremat.binomial(1)),
    ],
    ids=lambda v: v.describe().replace(" ", "_") if isinstance(v, Schedule) else str(v),
)
def test_seed_lstm_matches_nn_scan(seq2seq: bool, steps: int, schedule: Schedule) -> None:
    ref_y, ref_grads = reference(seq2seq, steps)
    model, x = seed_model(autoremat_scan(schedule), seq2seq), data(steps)
    # The parameter tree at init: same structure and shapes (abstract init: no compile).
    ref_params = reference_params()
    abstract = jax.eval_shape(model.init, jax.random.PRNGKey(0), x)
    assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(ref_params)
    assert shapes(abstract) == shapes(ref_params)

    y, grads = runner(model)(ref_params, x)  # nn.scan's params load into the autoremat model
    assert y.shape == ref_y.shape
    assert_close(y, ref_y)
    assert_close(grads, ref_grads)  # w.r.t. params and inputs
    assert float(jnp.abs(grads[1]).sum()) > 0  # the input gradient is not trivially zero


def primitive_names(jaxpr: Any) -> list[str]:
    """Every primitive in a (closed) jaxpr, sub-jaxprs (scan, checkpoint bodies) included."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    names.extend(primitive_names(sub))
    return names


def test_schedule_is_applied() -> None:
    """The nested schedule really runs as nested, checkpointed scans (tracing only)."""
    checkpoint = jax.make_jaxpr(jax.checkpoint(jnp.sin))(1.0).eqns[0].primitive.name
    x, params = data(13), reference_params()

    def names(schedule: Schedule) -> list[str]:
        return primitive_names(jax.make_jaxpr(
            seed_model(autoremat_scan(schedule), True).apply)(params, x))

    plain, nested = names(autoremat.plain(13)), names(autoremat.nested([2, 3]))
    assert plain.count("scan") == 1 and checkpoint not in plain
    # 13 = 2 chunks of 6 + 1 step: an outer scan whose checkpointed body is an inner
    # scan of checkpointed steps, then a 1-step remainder scan of a checkpointed step
    assert nested.count("scan") == 3 and nested.count(checkpoint) == 3


def test_init_values_and_params_load_either_way() -> None:
    steps = 13
    x = data(steps)
    model = seed_model(autoremat_scan(autoremat.nested([2, 3])), True)
    ours = jax.jit(model.init)(jax.random.PRNGKey(0), x)
    # The same values as nn.scan's init, not only the same tree ...
    assert_close(ours, reference_params())
    # ... and they load into nn.scan's model (the other way is in the test above).
    y, grads = reference_runner(True)(ours, x)
    assert_close((y, grads), reference(True, steps))


def class_model(scan_fn: ScanFn, **kwargs: Any) -> nn.Module:
    """``scan_fn(nn.OptimizedLSTMCell, ...)(features)``, as in nn.scan's docs."""

    class LSTM(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> Any:
            scan_cell = scan_fn(nn.OptimizedLSTMCell, variable_broadcast="params",
                                split_rngs={"params": False}, in_axes=1, out_axes=1, **kwargs)
            cell = scan_cell(HID)
            carry = cell.initialize_carry(jax.random.PRNGKey(0), x[:, 0].shape)
            return cell(carry, x)

    return LSTM()


def test_module_class_target_reverse() -> None:
    reverse = True
    schedule = autoremat.nested([2, 3])
    scanned = autoremat.linen.scan(nn.OptimizedLSTMCell, schedule=schedule)
    assert scanned.__name__ == nn.scan(nn.OptimizedLSTMCell).__name__ == "ScanOptimizedLSTMCell"
    x = data(13)
    ref = class_model(nn.scan, reverse=reverse)
    # methods={name: overrides}: here reverse=True for __call__ only
    ours = class_model(autoremat.linen.scan, schedule=schedule,
                       methods={"__call__": {"reverse": reverse}})
    key = jax.random.key(0)  # typed keys work too
    ref_abstract = jax.eval_shape(ref.init, key, x)
    abstract = jax.eval_shape(ours.init, key, x)
    assert list(abstract["params"]) == ["ScanOptimizedLSTMCell_0"]  # auto-named like nn.scan
    assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(ref_abstract)
    assert shapes(abstract) == shapes(ref_abstract)
    ref_params = cell_params("ScanOptimizedLSTMCell_0")
    assert_close(jax.jit(ours.apply)(ref_params, x), jax.jit(ref.apply)(ref_params, x))


class DropoutCell(nn.Module):
    """An LSTM cell with dropout on its input (needs a 'dropout' rng)."""

    features: int

    @nn.compact
    def __call__(self, carry: Any, x: jax.Array) -> Any:
        x = nn.Dropout(0.5, deterministic=False)(x)
        return nn.OptimizedLSTMCell(self.features)(carry, x)


def dropout_model(scan_fn: ScanFn) -> nn.Module:
    class Model(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            cell = scan_fn(DropoutCell, variable_broadcast="params", in_axes=1, out_axes=1,
                           split_rngs={"params": False, "dropout": True})(HID)
            carry = nn.OptimizedLSTMCell(HID, parent=None).initialize_carry(
                jax.random.PRNGKey(0), x[:, 0].shape)
            return cell(carry, x)[1]

    return Model()


def test_split_rngs_dropout() -> None:
    x = data(13)
    rngs = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(5)}
    drop7 = {"dropout": jax.random.PRNGKey(7)}
    ref = dropout_model(nn.scan)
    ref_abstract = jax.eval_shape(ref.init, rngs, x)
    ref_params = {"params": {"ScanDropoutCell_0": {
        "OptimizedLSTMCell_0": reference_params()["params"]["cell"]}}}
    assert shapes(ref_params) == shapes(ref_abstract)
    ref_y = jax.jit(ref.apply)(ref_params, x, rngs=drop7)
    for schedule in (autoremat.nested([2, 3]), autoremat.nested([2, 2, 2]), autoremat.binomial(3)):
        model = dropout_model(autoremat_scan(schedule))
        abstract = jax.eval_shape(model.init, rngs, x)
        assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(ref_abstract)
        assert shapes(abstract) == shapes(ref_abstract)
        apply = jax.jit(model.apply)
        y = apply(ref_params, x, rngs=drop7)
        np.testing.assert_array_equal(np.asarray(apply(ref_params, x, rngs=drop7)), np.asarray(y))
        other = apply(ref_params, x, rngs={"dropout": jax.random.PRNGKey(8)})
        assert not np.allclose(np.asarray(y), np.asarray(other))  # the rng is used
        # Per-step keys are split as nn.scan splits them, and every trace sees the
        # same rng counters: nn.scan's dropout masks, whatever the schedule.
        assert_close(y, ref_y)


class Block(nn.Module):
    """A residual layer that sows its activations."""

    @nn.compact
    def __call__(self, h: jax.Array, _: None) -> tuple[jax.Array, jax.Array]:
        h = h + nn.Dense(FEAT)(h)
        self.sow("intermediates", "h", h)
        return jnp.tanh(h), h.sum()


def stack_model(scan_fn: ScanFn) -> nn.Module:
    class Stack(nn.Module):
        @nn.compact
        def __call__(self, h: jax.Array) -> Any:
            layers = scan_fn(Block, variable_axes={"params": 0, "intermediates": 0},
                             split_rngs={"params": True}, length=5)
            return layers()(h, None)

    return Stack()


def test_variable_axes_layer_stack() -> None:
    h = jnp.ones((3, FEAT))
    ref, ours = stack_model(nn.scan), stack_model(autoremat_scan(autoremat.nested([2, 2])))
    ref_vars = jax.jit(ref.init)(jax.random.PRNGKey(0), h)
    our_vars = jax.jit(ours.init)(jax.random.PRNGKey(0), h)
    assert shapes(our_vars["params"])["ScanBlock_0"]["Dense_0"]["kernel"] == (5, FEAT, FEAT)
    assert_close(our_vars, ref_vars)  # per-layer keys split exactly like nn.scan
    params = {"params": ref_vars["params"]}
    ref_out = ref.apply(params, h, mutable=["intermediates"])
    our_out = ours.apply(params, h, mutable=["intermediates"])
    assert_close(our_out, ref_out)


def counter_model(scan_fn: ScanFn) -> nn.Module:
    class Counter(nn.Module):
        @functools.partial(scan_fn, variable_carry="state", in_axes=(0, nn.broadcast))
        def body(self, c: jax.Array, x: jax.Array, w: jax.Array) -> Any:
            n = self.variable("state", "n", lambda: jnp.zeros((), jnp.int32))
            n.value += 1
            return c + x * w, c

        @nn.compact
        def __call__(self, xs: jax.Array, w: jax.Array) -> Any:
            self.variable("state", "n", lambda: jnp.zeros((), jnp.int32))
            return self.body(jnp.zeros(xs.shape[1:]), xs, w)

    return Counter()


def test_variable_carry_and_broadcast_argument() -> None:
    xs, w = jnp.arange(21.0).reshape(7, 3), jnp.array([1.0, 2.0, 3.0])
    results = []
    for scan_fn in (nn.scan, autoremat_scan(autoremat.nested([2, 2])),
                    autoremat_scan(autoremat.binomial(2))):
        model = counter_model(scan_fn)
        variables = jax.jit(model.init)(jax.random.PRNGKey(0), xs, w)
        apply = functools.partial(model.apply, mutable=["state"])
        out, state = jax.jit(apply)(variables, xs, w)
        grad_w = jax.jit(jax.grad(
            lambda w, f=apply, v=variables: f(v, xs, w)[0][1].sum()))(w)
        results.append((variables, out, state, grad_w))
    (ref_vars, ref_out, ref_state, ref_grad), *ours = results
    for variables, out, state, grad_w in ours:
        assert int(variables["state"]["n"]) == int(ref_vars["state"]["n"]) == 7
        assert int(state["state"]["n"]) == int(ref_state["state"]["n"]) == 14
        assert_close(out, ref_out)
        np.testing.assert_allclose(np.asarray(out[0]), np.asarray(xs.sum(0) * w), rtol=RTOL)
        assert_close(grad_w, ref_grad)  # gradient through the broadcast argument


def test_schedule_file_and_unroll(tmp_path: Path) -> None:
    path = autoremat.save_schedule(autoremat.nested([2, 3]), tmp_path / "s.yaml")
    assert autoremat.linen.scan(nn.OptimizedLSTMCell, schedule=str(path)) is not None
    with pytest.raises(ScheduleError, match=r"missing\.yaml: cannot read"):
        autoremat.linen.scan(nn.OptimizedLSTMCell, schedule=tmp_path / "missing.yaml")
    steps = 13
    model = seed_model(functools.partial(autoremat.linen.scan, schedule=path, unroll=2), True)
    y = jax.jit(model.apply)(reference_params(), data(steps))
    assert_close(y, reference(True, steps)[0])


def test_errors() -> None:
    with pytest.raises(ScheduleError, match="schedule"):
        autoremat.linen.scan(nn.OptimizedLSTMCell, schedule=[2, 3])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="out_axes"):
        autoremat.linen.scan(nn.OptimizedLSTMCell, schedule=autoremat.nested([2]),
                             out_axes=nn.broadcast)
    with pytest.raises(TypeError, match="unexpected argument"):
        autoremat.linen.scan(nn.OptimizedLSTMCell, schedule=autoremat.nested([2]),
                             methods={"__call__": {"revers": True}})
    with pytest.raises(ValueError, match="variable_axes"):
        autoremat.linen.scan(Block, schedule=autoremat.nested([2]),
                             variable_axes={"params": nn.broadcast})
    with pytest.raises(ValueError, match="no values to scan over and `length` not provided"):
        broadcast_only = autoremat.linen.scan(Block, schedule=autoremat.nested([2]),
                                              in_axes=nn.broadcast)
        broadcast_only().init(jax.random.PRNGKey(0), jnp.ones((3, FEAT)), None)


def test_module_docstring_example_runs() -> None:
    result = doctest.testmod(autoremat.linen, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 5
    assert result.failed == 0


def test_binomial_layer_stack_gradients_through_scanned_params() -> None:
    """Per-layer params are scanned inputs: their cotangents come from the reversals."""
    h = jnp.ones((3, FEAT))
    ref, ours = stack_model(nn.scan), stack_model(autoremat_scan(autoremat.binomial(2)))
    params = {"params": jax.jit(ref.init)(jax.random.PRNGKey(0), h)["params"]}

    def grads(model: nn.Module) -> Any:
        def loss(p: Any) -> jax.Array:
            out, ys = model.apply(p, h)
            return jnp.sum(out**2) + jnp.sum(ys * jnp.arange(1.0, 6.0))

        return jax.jit(jax.value_and_grad(loss))(params)

    assert_close(grads(ours), grads(ref))


def counted_stack(scan_fn: ScanFn, check: bool) -> tuple[list[int], Any]:
    """A dropout layer stack scanned with ``check_constancy_invariants=check``: how
    often the layer was traced after ``init`` and after a gradient of ``apply``
    (both jitted), and the parameters, values and gradients."""
    traces = 0

    class Layer(nn.Module):
        @nn.compact
        def __call__(self, h: jax.Array, _: None) -> tuple[jax.Array, jax.Array]:
            nonlocal traces
            traces += 1
            h = jnp.tanh(nn.Dense(FEAT)(h))
            return nn.Dropout(0.5, deterministic=False)(h), h.sum()

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, h: jax.Array) -> Any:
            layers = scan_fn(Layer, variable_axes={"params": 0}, length=5,
                             split_rngs={"params": True, "dropout": True},
                             check_constancy_invariants=check)
            return layers()(h, None)

    model, h = Stack(), jnp.ones((3, FEAT))
    rngs = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}
    variables = jax.jit(model.init)(rngs, h)
    counts = [traces]

    def loss(v: Any) -> tuple[jax.Array, Any]:
        out, ys = model.apply(v, h, rngs={"dropout": jax.random.PRNGKey(2)})
        return jnp.sum(out**2) + jnp.sum(ys * jnp.arange(1.0, 6.0)), (out, ys)

    grads, outputs = jax.jit(jax.grad(loss, has_aux=True))(variables)
    counts.append(traces)
    return counts, (variables, outputs, grads)


@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("schedule", [autoremat.nested([2, 2]), autoremat.binomial(2)],
                         ids=["nested", "binomial"])
def test_check_constancy_invariants_traces_and_rngs_as_nn_scan(
        schedule: Schedule, check: bool) -> None:
    """Flax's test_jit_scan_retracing_*: False traces the layer once per call (no
    pass outside the loop), True twice, as nn.scan; params, dropout masks and
    gradients are nn.scan's with the same argument."""
    ref_counts, reference = counted_stack(nn.scan, check)
    counts, values = counted_stack(autoremat_scan(schedule), check)
    assert ref_counts == ([1, 2] if not check else [2, 4])
    assert counts == ref_counts
    assert_close(values, reference)
