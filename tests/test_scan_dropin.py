"""autoremat.scan as a drop-in for lax.scan, over every schedule kind.

Per category: the ``unroll`` keyword, weak-typed carries (under
``jax_enable_checks``), vmap of a read-only carry, the errors lax.scan users
rely on, and each JAX transformation (``Schedule.UNSUPPORTED`` says which a
kind cannot do; those must raise a clear error). Values and gradients are
compared with lax.scan's (float32, rtol 1e-5).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import autoremat
from autoremat import Schedule, ScheduleError
from autoremat._schedules.base import TRANSFORMS
from autoremat._schedules.groups import GroupsSchedule
from tests.helpers import assert_close, one_per_kind

KINDS = pytest.mark.parametrize("schedule", one_per_kind(), ids=lambda s: s.kind)
T = 9
W = jnp.array([[0.5, -0.4], [0.2, 0.6]])
XS = jnp.sin(jnp.arange(2.0 * T)).reshape(T, 2)


def _scanner(schedule: Schedule | None, **kw: Any) -> Callable[..., Any]:
    """lax.scan (``None``) or autoremat.scan under ``schedule``, with keywords."""
    if schedule is None:
        return lambda f, init, xs=None, length=None: lax.scan(f, init, xs, length, **kw)
    return lambda f, init, xs=None, length=None: autoremat.scan(
        f, init, xs, length, schedule=schedule, **kw)


def _loss(w: jax.Array, schedule: Schedule | None, **kw: Any) -> jax.Array:
    def f(c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        c = jnp.tanh(c @ w + x)
        return c, c * x

    c, ys = _scanner(schedule, **kw)(f, jnp.ones(2), XS)
    return c.sum() + jnp.sum(ys**2)


# -- unroll ------------------------------------------------------------------------------

@KINDS
@pytest.mark.parametrize("unroll", [0, 1, 2, 4, T, 100, True, False])
def test_unroll_keyword_as_lax_scan(schedule: Schedule, unroll: int | bool) -> None:
    grad = jax.value_and_grad(_loss)
    try:
        reference = grad(W, None, unroll=unroll)
    except ValueError:  # older jax's lax.scan refuses unroll=0 (newer ones take it as 1)
        reference = grad(W, None, unroll=1)
    assert_close(grad(W, schedule, unroll=unroll), reference)


@KINDS
def test_unroll_true_unrolls_fully_and_overrides_the_schedule(schedule: Schedule) -> None:
    """The innermost (nested) or forward (binomial) scan gets ``unroll = T``; each group's
    scan (groups) its own length."""
    def unrolls(**kw: Any) -> set[Any]:
        return set(_scan_unrolls(jax.make_jaxpr(lambda w: _loss(w, schedule, **kw))(W).jaxpr))

    full = (max(n for _, n, _ in schedule.spans(T)) if isinstance(schedule, GroupsSchedule)
            else T)
    assert full in unrolls(unroll=True)
    assert full not in unrolls()
    assert 3 in unrolls(unroll=3)


def _scan_unrolls(jaxpr: Any) -> list[Any]:
    """The ``unroll`` of every scan in ``jaxpr`` and the jaxprs inside it."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            out.append(eqn.params["unroll"])
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                out += _scan_unrolls(inner)
    return out


@KINDS
def test_bad_unroll_and_length_are_rejected_as_lax_scan_does(schedule: Schedule) -> None:
    f = lambda c, x: (c + jnp.sum(x), c)  # noqa: E731
    scan = _scanner(schedule)
    with pytest.raises(ValueError, match="`unroll` must be a `bool` or a non-negative `int`"):
        autoremat.scan(f, 0.0, XS, schedule=schedule, unroll=-1)
    with pytest.raises(TypeError, match=r"unroll: expected .*, got 2\.5 \(float\)"):
        autoremat.scan(f, 0.0, XS, schedule=schedule, unroll=2.5)  # type: ignore[arg-type]
    with pytest.raises(jax.errors.ConcretizationTypeError, match="`unroll` argument to `scan`"):
        jax.jit(lambda u: autoremat.scan(f, 0.0, XS, schedule=schedule, unroll=u))(2)
    with pytest.raises(jax.errors.ConcretizationTypeError, match="`length` argument to `scan`"):
        jax.jit(lambda n: scan(f, 0.0, None, n))(3)
    assert int(scan(lambda c, _: (c + 1, c), 0, None, jnp.int32(4))[0]) == 4  # a concrete int


