"""``autoremat.linen.scan``: ``flax.linen.scan``'s lifting with the loop run by ``autoremat.scan``.

The public documentation is ``autoremat.linen``'s (the facade); this module
is the machinery: Flax's scope lifting (``flax.core.lift.pack``) around a
loop that ``autoremat._scan.scan.scan_axes`` runs under the schedule.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import jax
from flax.core import meta
from flax.core.axes_scan import broadcast
from flax.core.frozen_dict import FrozenDict
from flax.core.lift import pack
from flax.core.scope import (
    CollectionFilter,
    PRNGSequenceFilter,
    Scope,
    intersect_filters,
    is_filter_empty,
)
from flax.linen import Module
from flax.linen.transforms import lift_transform
from flax.typing import In, Out
from jax import random

from autoremat._scan.scan import as_schedule, first_step, scan_axes, scanned_length
from autoremat._schedules.base import Schedule

Target = TypeVar("Target", bound=type[Module] | Callable[..., Any])
PyTree = Any
#: A variable group: one variable dict per lifted scope.
Group = tuple[dict[str, Any], ...]
Counters = dict[Any, Any]


def scan(
    target: Target,
    *,
    schedule: Schedule | str | os.PathLike[str],
    variable_axes: Mapping[CollectionFilter, Any] = FrozenDict(),
    variable_broadcast: CollectionFilter = False,
    variable_carry: CollectionFilter = False,
    split_rngs: Mapping[PRNGSequenceFilter, bool] = FrozenDict(),
    in_axes: Any = 0,
    out_axes: Any = 0,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | None = None,
    data_transform: Callable[..., Any] | None = None,
    metadata_params: Mapping[Any, Any] = FrozenDict(),
    methods: Sequence[str] | Mapping[str, Any] | None = None,
    check_constancy_invariants: bool = True,
) -> Target:
    """``flax.linen.scan`` run with a remat schedule (see the module docstring).

    Args:
      target: a ``Module`` class, or a method ``(module, carry, *xs) -> (carry,
        ys)`` (as a decorator).
      schedule: the remat schedule, or the path of a schedule YAML file
        (``autoremat.load_schedule``).
      variable_axes: collections scanned over (``{"intermediates": 0}``), as in
        ``nn.scan``; ``flax.core.lift.In`` / ``Out`` are accepted.
      variable_broadcast: collections closed over by the loop, typically
        ``"params"`` (shared parameters, created at ``init`` on the first step).
      variable_carry: collections carried from step to step.
      split_rngs: ``{name: split}``; only these rng streams are visible in the
        body. ``True`` gives each step its own key, split exactly as
        ``nn.scan`` does (``random.split(random.clone(rng), T)``); ``False``
        gives every step the same rng.
      in_axes: the scanned axis of each argument after ``carry`` (a prefix
        tree); ``nn.broadcast`` passes an argument whole to every step. Inputs
        scanned along an axis other than 0 are sliced chunk by chunk, never
        transposed as a whole.
      out_axes: the axis along which each output is stacked (a prefix tree).
      length: the number of steps; needed only if no argument is scanned.
      reverse: scan from the last step to the first.
      unroll: the innermost ``lax.scan`` unroll; default: ``schedule.unroll``.
      data_transform: as in ``nn.scan``: maps ``(variable_groups, rng_groups)``
        inside the body.
      metadata_params: passed to ``AxisMetadata`` of ``variable_axes`` variables.
      methods: with a Module class, the methods to scan (default ``__call__``):
        a list, or ``{name: {argument: value}}`` to override any of the
        arguments above for one method.
      check_constancy_invariants: as in ``nn.scan`` (a bool): ``True`` traces the
        step once outside the loop before the loop's trace (as ``nn.scan`` does
        to check broadcast values; here broadcast collections are closed over
        by the loop, invariant by construction); ``False`` skips that trace --
        one trace of the step, rng counters as under ``nn.scan(...,
        check_constancy_invariants=False)`` -- except at ``init`` with
        broadcast variables to create (``nn.scan`` then creates none).

    Returns:
      The scanned Module class or method, like ``nn.scan``.

    Raises:
      ScheduleError: ``schedule`` is not a schedule (or a readable schedule file).
      ValueError: ``out_axes`` uses ``nn.broadcast``, or ``variable_axes`` has a
        non-integer axis.
    """
    given = locals()  # the arguments, before any other name is bound
    options = _core_options({k: given[k] for k in _OPTIONS})
    if isinstance(methods, Mapping):
        # Per-method overrides of the arguments above (nn.scan takes each
        # method's full argument set here; a full set works the same way).
        methods = {
            name: _core_options({**options, **dict(override)})
            for name, override in methods.items()
        }
    return lift_transform(_scan_core, target, methods=methods, **options)


def _core_options(options: dict[str, Any]) -> dict[str, Any]:
    """Validate the arguments of ``scan`` and resolve the schedule (and unroll)."""
    options = dict(options)
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TypeError(f"autoremat.linen.scan: unexpected argument(s) {', '.join(unknown)}")
    if "schedule" not in options:
        raise TypeError("autoremat.linen.scan: missing the schedule= argument")
    schedule = as_schedule(options["schedule"])
    unroll = options.pop("unroll", None)
    if unroll is not None:
        schedule = dataclasses.replace(schedule, unroll=unroll)
    options["schedule"] = schedule
    check = options.get("check_constancy_invariants", True)
    if not isinstance(check, bool):
        raise TypeError(f"check_constancy_invariants: expected a bool, got {check!r}")
    _variable_axes(options.get("variable_axes", FrozenDict()))
    if any(ax is broadcast for ax in jax.tree_util.tree_leaves(options.get("out_axes", 0))):
        raise ValueError(
            "out_axes: nn.broadcast (loop-invariant outputs) is not supported by "
            "autoremat.linen.scan; return such values from outside the scanned method"
        )
    return options


#: ``scan``'s keywords, read from its signature: what ``methods`` may override per method.
_OPTIONS = frozenset(inspect.signature(scan).parameters) - {"target", "methods"}


def _scan_core(
    fn: Callable[..., Any],
    *,
    schedule: Schedule,
    variable_axes: Mapping[CollectionFilter, Any] = FrozenDict(),
    variable_broadcast: CollectionFilter = False,
    variable_carry: CollectionFilter = False,
    split_rngs: Mapping[PRNGSequenceFilter, bool] = FrozenDict(),
    in_axes: Any = 0,
    out_axes: Any = 0,
    length: int | None = None,
    reverse: bool = False,
    data_transform: Callable[..., Any] | None = None,
    metadata_params: Mapping[Any, Any] = FrozenDict(),
    check_constancy_invariants: bool = True,
) -> Callable[..., Any]:
    """The core-level lifted scan: ``(scope_tree, carry, *xs) -> (carry, ys)``.

    Written like ``flax.core.lift.scan``: ``pack`` lifts the scopes' variable
    groups (broadcast, carry, each scanned axis) and rngs into ``_Call.run``,
    whose loop is ``autoremat._scan.scan.scan_axes``.
    """
    var_in, var_out = _variable_axes(variable_axes)
    spec = _Spec(fn=fn, schedule=schedule, in_axes=in_axes, out_axes=out_axes, length=length,
                 reverse=reverse, data_transform=data_transform, params=dict(metadata_params),
                 in_group_axes=tuple(var_in.values()), out_group_axes=tuple(var_out.values()),
                 rng_split=tuple(bool(split_rngs[k]) for k in split_rngs),
                 check_constancy=check_constancy_invariants)
    groups_in = (variable_broadcast, variable_carry, *var_in)
    groups_out = (variable_broadcast, variable_carry, *var_out)

    def lifted(scope_tree: Scope | PyTree, init: PyTree, *args: Any) -> tuple[PyTree, PyTree]:
        scopes = jax.tree_util.tree_leaves(scope_tree)
        counters = _unique([s.rng_counters for s in scopes])
        init_broadcast = any(
            not is_filter_empty(intersect_filters(s.mutable, variable_broadcast)) for s in scopes
        )
        run = functools.partial(_Call.run, spec, counters, init_broadcast)
        return pack(run, groups_in, groups_out, tuple(split_rngs), name="scan")(
            scope_tree, init, *args)

    return lifted


@dataclass(frozen=True)
class _Spec:
    """``_scan_core``'s arguments as the loop needs them (the variable axes split
    into input and output group axes, ``rng_split`` per rng filter)."""

    fn: Callable[..., Any]
    schedule: Schedule
    in_axes: Any
    out_axes: Any
    length: int | None
    reverse: bool
    data_transform: Callable[..., Any] | None
    params: dict[Any, Any]
    in_group_axes: tuple[int, ...]
    out_group_axes: tuple[int, ...]
    rng_split: tuple[bool, ...]
    check_constancy: bool


class _Call:
    """One call of the lifted scan inside ``pack``: the scanned inputs, the pass
    outside the loop, and the step ``autoremat._scan.scan.scan_axes`` runs."""

    def __init__(self, spec: _Spec, counters: list[Counters], scope_fn: Callable[..., Any],
                 repack_fn: Callable[..., Any], rng_groups: tuple[Group, ...],
                 args: tuple[Any, ...]) -> None:
        self.spec, self.counters = spec, counters
        self.scope_fn, self.repack_fn = scope_fn, repack_fn
        self.rng_groups, self.args = rng_groups, args
        self.bvars: Group = ()
        self.loop_counters: list[Counters] = []

    @classmethod
    def run(cls, spec: _Spec, counters: list[Counters], init_broadcast: bool,
            scope_fn: Callable[..., Any], repack_fn: Callable[..., Any],
            variable_groups: tuple[Group, ...], rng_groups: tuple[Group, ...], init: PyTree,
            *args: Any) -> tuple[tuple[PyTree, PyTree], tuple[Group, ...]]:
        """``pack``'s inner function: ``((carry, ys), variable groups out)``."""
        return cls(spec, counters, scope_fn, repack_fn, rng_groups, args).loop(
            init_broadcast, variable_groups, init)

    def scanned_args(self) -> tuple[PyTree, PyTree]:
        """The scanned arguments and their axes (``nn.broadcast`` ones are ``()``)."""
        in_axes, args = self.spec.in_axes, self.args
        try:
            scanned = jax.tree_util.tree_map(lambda ax, a: () if ax is broadcast else a,
                                             in_axes, args)
            axes = jax.tree_util.tree_map(lambda ax, a: () if ax is broadcast else ax,
                                          in_axes, args)
        except ValueError as e:
            raise ValueError(
                f"in_axes: must be an int, nn.broadcast or a prefix tree of the scanned "
                f"arguments ({e})"
            ) from None
        return scanned, axes

    def call(self, bvars: Group, cvars: Group, c: PyTree, x: PyTree) -> tuple[Any, PyTree, PyTree]:
        """``fn`` on one step's scope: ``(variable groups out, carry, ys)``."""
        spec = self.spec
        sv, sr, sa = x
        split_iter = iter(sr)
        rngs = tuple(next(split_iter) if split else g
                     for g, split in zip(self.rng_groups, spec.rng_split, strict=True))
        groups: tuple[Any, ...] = (bvars, cvars, *sv)
        if spec.data_transform is not None:
            groups, rngs = spec.data_transform(groups, rngs)
        scope = self.scope_fn(groups, rngs)
        call_args = jax.tree_util.tree_map(
            lambda ax, a, s: a if ax is broadcast else s, spec.in_axes, self.args, sa)
        c, y = spec.fn(scope, c, *call_args)
        return self.repack_fn(scope), c, y

    def first_pass(self, init_broadcast: bool, broadcast_vars: Group, carry_vars: Group,
                   init: PyTree, first: PyTree) -> Group:
        """One pass outside the loop, as nn.scan's init-mode trace: creates the
        broadcast variables at init (concrete), otherwise only traces (no compute)
        so that rng counters advance exactly as in nn.scan. The broadcast variables."""
        if init_broadcast:
            out, _, _ = self.call(broadcast_vars, carry_vars, init, first)
            return _with_inputs(broadcast_vars, out[0])
        jax.eval_shape(lambda: (self.call(broadcast_vars, carry_vars, init, first), None)[1])
        return broadcast_vars

    def step(self, carry: tuple[Group, PyTree], x: PyTree) -> tuple[Any, PyTree]:
        cvars, c = carry
        # Every trace (one per schedule piece, plus jax retraces) sees the
        # same rng counters: dropout masks do not depend on the schedule.
        _restore(self.counters, self.loop_counters)
        out, c, y = self.call(self.bvars, cvars, c, x)
        return (_with_inputs(cvars, out[1]), c), (y, tuple(out[2:]))

    def loop(self, init_broadcast: bool, variable_groups: tuple[Group, ...],
             init: PyTree) -> tuple[tuple[PyTree, PyTree], tuple[Group, ...]]:
        spec = self.spec
        broadcast_vars, carry_vars, *scan_groups = variable_groups
        scanned, arg_axes = self.scanned_args()
        steps = scanned_length(scanned, arg_axes, spec.length)
        split_groups = tuple(
            _map_rngs(lambda r: random.split(random.clone(r), steps), g)
            for g, split in zip(self.rng_groups, spec.rng_split, strict=True) if split
        )
        scan_in = tuple(meta.remove_axis(g, ax, spec.params)
                        for g, ax in zip(scan_groups, spec.in_group_axes, strict=True))
        xs = (scan_in, split_groups, scanned)
        xs_axes = (spec.in_group_axes, (0,) * len(split_groups), arg_axes)
        self.bvars = broadcast_vars
        if steps > 0 and (spec.check_constancy or init_broadcast):
            self.bvars = self.first_pass(init_broadcast, broadcast_vars, carry_vars, init,
                                         first_step(xs, xs_axes))
        self.loop_counters = _snapshot(self.counters)
        (carry_vars, c), (ys, scan_out) = scan_axes(
            self.step, (carry_vars, init), xs, steps, schedule=spec.schedule,
            reverse=spec.reverse, in_axes=xs_axes, out_axes=(spec.out_axes, spec.out_group_axes),
        )
        scan_out = tuple(meta.add_axis(g, ax, spec.params)
                         for g, ax in zip(scan_out, spec.out_group_axes, strict=True))
        return (c, ys), (self.bvars, carry_vars, *scan_out)


