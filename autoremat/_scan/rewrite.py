"""Re-evaluate a traced function with its long scans run under a schedule.

``remat_scans`` traces the user's function to a jaxpr and evaluates it again
with ``evaluate``: every equation is bound as written, except a ``scan`` of
length ``>= min_length``, which runs through ``autoremat._scan.scan.scan_axes`` (the
schedule's builder) over the same body, and the ``jit`` / ``checkpoint`` /
``cond`` / short ``scan`` equations that hold such a scan, whose bodies are
evaluated the same way. The result is the function's own computation -- same
values, same gradients -- with the memory of the schedule: ``O(d * T^(1/d))``
saved carries for a nested schedule of depth ``d`` instead of ``T`` steps of
residuals, for ``d - 1`` extra forward passes.

A time-major copy made for the scan (``transpose`` moving axis ``k`` to 0,
which is how ``nn.scan(in_axes=1)`` and ``nn.RNN`` hand batch-major data to
``lax.scan``) is not made: the rewritten scan reads chunks straight from the
original array along axis ``k``, as ``autoremat.scan(axis=k)`` does.

``survey`` lists every scan without evaluating anything: what ``describe``
reports and what decides which equations are entered. Scans inside
``custom_jvp`` / ``custom_vjp`` rules and other primitives (``while``,
``shard_map``) are left as written and reported as such.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
from jax import lax

from autoremat._scan import jax_internals as ji
from autoremat._scan.fuse_readout import Analysis, analyse, fused_step
from autoremat._scan.scan import nbytes, scan_axes
from autoremat._schedules.base import Schedule

REWRITTEN = "rewritten"
TOO_SHORT = "too short"


@dataclass(frozen=True)
class FoundScan:
    """One ``scan`` in the traced function.

    Attributes:
      length: its number of steps.
      carry_bytes: the bytes of its carry (what a schedule saves per checkpoint).
      where: ``file:line (function)`` of the user code that wrote it.
      inside: the primitives it is nested in, outermost first (``jit > checkpoint``).
      action: ``rewritten``, ``too short``, or ``left: inside <primitive>``.
      backward: it scans the stacked outputs of an opposite-direction scan of the
        same length -- what ``jax.grad`` emits (or an RTS-style backward pass).
      fusion: what ``fuse`` moves into it (``Analysis.describe``); empty when off.
    """

    length: int
    carry_bytes: int
    where: str
    inside: tuple[str, ...]
    action: str
    backward: bool = False
    fusion: str = ""


def survey(jaxpr: ji.Jaxpr, min_length: int, inside: tuple[str, ...] = (),
           blocked: str = "", fuse: bool = False) -> list[FoundScan]:
    """Every scan in ``jaxpr`` (and its sub-jaxprs), in program order, with what happens to it
    (with ``fuse``: what ``analyse`` moves into each rewritten scan)."""
    found: list[FoundScan] = []
    stacked: dict[Any, tuple[int, bool]] = {}  # ys of long scans at this level: (length, reverse)
    for index, eqn in enumerate(jaxpr.eqns):
        prim, params = eqn.primitive, eqn.params
        if prim is ji.SCAN:
            length, reverse = int(params[ji.LENGTH]), bool(params[ji.REVERSE])
            n_consts, n_carry = ji.scan_split(params)
            start = n_consts + n_carry
            carry = eqn.invars[n_consts:start]
            action = (TOO_SHORT if length < min_length
                      else f"left: inside {blocked}" if blocked else REWRITTEN)
            backward = length >= min_length and any(
                stacked.get(v) == (length, not reverse) for v in eqn.invars[start:]
                if isinstance(v, ji.Var))
            fusion = ""
            if fuse and action == REWRITTEN:
                level = _level(inside)
                fusion = analyse(jaxpr, index, partial(_heavy, min_length=min_length),
                                 level).describe()
            found.append(FoundScan(length, nbytes([v.aval for v in carry]),
                                   ji.user_location(eqn), inside, action, backward, fusion))
            if length >= min_length:
                stacked.update({v: (length, reverse) for v in eqn.outvars[n_carry:]})
            found += survey(params[ji.SCAN_BODY].jaxpr, min_length, (*inside, "scan"), blocked,
                            fuse)
        else:
            entered = prim in (ji.JIT, ji.REMAT, ji.COND)
            inner = blocked or ("" if entered else prim.name)
            for sub in ji.sub_jaxprs(params):
                found += survey(sub, min_length, (*inside, prim.name), inner, fuse)
    return found


def _level(inside: tuple[str, ...]) -> str:
    """How messages name the jaxpr a scan is in: ``fn`` or the primitive whose body it is."""
    return f"{inside[-1]} body" if inside else "fn"


def _heavy(eqn: ji.JaxprEqn, min_length: int) -> bool:
    """A long scan, or an equation holding one: never evaluated early, never moved."""
    if eqn.primitive is ji.SCAN and eqn.params[ji.LENGTH] >= min_length:
        return True
    return any(f.length >= min_length for sub in ji.sub_jaxprs(eqn.params)
               for f in survey(sub, min_length))


@dataclass
class Context:
    """What one evaluation needs: the schedule, the threshold, which jaxprs hold a long scan."""

    schedule: Schedule
    min_length: int
    fuse: bool = False
    _holds: dict[int, bool] = field(default_factory=dict)
    _plans: dict[int, dict[int, Analysis]] = field(default_factory=dict)

    def plans(self, jaxpr: ji.Jaxpr, level: str) -> dict[int, Analysis]:
        """The fused long scans of ``jaxpr`` (its own level), by equation index."""
        key = id(jaxpr)
        if key not in self._plans:
            found: dict[int, Analysis] = {}
            if self.fuse:
                for i, eqn in enumerate(jaxpr.eqns):
                    if eqn.primitive is ji.SCAN and eqn.params[ji.LENGTH] >= self.min_length:
                        plan = analyse(jaxpr, i, partial(_heavy, min_length=self.min_length),
                                       level)
                        if plan.fused:
                            found[i] = plan
            self._plans[key] = found
        return self._plans[key]

    def holds_long(self, jaxpr: ji.Jaxpr) -> bool:
        key = id(jaxpr)
        if key not in self._holds:
            self._holds[key] = any(f.action == REWRITTEN for f in survey(jaxpr, self.min_length))
        return self._holds[key]

    def enters(self, eqn: ji.JaxprEqn) -> bool:
        if eqn.primitive is ji.SCAN and eqn.params[ji.LENGTH] >= self.min_length:
            return True
        if eqn.primitive in (ji.SCAN, ji.JIT, ji.REMAT, ji.COND):
            return any(self.holds_long(sub) for sub in ji.sub_jaxprs(eqn.params))
        return False


def _moved_axis(eqn: ji.JaxprEqn) -> int | None:
    """``k`` when ``eqn`` is ``transpose`` = ``moveaxis(x, k, 0)`` with ``k > 0``, else ``None``."""
    perm = tuple(eqn.params[ji.PERMUTATION])
    k = perm[0]
    if k == 0 or perm[1:] != tuple(i for i in range(len(perm)) if i != k):
        return None
    return int(k)


def evaluate(jaxpr: ji.Jaxpr, consts: Sequence[Any], args: Sequence[Any],
             ctx: Context, level: str = "fn") -> list[Any]:
    """``jaxpr``'s outputs on ``args``, its long scans run under ``ctx.schedule`` (with
    ``ctx.fuse``, the readouts and losses ``analyse`` finds separable moved into them)."""
    env: dict[Any, Any] = {}
    deferred: dict[Any, ji.JaxprEqn] = {}  # moveaxis(x, k, 0) results, made only if read
    moved: dict[Any, tuple[Any, int]] = {}  # their var -> (x's var, k)

    def read(v: Any) -> Any:
        if isinstance(v, ji.Literal):
            return v.val
        if v in deferred:
            eqn = deferred.pop(v)
            env[v] = ji.bind(eqn, [read(eqn.invars[0])])[0]
        return env[v]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    plans = ctx.plans(jaxpr, level)
    skip = frozenset().union(*(p.skip for p in plans.values()))
    done: set[int] = set()
    for index, eqn in enumerate(jaxpr.eqns):
        if index in skip or index in done:
            continue
        if index in plans:
            plan = plans[index]
            for h in plan.hoisted:  # targets, masks... the step reads: computed first
                if h not in done and h not in skip:
                    early = jaxpr.eqns[h]
                    env.update(zip(early.outvars, ji.bind(early, [read(v) for v in early.invars]),
                                   strict=True))
                    done.add(h)
            env.update(_fused_scan(eqn, read, moved, deferred, ctx, plan, jaxpr))
            continue
        if eqn.primitive is ji.TRANSPOSE and isinstance(eqn.invars[0], ji.Var):
            axis = _moved_axis(eqn)
            if axis is not None:
                deferred[eqn.outvars[0]] = eqn
                moved[eqn.outvars[0]] = (eqn.invars[0], axis)
                continue
        if ctx.enters(eqn):
            outs = _entered(eqn, read, moved, ctx)
        else:
            outs = ji.bind(eqn, [read(v) for v in eqn.invars])
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]


def _closed(closed: ji.ClosedJaxpr, ctx: Context, *args: Any, level: str = "fn") -> list[Any]:
    return evaluate(closed.jaxpr, closed.consts, args, ctx, level)


def _entered(eqn: ji.JaxprEqn, read: Callable[[Any], Any], moved: dict[Any, tuple[Any, int]],
             ctx: Context) -> list[Any]:
    prim, params = eqn.primitive, eqn.params
    if prim is ji.SCAN:
        return _scan(eqn, read, moved, ctx)
    invals = [read(v) for v in eqn.invars]
    with ji.source_context(eqn):
        if prim is ji.JIT:
            return _closed(params[ji.JIT_BODY], ctx, *invals, level="jit body")
        if prim is ji.REMAT:
            body = params[ji.REMAT_BODY]
            run = jax.checkpoint(lambda *a: evaluate(body, (), a, ctx, "checkpoint body"),
                                 policy=params[ji.REMAT_POLICY],
                                 prevent_cse=params[ji.REMAT_PREVENT_CSE])
            return list(run(*invals))
        branches = [partial(_closed, b, ctx, level="cond body")
                    for b in params[ji.COND_BRANCHES]]
        return list(lax.switch(invals[0], branches, *invals[1:]))


@dataclass(frozen=True)
class _ScanEqn:
    """A ``scan`` equation's parts, its body re-evaluated (``step``) with ``ctx``."""

    n_carry: int
    length: int
    reverse: bool
    unroll: Any
    init: list[Any]
    x_vars: list[Any]
    step: Callable[[list[Any], list[Any]], tuple[list[Any], list[Any]]]

    @classmethod
    def of(cls, eqn: ji.JaxprEqn, read: Callable[[Any], Any], ctx: Context) -> _ScanEqn:
        params = eqn.params
        n_consts, n_carry = ji.scan_split(params)
        body: ji.ClosedJaxpr = params[ji.SCAN_BODY]
        consts = [read(v) for v in eqn.invars[:n_consts]]

        def step(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
            out = _closed(body, ctx, *consts, *carry, *x, level="scan body")
            return out[:n_carry], out[n_carry:]

        return cls(n_carry, int(params[ji.LENGTH]), bool(params[ji.REVERSE]), params[ji.UNROLL],
                   [read(v) for v in eqn.invars[n_consts:n_consts + n_carry]],
                   list(eqn.invars[n_consts + n_carry:]), step)

    def scheduled_unroll(self) -> Any:
        """``unroll`` for ``scan_axes`` (``None``: the schedule's own)."""
        return None if self.unroll in (1, False) else self.unroll

    def inputs(self, read: Callable[[Any], Any],
               moved: dict[Any, tuple[Any, int]]) -> tuple[list[Any], list[int]]:
        """The scanned inputs and their axes (a time-major copy not made: the original)."""
        xs, axes = [], []
        for v in self.x_vars:
            source, axis = moved.get(v, (v, 0)) if isinstance(v, ji.Var) else (v, 0)
            xs.append(read(source))
            axes.append(axis)
        return xs, axes


def _scan(eqn: ji.JaxprEqn, read: Callable[[Any], Any], moved: dict[Any, tuple[Any, int]],
          ctx: Context) -> list[Any]:
    s = _ScanEqn.of(eqn, read, ctx)
    with ji.source_context(eqn):
        if s.length < ctx.min_length:  # a short scan holding a long one: lax.scan, new body
            carry, ys = lax.scan(s.step, s.init, [read(v) for v in s.x_vars], length=s.length,
                                 reverse=s.reverse, unroll=s.unroll)
            return [*carry, *ys]
        xs, axes = s.inputs(read, moved)
        carry, ys = scan_axes(s.step, s.init, xs, s.length, schedule=ctx.schedule,
                              reverse=s.reverse, in_axes=axes, out_axes=0,
                              unroll=s.scheduled_unroll())
    return [*carry, *ys]


def _fused_scan(eqn: ji.JaxprEqn, read: Callable[[Any], Any], moved: dict[Any, tuple[Any, int]],
                deferred: dict[Any, ji.JaxprEqn], ctx: Context, plan: Analysis,
                jaxpr: ji.Jaxpr) -> dict[Any, Any]:
    """A long scan with ``plan``'s readout and loss in its step: the values it defines."""
    s = _ScanEqn.of(eqn, read, ctx)
    n_carry = s.n_carry
    step, sums = fused_step(plan, jaxpr, s.step, read)
    xs, axes = s.inputs(read, moved)
    for v, axis in plan.aligned:  # targets, masks: sliced per step along their time axis
        if isinstance(v, ji.Var) and v in deferred:  # a time-major copy not made: the original
            axis = deferred_perm(deferred, v)[axis]
            v = moved[v][0]
        xs.append(read(v))
        axes.append(axis)
    with ji.source_context(eqn):
        carry, ys = scan_axes(step, [*s.init, *sums], xs, s.length, schedule=ctx.schedule,
                              reverse=s.reverse, in_axes=axes,
                              out_axes=[a for _, a in plan.stacked],
                              unroll=s.scheduled_unroll())
    out = dict(zip(eqn.outvars[:n_carry], carry[:n_carry], strict=True))
    out.update((v, y) for (v, _), y in zip(plan.stacked, ys, strict=True))
    out.update((jaxpr.eqns[j].outvars[0], acc)
               for j, acc in zip(plan.sums, carry[n_carry:], strict=True))
    return out


def deferred_perm(deferred: dict[Any, ji.JaxprEqn], v: Any) -> tuple[int, ...]:
    """The permutation of the (not yet made) time-major copy ``v``."""
    return tuple(int(p) for p in deferred[v].params[ji.PERMUTATION])