# -- weak types --------------------------------------------------------------------------

@KINDS
@pytest.mark.parametrize("dtype", [jnp.int8, jnp.int16, jnp.float16])
def test_python_scalar_carry_takes_the_body_dtype(schedule: Schedule, dtype: Any) -> None:
    """``init=0`` (weak int32) with an int8/int16/float16 body, under jax_enable_checks."""
    xs = jnp.arange(T).astype(dtype)
    f = lambda c, x: (c + x, c * x)  # noqa: E731
    with jax.enable_checks(True):
        want = lax.scan(f, 0, xs)
        got = _scanner(schedule)(f, 0, xs)
        jitted = jax.jit(lambda xs: _scanner(schedule)(f, 0, xs))(xs)
    for out in (got, jitted):
        assert jax.tree_util.tree_map(lambda a: a.dtype, out) == jax.tree_util.tree_map(
            lambda a: a.dtype, want)
        assert_close(out, want)


@KINDS
def test_python_float_carry_gradient_under_checks(schedule: Schedule) -> None:
    def loss(w: jax.Array, s: Schedule | None) -> jax.Array:
        c, ys = _scanner(s)(lambda c, x: (jnp.sin(c * w + x), c), 0.5, XS[:, 0])
        return c + ys.sum()

    with jax.enable_checks(True):
        assert_close(jax.value_and_grad(loss)(1.5, schedule), jax.value_and_grad(loss)(1.5, None))


# -- vmap of a read-only carry -----------------------------------------------------------

@KINDS
def test_vmap_keeps_a_read_only_carry_unbatched(schedule: Schedule) -> None:
    def run(s: Schedule | None) -> Any:
        def per_example(w: jax.Array, h: jax.Array, xs: jax.Array) -> Any:
            f = lambda c, x: ((c[0], jnp.tanh(c[0] @ c[1] + x)), c[1] * x)  # noqa: E731
            return _scanner(s)(f, (w, h), xs)

        return jax.vmap(per_example, in_axes=(None, 0, 0), out_axes=((None, 0), 0))(
            W, jnp.ones((3, 2)), jnp.stack([XS, -XS, 2 * XS]))

    assert_close(run(schedule), run(None))

    def constant(s: Schedule | None) -> Any:  # the body never changes the carry at all
        return jax.vmap(lambda xs: _scanner(s)(lambda c, x: (c, c * x), jnp.ones(2), xs),
                        out_axes=(None, 0))(jnp.stack([XS, XS]))

    assert_close(constant(schedule), constant(None))

    def grads(s: Schedule | None) -> Any:  # per-example gradients
        return jax.vmap(jax.grad(_loss_xs(s)), in_axes=(None, 0))(W, jnp.stack([XS, -XS]))

    assert_close(grads(schedule), grads(None))


def _loss_xs(s: Schedule | None) -> Callable[[jax.Array, jax.Array], jax.Array]:
    def loss(w: jax.Array, xs: jax.Array) -> jax.Array:
        f = lambda c, x: ((c[0], jnp.tanh(c[0] @ c[1] + x)), x)  # noqa: E731
        (_, h), ys = _scanner(s)(f, (w, jnp.zeros(2)), xs)
        return h.sum() + ys.sum()

    return loss


# -- errors ------------------------------------------------------------------------------

