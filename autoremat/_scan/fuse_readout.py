"""Move the per-step readout and loss after a long scan into the scanned step.

A step that returns its hidden state makes a scan stack ``(T, B, H)`` outputs;
the readout and the loss after the scan then keep that stack, its cotangent
and their own residuals -- memory that grows with ``T`` and that no schedule
removes (``docs/memory.md``). ``remat_scans`` sees the readout and the loss in
the same jaxpr as the scan, so it can do what ``autoremat.fuse_loss`` does by
hand: ``analyse`` follows each stacked output forward and finds the equations
that act on each time step separately (``fuse_rules.per_step``) up to a sum
over time; ``fused_step`` builds the scanned step that runs them per step,
accumulates each sum over time in the carry and stacks only what something
outside still needs. The memory of the fused scan is then the schedule's
alone (plus what stays stacked); time is that of the same work done inside
the loop instead of after it (the readout runs once per step in the forward
pass and in each recomputation the schedule makes -- for a ``Dense`` head a
small fraction of the cell). Values and gradients are the unmodified
function's: the same equations, re-indexed per step; only the order of the
sum over time changes (float rounding).

Anything not provably separable is left as written, and ``Analysis.describe``
says which equation stopped it and where it comes from in the user's code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoremat._scan import jax_internals as ji
from autoremat._scan.fuse_calls import apply, operand_value, step_rule
from autoremat._scan.fuse_rules import (
    ALIGNED,
    ELEMENTWISE,
    SPLAT,
    STEP,
    Operand,
    PerStep,
    per_step,
    with_splats,
)
from autoremat._scan.scan import nbytes
from autoremat._units import format_bytes


@dataclass(frozen=True)
class Analysis:
    """What fusion does to the long scan at ``jaxpr.eqns[scan]``.

    Attributes:
      scan: the scan equation's index.
      fused: whether the fused step is used (it stacks fewer bytes than the scan).
      rules: per moved equation (index), how it runs per step.
      moved: the indices of the equations run inside the step, in program order.
      skip: equations not evaluated outside (moved ones, and unused ones downstream).
      hoisted: equations after the scan, independent of it, evaluated before it
        (the targets, masks and weights the moved equations read).
      aligned: ``(var, axis)`` of operands stacked along time that the step slices.
      stacked: ``(var, axis)`` of what the fused step stacks (needed outside).
      sums: indices of the moved time reductions (accumulators in the carry).
      was_bytes, now_bytes: bytes stacked by the scan as written and fused.
      blockers: per value that stays stacked, why (``"var: reason at where"``).
      chain: the moved equations' names, for ``describe``.
      returned: positions of ``jaxpr.outvars`` that are stacked along time (the
        readout continues after the jaxpr this scan is in).
    """

    scan: int
    fused: bool
    rules: Mapping[int, PerStep]
    moved: tuple[int, ...]
    skip: frozenset[int]
    hoisted: tuple[int, ...]
    aligned: tuple[tuple[Any, int], ...]
    stacked: tuple[tuple[Any, int], ...]
    sums: tuple[int, ...]
    was_bytes: int
    now_bytes: int
    blockers: tuple[str, ...]
    chain: str
    returned: tuple[int, ...] = ()

    def describe(self) -> str:
        """One or two lines: what moved into the scan, what stays stacked and why."""
        kept = "nothing stacked" if not self.stacked else "stacks " + ", ".join(
            _aval(v) for v, _ in self.stacked) + f" ({format_bytes(self.now_bytes)})"
        why = "; stays stacked: " + "; ".join(self.blockers) if self.blockers else ""
        if self.fused:
            return (f"fused into the step: {self.chain}; {kept} instead of "
                    f"{format_bytes(self.was_bytes)}{why}")
        if not self.moved:
            return f"not fused: nothing after it is separable in time{why}"
        return (f"not fused: moving {self.chain} in would not stack less "
                f"({format_bytes(self.now_bytes)} vs {format_bytes(self.was_bytes)}){why}")


def _aval(v: Any) -> str:
    return str(v.aval.str_short(short_dtypes=True))


def _where(eqn: Any) -> str:
    return f"{eqn.primitive.name} at {ji.user_location(eqn)}"


def analyse(jaxpr: ji.Jaxpr, index: int, heavy: Callable[[Any], bool],
            level: str = "fn") -> Analysis:
    """The fusion of the scan at ``jaxpr.eqns[index]`` with what follows it.

    ``heavy(eqn)``: an equation that must not be evaluated early (a long scan
    or a call holding one); ``level`` names the jaxpr in messages.
    """
    eqns = jaxpr.eqns
    scan = eqns[index]
    _, n_carry = ji.scan_split(scan.params)
    ys = [v for v in scan.outvars[n_carry:] if not ji.is_drop(v)]
    axis: dict[Any, int] = {y: 0 for y in ys}
    depends: set[Any] = set(scan.outvars)
    producer = {v: j for j in range(index + 1, len(eqns)) for v in eqns[j].outvars}
    made_by = {v: e for e in eqns for v in e.outvars}
    rules: dict[int, PerStep] = {}
    used_outside: dict[Any, str] = {}

    def block(eqn: Any, reason: str) -> None:
        for v in eqn.invars:
            if isinstance(v, ji.Var) and v in axis and v not in used_outside:
                used_outside[v] = f"{_aval(v)}: {reason} ({_where(eqn)})"
        depends.update(eqn.outvars)

    for j in range(index + 1, len(eqns)):
        eqn = eqns[j]
        chain = [isinstance(v, ji.Var) and v in axis for v in eqn.invars]
        dep = [isinstance(v, ji.Var) and v in depends for v in eqn.invars]
        if not any(dep):
            continue
        if any(d and not c for d, c in zip(dep, chain, strict=True)) or not any(chain):
            block(eqn, "combined with a value that depends on the scan otherwise")
            continue
        if eqn.effects or heavy(eqn):
            block(eqn, "has side effects or holds a long scan")
            continue
        rule = step_rule(eqn, [axis[v] if c else None for v, c in zip(eqn.invars, chain,
                                                                      strict=True)])
        if isinstance(rule, str):
            block(eqn, rule)
            continue
        rule = with_splats(rule, eqn, made_by)
        late = _not_hoistable(eqn, rule, producer, eqns, heavy, depends)
        if late:
            block(eqn, late)
            continue
        rules[j] = rule
        depends.update(eqn.outvars)
        for v, a in zip(eqn.outvars, rule.out_axes, strict=True):
            if a is not None:
                axis[v] = a
    returned = []
    for pos, out in enumerate(jaxpr.outvars):
        if isinstance(out, ji.Var) and out in axis:
            returned.append(pos)
            if out not in used_outside:
                where = "returned by fn" if level == "fn" else f"leaves the {level} it is in"
                used_outside[out] = f"{_aval(out)}: {where} (output {pos})"
    plan = _plan(jaxpr, index, ys, axis, rules, used_outside, producer,
                 _Puller(eqns, producer, rules, heavy, made_by))
    return replace(plan, returned=tuple(returned))


@dataclass
class _Puller:
    """Targets' transforms (``1 - labels``, ``-labels``) computed after the scan from arrays
    stacked along time: run per step on slices of their operands instead of made whole
    before the scan (which would keep a ``T``-long array per transform)."""

    eqns: Sequence[Any]
    producer: Mapping[Any, int]
    chain: Mapping[int, PerStep]
    heavy: Callable[[Any], bool]
    made_by: Mapping[Any, Any]
    pulled: dict[int, PerStep] = field(default_factory=dict)

    def operands(self, eqn: Any, rule: PerStep) -> PerStep:
        """``rule`` with each aligned operand that can be pulled read from the step."""
        ops = tuple(Operand(STEP) if o.mode == ALIGNED and o.axis is not None
                    and self.pull(v, o.axis) else o
                    for v, o in zip(eqn.invars, rule.operands, strict=True))
        return replace(rule, operands=ops)

    def pull(self, v: Any, k: int) -> bool:
        j = self.producer.get(v) if isinstance(v, ji.Var) else None
        if j is None or j in self.chain:
            return False
        if j in self.pulled:
            return True
        eqn = self.eqns[j]
        shape = tuple(v.aval.shape)
        if (eqn.effects or self.heavy(eqn) or len(eqn.outvars) != 1
                or eqn.primitive.name not in ELEMENTWISE):
            return False
        axes = [k if len(_shape(u)) == len(shape) and _shape(u)[k] == shape[k] else None
                for u in eqn.invars]
        rule = per_step(eqn, axes) if any(a is not None for a in axes) else "invariant"
        if isinstance(rule, str) or rule.out_axes != (k,):
            return False
        rule = replace(rule, operands=tuple(
            Operand(ALIGNED, k) if a is not None else o
            for a, o in zip(axes, rule.operands, strict=True)))
        self.pulled[j] = rule  # before its operands: a cycle is impossible (SSA order)
        self.pulled[j] = with_splats(self.operands(eqn, rule), eqn, self.made_by)
        return True


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(getattr(v.aval, "shape", ()))


def _not_hoistable(eqn: Any, rule: PerStep, producer: Mapping[Any, int], eqns: Sequence[Any],
                   heavy: Callable[[Any], bool], depends: set[Any]) -> str:
    """Why an operand read by the step cannot be computed before the scan ('' if it can)."""
    todo = [u for u in (_read_var(v, o) for v, o in zip(eqn.invars, rule.operands, strict=True)
                        if o.mode != STEP) if isinstance(u, ji.Var)]
    seen: set[Any] = set()
    while todo:
        v = todo.pop()
        if v in seen or v not in producer:
            continue
        seen.add(v)
        if v in depends:
            return "an operand depends on the scan otherwise"
        p = eqns[producer[v]]
        if p.effects or heavy(p):
            return f"an operand is computed by {_where(p)} after the scan"
        todo += [u for u in p.invars if isinstance(u, ji.Var)]
    return ""


def _plan(jaxpr: ji.Jaxpr, index: int, ys: list[Any], axis: Mapping[Any, int],
          rules: Mapping[int, PerStep], used_outside: Mapping[Any, str],
          producer: Mapping[Any, int], puller: _Puller) -> Analysis:
    eqns = jaxpr.eqns
    sums = [j for j, r in rules.items() if r.reduces_time
            and any(not ji.is_drop(v) for v in eqns[j].outvars)]
    needed = list(used_outside) + [v for j in sums for v, o in
                                   zip(eqns[j].invars, rules[j].operands, strict=True)
                                   if o.mode == STEP]
    moved = set(sums)
    while needed:
        v = needed.pop()
        j = producer.get(v)
        if j is None or j not in rules or j in moved:
            continue
        moved.add(j)
        needed += [u for u, o in zip(eqns[j].invars, rules[j].operands, strict=True)
                   if o.mode == STEP]
    all_rules = dict(rules)
    for j in moved:
        all_rules[j] = puller.operands(eqns[j], rules[j])
    all_rules.update(puller.pulled)
    rules = all_rules
    order = tuple(sorted(moved | set(puller.pulled)))
    stacked = tuple((v, axis[v]) for v in used_outside)
    aligned: dict[tuple[Any, int], None] = {}
    hoist: set[int] = set()
    for j in order:
        for v, o in zip(eqns[j].invars, rules[j].operands, strict=True):
            if o.mode == ALIGNED and o.axis is not None:
                aligned[(v, o.axis)] = None
            u = _read_var(v, o)
            if o.mode != STEP and isinstance(u, ji.Var):
                _closure(u, producer, eqns, hoist)
    was = nbytes([v.aval for v in ys])
    now = nbytes([v.aval for v, _ in stacked])
    chain = " -> ".join(
        eqns[j].primitive.name + (" over time" if rules[j].reduces_time else "")
        for j in order)
    return Analysis(scan=index, fused=bool(order) and now < was, rules=dict(rules),
                    moved=order, skip=frozenset(rules) - frozenset(puller.pulled),
                    hoisted=tuple(sorted(hoist)),
                    aligned=tuple(aligned), stacked=stacked, sums=tuple(sorted(sums)),
                    was_bytes=was, now_bytes=now, blockers=tuple(used_outside.values()),
                    chain=chain)


def _read_var(v: Any, o: Operand) -> Any:
    """The outer value an operand reads: the scalar of a ``splat``, else the operand."""
    return o.source if o.mode == SPLAT else v


def _closure(v: Any, producer: Mapping[Any, int], eqns: Sequence[Any], out: set[int]) -> None:
    todo = [v]
    while todo:
        u = todo.pop()
        j = producer.get(u)
        if j is None or j in out:
            continue
        out.add(j)
        todo += [w for w in eqns[j].invars if isinstance(w, ji.Var)]


def fused_step(plan: Analysis, jaxpr: ji.Jaxpr, body_step: Callable[..., Any],
               outer: Callable[[Any], Any]) -> tuple[Callable[..., Any], list[Any]]:
    """The scanned step running ``plan``'s equations per step, and the accumulators' init.

    ``body_step(carry, xs) -> (carry, ys)`` is the scan's own step (its stacked
    outputs); ``outer(var)`` reads a loop-invariant value. The step
    takes ``(carry + accumulators, xs + aligned slices)`` and returns
    ``(carry + accumulators, [value of each plan.stacked var])``.
    """
    import jax.numpy as jnp

    eqns = jaxpr.eqns
    scan = eqns[plan.scan]
    ys_vars = scan.outvars[ji.scan_split(scan.params)[1]:]
    sums = plan.sums
    aligned_pos: dict[Any, int] = {key: i for i, key in enumerate(plan.aligned)}
    invariant: dict[Any, Any] = {}

    def const(v: Any) -> Any:  # a loop-invariant value, read outside the step once
        if isinstance(v, ji.Literal):
            return v.val
        if v not in invariant:
            invariant[v] = outer(v)
        return invariant[v]

    for j in plan.moved:
        for v, o in zip(eqns[j].invars, plan.rules[j].operands, strict=True):
            if o.mode not in (STEP, ALIGNED):
                const(_read_var(v, o))

    def step(carry: list[Any], xs: list[Any]) -> tuple[list[Any], list[Any]]:
        n_acc = len(sums)
        own_carry, accs = carry[:len(carry) - n_acc], carry[len(carry) - n_acc:]
        n_aligned = len(plan.aligned)
        own_xs, slices = xs[:len(xs) - n_aligned], xs[len(xs) - n_aligned:]
        new_carry, ys = body_step(own_carry, own_xs)
        env: dict[Any, Any] = dict(zip(ys_vars, ys, strict=True))
        total = dict(zip(sums, accs, strict=True))
        def read(v: Any) -> Any:
            return env[v] if isinstance(v, ji.Var) and v in env else const(v)

        for j in plan.moved:
            eqn, rule = eqns[j], plan.rules[j]
            args = [slices[aligned_pos[(v, o.axis)]] if o.mode == ALIGNED
                    else operand_value(v, o, read)
                    for v, o in zip(eqn.invars, rule.operands, strict=True)]
            outs = apply(eqn, rule, args)
            if j in total:
                total[j] = total[j] + outs[0].astype(total[j].dtype)
            else:
                env.update(zip(eqn.outvars, outs, strict=True))
        return [*new_carry, *(total[j] for j in sums)], [env[v] for v, _ in plan.stacked]

    avals: list[Any] = [eqns[j].outvars[0].aval for j in sums]
    init = [jnp.zeros(a.shape, a.dtype) for a in avals]
    return step, init