# lift_transform names a lifted class after its transform: "Scan" + class name,
# exactly as nn.scan does, so auto-named submodules (and params) match.
_scan_core.__name__ = "scan"
_scan_core.__qualname__ = "scan"


def _variable_axes(
    variable_axes: Mapping[CollectionFilter, Any],
) -> tuple[dict[CollectionFilter, int], dict[CollectionFilter, int]]:
    """Split ``variable_axes`` into its input and output axes (``In`` / ``Out``)."""
    if not isinstance(variable_axes, Mapping):
        raise ValueError(
            f"variable_axes: expected a mapping {{collection: axis}}, got {variable_axes!r}")
    unbox = lambda v: v.axis if isinstance(v, (In, Out)) else v  # noqa: E731
    var_in = {k: unbox(v) for k, v in variable_axes.items() if not isinstance(v, Out)}
    var_out = {k: unbox(v) for k, v in variable_axes.items() if not isinstance(v, In)}
    for col, ax in (*var_in.items(), *var_out.items()):
        if isinstance(ax, bool) or not isinstance(ax, int):
            raise ValueError(
                f"variable_axes: {col!r}: expected an integer axis, got {ax!r} "
                "(use variable_broadcast for collections shared by every step)")
    return var_in, var_out


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _map_rngs(fn: Callable[[jax.Array], jax.Array], tree: PyTree) -> PyTree:
    """Map ``fn`` over the PRNG keys of a tree (typed or raw uint32 keys)."""
    return jax.tree_util.tree_map(fn, tree, is_leaf=_is_key)


