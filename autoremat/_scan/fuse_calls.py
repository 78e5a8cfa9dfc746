"""Calls in a readout moved into the scan: ``jit`` bodies and ``custom_jvp`` functions.

A loss often calls helpers that are calls in the jaxpr: a jitted function
(``jnp.take_along_axis``, ``jax.nn.log_sigmoid``) or a function with its own
derivative rule (``jax.nn.relu``, ``jnp.logaddexp`` and so ``softplus`` and
the sigmoid cross entropy). ``call_rule`` moves one into the step when every
equation of its body acts on each time step separately (``program``): a
``jit`` body is run per step inline; a ``custom_jvp`` function becomes a
per-step ``jax.custom_jvp`` whose primal and derivative rule are its own
body and its own rule, each run per step -- the derivative stays the one
its author wrote. Anything else is reported as blocking, and left as written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoremat import _jax as ji
from autoremat._errors import AutorematError
from autoremat._scan.fuse_rules import (
    ALIGNED,
    CONST,
    SPLAT,
    SQUEEZE,
    STEP,
    Operand,
    PerStep,
    per_step,
    with_splats,
)


@dataclass(frozen=True)
class Program:
    """A call's body run per step: ``rules`` for the equations on per-step values (the
    others run as written on loop-invariant ones); ``out_axes`` its outputs' time axes."""

    jaxpr: Any
    consts: tuple[Any, ...]
    rules: Mapping[int, PerStep]
    out_axes: tuple[int, ...]


@dataclass(frozen=True)
class Call:
    """A ``jit`` (``body``) or ``custom_jvp`` call (``body`` and its rule ``jvp``) per step.

    A ``custom_jvp`` call inside another one's rule (``relu``'s rule calls
    ``relu``) has its rule read only when it is differentiated (a second
    derivative): ``eqn`` and ``axes`` are kept for that.
    """

    body: Program
    jvp: Program | None = None
    eqn: Any = None
    axes: tuple[int | None, ...] = ()


def program(jaxpr: Any, consts: Sequence[Any], in_axes: Sequence[int | None],
            in_rule: bool = False) -> Program | str:
    """``jaxpr`` per step, its inputs stacked along ``in_axes`` (``None``: loop-invariant);
    why not, as a string. ``in_rule``: ``jaxpr`` is a derivative rule."""
    axis = {v: a for v, a in zip(jaxpr.invars, in_axes, strict=True) if a is not None}
    producer: dict[Any, Any] = {}
    rules: dict[int, PerStep] = {}
    for j, eqn in enumerate(jaxpr.eqns):
        producer.update((v, eqn) for v in eqn.outvars)
        chain = [isinstance(v, ji.Var) and v in axis for v in eqn.invars]
        if not any(chain):
            continue  # loop-invariant: run as written
        axes = [axis[v] if c else None for v, c in zip(eqn.invars, chain, strict=True)]
        rule = (call_rule(eqn, axes, lazy=True) if in_rule
                and eqn.primitive.name == "custom_jvp_call" else step_rule(eqn, axes))
        if isinstance(rule, str):
            return rule
        if rule.reduces_time:
            return f"{eqn.primitive.name} sums over time inside a call"
        rule = with_splats(rule, eqn, producer)
        if any(o.mode == ALIGNED for o in rule.operands):
            return (f"{eqn.primitive.name} inside a call reads an array stacked along time "
                    "that does not come from the scan")
        rules[j] = rule
        axis.update((v, a) for v, a in zip(eqn.outvars, rule.out_axes, strict=True)
                    if a is not None)
    out_axes = [axis.get(v) if isinstance(v, ji.Var) else None for v in jaxpr.outvars]
    if any(a is None for a in out_axes):
        return "an output of a call does not come from the scan"
    return Program(jaxpr, tuple(consts), rules, tuple(a for a in out_axes if a is not None))


CALLS = ("jit", "pjit", "custom_jvp_call")


def step_rule(eqn: Any, axes: Sequence[int | None]) -> PerStep | str:
    """``fuse_rules.per_step``, and ``call_rule`` for calls."""
    return call_rule(eqn, axes) if eqn.primitive.name in CALLS else per_step(eqn, axes)