@KINDS
def test_errors_name_the_leaf_both_types_and_the_schedule(schedule: Schedule) -> None:
    name = schedule.describe()
    scan = _scanner(schedule)
    with pytest.raises(ValueError, match=r"no leading axis to scan over: xs\['b'\] is a scalar"):
        scan(lambda c, x: (c, x), 0.0, {"a": XS, "b": 1.0})
    with pytest.raises(TypeError, match=r"(?s)^scan body function carry input and carry "
                       r"output must have the same pytree structure.*The input carry component c\['h'\] is "
                       r"a .*(ShapedArray|Tracer).* but the corresponding component of the carry output "
                       r"is a <class 'tuple'>") as info:
        scan(lambda c, x: ({"h": (c["h"], x)}, x), {"h": jnp.ones(2)}, XS)
    assert name in str(info.value)
    with pytest.raises(TypeError, match=r"(?s)^scan body function carry input and carry "
                       r"output must have equal types.*input carry component c\[1\] has type float32\[2\] "
                       r"but the corresponding output carry component has type int32\[2\], so "
                       r"the dtypes") as info:
        scan(lambda c, x: ((c[0], x.astype(jnp.int32)), x), (0.0, jnp.ones(2)), XS)
    assert name in str(info.value)
    with pytest.raises(TypeError, match=r"input carry c has type float32\[2\] but the "
                       r"corresponding output carry component has type float32\[3\], so the shapes"):
        scan(lambda c, x: (jnp.ones(3), x), jnp.ones(2), XS)
    with pytest.raises(TypeError, match=r"^scan body output must be a pair, got float32\[2\]\.") as info:
        scan(lambda c, x: c, jnp.ones(2), XS)
    assert name in str(info.value)
    with pytest.raises(TypeError, match="scan body output must be a pair"):
        scan(lambda c, x: (c, x, x), jnp.ones(2), XS)


@KINDS
def test_errors_begin_with_lax_scans_text_in_its_order(schedule: Schedule) -> None:
    with pytest.raises(TypeError, match=r"^lax\.scan: f argument should be a callable"):
        autoremat.scan(42, 0, 1, schedule=schedule)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as info:
        autoremat.scan(lambda c, x: (c, x), 0, jnp.arange(10), length=5, schedule=schedule)
    assert str(info.value) == ("scan got `length` argument of 5 which disagrees with leading "
                               "axis sizes [10].")
    with pytest.raises(ValueError, match=r"^scan got values with different leading axis sizes"):
        autoremat.scan(lambda c, x: (c, x), 0, (jnp.ones(3), jnp.ones(4)), schedule=schedule)


@KINDS
def test_read_only_carry_under_cond_with_a_batched_predicate(schedule: Schedule) -> None:
    """JAX's test_scan_readonly_carry_optimization: the carry the body returns unchanged
    is forwarded, so vmap(out_axes=None) over cond(batched x, ...) works."""
    def f(x: jax.Array, y: float, s: Schedule | None) -> Any:
        def g(_: Any, y: Any) -> Any:
            return _scanner(s)(lambda y, _: (y, None), y, None, 1)[0]

        return jax.lax.cond(x < 0, g, g, x, y)

    got = jax.vmap(lambda x, y: f(x, y, schedule), (0, None), None)(jnp.arange(3.0), 3.0)
    assert float(got) == 3.0


# -- transformations ---------------------------------------------------------------------

def _scalar_loss(w: jax.Array, s: Schedule | None) -> jax.Array:
    c, ys = _scanner(s)(lambda c, x: (jnp.sin(c * w + x), c * w), jnp.float32(0.5), XS[:, 0])
    return c + jnp.sum(ys**2)


TRANSFORM: dict[str, Callable[[Callable[[Any], Any]], Any]] = {
    "grad": lambda g: jax.grad(g)(1.2),
    "grad_of_grad": lambda g: jax.grad(jax.grad(g))(1.2),
    "jvp": lambda g: jax.jvp(g, (1.2,), (1.0,)),
    "linearize": lambda g: jax.linearize(g, 1.2)[1](1.0),
    "hessian": lambda g: (jax.hessian(g)(1.2), jax.jacfwd(jax.grad(g))(1.2), jax.jacfwd(g)(1.2)),
    "vmap": lambda g: jax.vmap(jax.value_and_grad(g))(jnp.array([0.3, 1.2])),
    "jit": lambda g: jax.jit(jax.value_and_grad(g))(1.2),
}