def _with_inputs(in_group: Group, out_group: Group) -> Group:
    """``out_group`` plus the input collections it lacks (immutable ones)."""
    merged = []
    for vin, vout in zip(in_group, out_group, strict=True):
        vout = dict(vout)
        for col, value in vin.items():
            vout.setdefault(col, value)
        merged.append(vout)
    return tuple(merged)


def _unique(dicts: list[Counters]) -> list[Counters]:
    seen: dict[int, Counters] = {}
    for d in dicts:
        seen.setdefault(id(d), d)
    return list(seen.values())


def _snapshot(counters: list[Counters]) -> list[Counters]:
    def copy(d: Counters) -> Counters:
        return {k: copy(v) if isinstance(v, dict) else v for k, v in d.items()}

    return [copy(d) for d in counters]


def _restore(counters: list[Counters], snapshot: list[Counters]) -> None:
    """Reset flax's (nested) rng counter dicts in place to a snapshot."""

    def restore(live: Counters, snap: Counters) -> None:
        for k in [k for k in live if k not in snap]:
            del live[k]
        for k, v in snap.items():
            if isinstance(v, dict):
                if not isinstance(live.get(k), dict):
                    live[k] = {}
                restore(live[k], v)
            else:
                live[k] = v

    for live, snap in zip(counters, snapshot, strict=True):
        restore(live, snap)