def call_rule(eqn: Any, axes: Sequence[int | None], lazy: bool = False) -> PerStep | str:
    """``per_step`` for ``jit`` and ``custom_jvp_call`` equations (``lazy``: a custom_jvp
    rule is read when it is used, see ``Call``)."""
    operands = tuple(Operand(STEP) if a is not None else Operand(CONST) for a in axes)
    if eqn.primitive.name != "custom_jvp_call":
        body = eqn.params["jaxpr"]
        prog = program(body.jaxpr, body.consts, axes)
        if isinstance(prog, str):
            return f"{prog} (in jit {eqn.params.get('name', '')})"
        return PerStep(eqn.params, prog.out_axes, operands, call=Call(prog))
    name = eqn.params.get("name", "custom_jvp")
    if eqn.params["num_consts"] or not all(
            str(getattr(v.aval, "dtype", "")).startswith(("float", "bfloat", "complex"))
            for v in eqn.invars):
        return f"custom_jvp function {name} with constants or integer operands"
    call = eqn.params["call_jaxpr"]
    prog = program(call.jaxpr, call.consts, axes)
    if isinstance(prog, str):
        return f"custom_jvp function {name}: {prog}"
    if lazy:
        return PerStep(eqn.params, prog.out_axes, operands, call=Call(prog, None, eqn,
                                                                      tuple(axes)))
    jvp = rule_program(eqn, axes, prog)
    if isinstance(jvp, str):
        return jvp
    return PerStep(eqn.params, prog.out_axes, operands, call=Call(prog, jvp))


def rule_program(eqn: Any, axes: Sequence[int | None], prog: Program) -> Program | str:
    """The derivative rule of a ``custom_jvp_call`` per step (why not, as a string)."""
    name = eqn.params.get("name", "custom_jvp")
    rule = ji.custom_jvp_rule(eqn)
    if rule is None:
        return f"custom_jvp function {name}: its derivative rule cannot be read"
    jvp = program(rule[0], rule[1], [*axes, *axes], in_rule=True)
    if isinstance(jvp, str) or jvp.out_axes != prog.out_axes * 2:
        return f"custom_jvp function {name}: its derivative rule is not separable in time"
    return jvp


def operand_value(v: Any, o: Operand, read: Callable[[Any], Any]) -> Any:
    """An operand's per-step value for the modes that need no slice (``read``: its value)."""
    import jax.numpy as jnp
    from jax import lax

    if o.mode in (STEP, CONST):
        return read(v)
    assert o.axis is not None
    if o.mode == SQUEEZE:
        return lax.squeeze(read(v), (o.axis,))
    assert o.mode == SPLAT
    shape = tuple(v.aval.shape)
    return jnp.broadcast_to(read(o.source), shape[:o.axis] + shape[o.axis + 1:])


def apply(eqn: Any, rule: PerStep, args: Sequence[Any]) -> list[Any]:
    """``eqn`` on one step's operands."""
    if rule.identity:
        return [args[0]]
    if rule.call is not None:
        return run_call(rule.call, args)
    return ji.bind_with(eqn, args, rule.params)


def run_program(prog: Program, args: Sequence[Any]) -> list[Any]:
    env: dict[Any, Any] = dict(zip(prog.jaxpr.constvars, prog.consts, strict=True))
    env.update(zip(prog.jaxpr.invars, args, strict=True))

    def read(v: Any) -> Any:
        return v.val if isinstance(v, ji.Literal) else env[v]

    for j, eqn in enumerate(prog.jaxpr.eqns):
        rule = prog.rules.get(j)
        if rule is None:
            outs = ji.bind(eqn, [read(v) for v in eqn.invars])
        else:
            outs = apply(eqn, rule, [operand_value(v, o, read)
                                     for v, o in zip(eqn.invars, rule.operands, strict=True)])
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in prog.jaxpr.outvars]


def run_call(call: Call, args: Sequence[Any]) -> list[Any]:
    """A call per step; a ``custom_jvp`` call keeps its own derivative rule."""
    if call.jvp is None and call.eqn is None:
        return run_program(call.body, args)
    import jax

    n_out = len(call.body.out_axes)

    @jax.custom_jvp
    def fn(*xs: Any) -> list[Any]:
        return run_program(call.body, xs)

    def fn_jvp(primals: Any, tangents: Any) -> tuple[list[Any], list[Any]]:
        jvp_prog = call.jvp or rule_program(call.eqn, call.axes, call.body)
        if isinstance(jvp_prog, str):
            raise AutorematError(f"remat_scans: {jvp_prog}, needed for a higher derivative of "
                                 "the readout moved into the scan; pass fuse=False")
        out = run_program(jvp_prog, [*primals, *tangents])
        return out[:n_out], out[n_out:]

    fn.defjvp(fn_jvp)
    return list(fn(*args))