@KINDS
@pytest.mark.parametrize("name", TRANSFORMS)
def test_transformations_match_lax_scan_or_raise_clearly(schedule: Schedule, name: str) -> None:
    apply = TRANSFORM[name]
    if name not in schedule.UNSUPPORTED:
        assert_close(apply(lambda w: _scalar_loss(w, schedule)),
                      apply(lambda w: _scalar_loss(w, None)))
        return
    with pytest.raises(ScheduleError, match=rf"{schedule.kind}.*a nested schedule") as info:
        apply(lambda w: _scalar_loss(w, schedule))
    assert "\n" not in str(info.value) and repr(schedule.describe()) in str(info.value)
    if name == "linearize":  # raised at trace time: jax.linearize itself, not its map
        with pytest.raises(ScheduleError, match=r"jax\.linearize"):
            jax.linearize(lambda w: _scalar_loss(w, schedule), 1.2)


def test_every_transformation_has_a_check() -> None:
    assert set(TRANSFORM) == set(TRANSFORMS)


@KINDS
def test_grad_of_grad_through_the_cotangent_only_works(schedule: Schedule) -> None:
    """An outer gradient that reaches the scan only through its cotangent (not a
    residual) differentiates the backward linearly: every kind supports it."""
    def outer(a: jax.Array, s: Schedule | None) -> jax.Array:
        return jax.grad(lambda w: a * _scalar_loss(w, s))(1.2)

    assert_close(jax.grad(outer)(2.0, schedule), jax.grad(outer)(2.0, None))


# -- tracing: no more often than lax.scan ------------------------------------------------

def _counted(scanner: Callable[..., Any]) -> tuple[list[int], Any]:
    """How often one step function is traced, cumulatively, after each of: two eager
    calls, a call inside ``jit``, ``value_and_grad``; and the values and gradient."""
    counts, traces = [], 0

    def f(c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        nonlocal traces
        traces += 1
        c = jnp.tanh(c @ W + x)
        return c, c * x

    def loss(init: jax.Array) -> jax.Array:
        c, ys = scanner(f, init, XS)
        return c.sum() + jnp.sum(ys**2)

    first = loss(jnp.ones(2))
    second = loss(jnp.ones(2) * 0.5)
    counts.append(traces)
    jitted = jax.jit(loss)(jnp.ones(2))
    counts.append(traces)
    value, grad = jax.value_and_grad(loss)(jnp.ones(2))
    counts.append(traces)
    return counts, (first, second, jitted, value, grad)


@KINDS
def test_the_step_is_traced_no_more_often_than_under_lax_scan(schedule: Schedule) -> None:
    """The step's trace is cached as lax.scan caches its body's (by the function and
    the inputs' types): calling the same step again does not retrace it."""
    ref_counts, reference = _counted(_scanner(None))
    counts, values = _counted(_scanner(schedule))
    assert ref_counts[0] == 1  # lax.scan traces the body once for two calls
    assert counts == ref_counts
    assert_close(values, reference)


@KINDS
def test_a_trace_closing_over_another_traces_values_is_not_reused(schedule: Schedule) -> None:
    """A step reading a value of the enclosing jit trace (here through a dict) is
    traced again in the next jit trace: a kept trace would hold the old tracer
    (lax.scan's cache does: it raises UnexpectedTracerError here)."""
    box: dict[str, jax.Array] = {}

    def f(c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return c + box["a"] * x, c

    @jax.jit
    def total(a: jax.Array, xs: jax.Array) -> jax.Array:
        box["a"] = a
        return autoremat.scan(f, jnp.zeros(()), xs, schedule=schedule)[0]

    assert float(total(jnp.float32(1.0), jnp.ones(4))) == 4.0
    assert float(total(jnp.float32(2.0), jnp.ones(5))) == 10.0  # a new jit trace


@KINDS
def test_a_kept_trace_depends_on_the_axis_environment(schedule: Schedule) -> None:
    """JAX's test_caches_depend_on_axis_env: the same step under two vmap axis sizes."""
    def step(c: Any, _: None) -> tuple[jax.Array, None]:
        return lax.axis_size("i"), None

    def f() -> jax.Array:
        return autoremat.scan(step, 0, None, length=1, schedule=schedule)[0]

    for size in (2, 3):
        assert int(jax.vmap(f, axis_name="i", axis_size=size, out_axes=None)()) == size
