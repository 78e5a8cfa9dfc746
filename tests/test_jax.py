"""``autoremat._jax`` against the installed JAX: each reader of JAX's internals on a jaxpr
this JAX makes. CI runs this file on the floor in ``pyproject.toml`` and on the newest JAX
pip resolves, so a release that renames a parameter fails here first, by name.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from autoremat import _jax as ji


def _eqns(fn: Any, *args: Any) -> list[Any]:
    return list(jax.make_jaxpr(fn)(*args).jaxpr.eqns)


def _scan_eqn(unroll: int = 1, reverse: bool = False) -> Any:
    def fn(c: jax.Array, xs: jax.Array, w: jax.Array) -> Any:
        return lax.scan(lambda c, x: (c * w + x, (c, x * w)), c, xs, unroll=unroll,
                        reverse=reverse)

    (eqn,) = _eqns(fn, jnp.ones(3), jnp.ones((7, 3)), 2.0)
    return eqn


def test_scan_params() -> None:
    eqn = _scan_eqn(unroll=2, reverse=True)
    assert eqn.primitive is ji.SCAN
    assert ji.scan_split(eqn.params) == (1, 1)  # w is a const; c the carry; xs scanned
    assert len(eqn.invars) == 3 and len(eqn.outvars) == 3  # carry, then two stacked ys
    assert eqn.params[ji.LENGTH] == 7 and eqn.params[ji.REVERSE] is True
    assert eqn.params[ji.UNROLL] == 2
    body = eqn.params[ji.SCAN_BODY]
    assert isinstance(body, ji.ClosedJaxpr) and len(body.jaxpr.invars) == 3


def test_scan_split_of_pytrees() -> None:
    def fn(c: Any, xs: Any) -> Any:
        return lax.scan(lambda c, x: ((c[0] + x["a"], c[1] * 2), x["b"]), c, xs)

    (eqn,) = _eqns(fn, (jnp.ones(2), jnp.ones(())), {"a": jnp.ones((5, 2)), "b": jnp.ones(5)})
    assert ji.scan_split(eqn.params) == (0, 2)


def test_jit_remat_cond_transpose_params() -> None:
    def fn(x: jax.Array) -> Any:
        y = jax.jit(lambda v: v * 2)(x)
        z = jax.checkpoint(jnp.sin, policy=jax.checkpoint_policies.nothing_saveable)(y)
        w = lax.cond(x[0, 0] > 0, lambda v: v, lambda v: -v, z)
        return jnp.transpose(w, (1, 0))

    eqns = {e.primitive: e for e in _eqns(fn, jnp.ones((2, 3)))}
    assert isinstance(eqns[ji.JIT].params[ji.JIT_BODY], ji.ClosedJaxpr)
    remat = eqns[ji.REMAT].params
    assert isinstance(remat[ji.REMAT_BODY], ji.Jaxpr)
    assert remat[ji.REMAT_POLICY] is jax.checkpoint_policies.nothing_saveable
    assert remat[ji.REMAT_PREVENT_CSE] in (True, False)
    branches = eqns[ji.COND].params[ji.COND_BRANCHES]
    assert len(branches) == 2 and all(isinstance(b, ji.ClosedJaxpr) for b in branches)
    assert tuple(eqns[ji.TRANSPOSE].params[ji.PERMUTATION]) == (1, 0)
    assert len(list(ji.sub_jaxprs(remat))) == 1


def test_bind_re_evaluates_an_equation() -> None:
    eqn = _scan_eqn()
    args = [jnp.ones(3), jnp.arange(21.0).reshape(7, 3), jnp.asarray(2.0)]
    n_consts, _ = ji.scan_split(eqn.params)
    ordered = args[2:] + args[:2] if n_consts else args  # operands: consts, carry, xs
    got = ji.bind(eqn, ordered)
    want = jax.tree.leaves(lax.scan(lambda c, x: (c * 2.0 + x, (c, x * 2.0)), args[0], args[1]))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w)


def test_checkpoint_name_and_custom_jvp() -> None:
    from jax.ad_checkpoint import checkpoint_name

    (eqn,) = _eqns(lambda x: checkpoint_name(x * 2, "h"), jnp.ones(2))[1:]
    assert eqn.primitive.name == ji.CHECKPOINT_NAME and eqn.params[ji.CHECKPOINT_NAME_PARAM] == "h"

    @jax.custom_jvp
    def f(x: jax.Array) -> jax.Array:
        return jnp.sin(x)

    f.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))
    (call,) = _eqns(f, jnp.ones(2))
    rule = ji.custom_jvp_rule(call)  # None where this JAX does not expose the rule
    assert rule is None or isinstance(rule[0], ji.Jaxpr)


def test_tracer_classes_and_trace_context() -> None:
    seen: dict[str, bool] = {}

    def probe(x: jax.Array) -> jax.Array:
        seen["jvp"] = ji.traced_by("JVPTracer", x)
        return x * 2

    jax.jvp(probe, (jnp.ones(2),), (jnp.ones(2),))
    assert seen["jvp"]
    assert not ji.traced_by("JVPTracer", jnp.ones(2))
    assert ji.trace_context() is not None
    cached = ji.trace_cache(lambda f, n: n + 1)
    assert cached(probe, 1) == 2


def test_source_locations_name_this_file() -> None:
    (eqn,) = _eqns(lambda x: jnp.sin(x), jnp.ones(2))
    assert "test_jax.py" in ji.user_location(eqn)
    assert ji.has_user_frame(eqn)


def _lowered_text() -> str:
    def step(x: jax.Array) -> jax.Array:  # a new function: traced anew, as each compile is
        return jnp.sin(x) * 2

    return str(jax.jit(step).lower(jnp.ones(3)).as_text(debug_info=True))


def _under_another_caller() -> str:
    return _lowered_text()


def test_same_locations_anywhere_lowers_one_program_under_any_caller() -> None:
    """JAX's default puts the whole stack of the trace in each location; inside, a step
    traced under two callers lowers to the same text (a lockstep tune's processes)."""
    assert _lowered_text() != _under_another_caller()
    with ji.same_locations_anywhere():
        assert _lowered_text() == _under_another_caller()
        assert "test_jax.py" in _lowered_text()  # the operation's own frame stays
    assert _lowered_text() != _under_another_caller()  # JAX's default again outside


def test_a_scan_with_neither_form_is_refused_by_name() -> None:
    with pytest.raises(NotImplementedError, match=r"num_consts/num_carry nor ft_in.*jax >= "):
        ji.scan_split({"length": 3})


def test_nnx_scan_reaches_the_loop() -> None:
    from flax import nnx

    calls = []

    def loop(f: Any, init: Any, xs: Any, *args: Any, **kw: Any) -> Any:
        calls.append(1)
        return lax.scan(f, init, xs, *args, **kw)

    scan = ji.nnx_scan_with(loop)
    out = scan(lambda c, x: (c + x, c), in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))(
        jnp.zeros(()), jnp.arange(4.0))
    assert calls and float(out[0]) == 6.0
