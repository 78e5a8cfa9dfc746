"""``autoremat.nnx.scan``: ``flax.nnx.scan`` run with a remat schedule.

How a call runs (graph mode, as ``nnx.scan`` by default):

1. The arguments are flattened with every graph node (Module, Rngs, Variable)
   as a leaf; each leaf gets its ``in_axes`` entry (``nnx.Carry``, ``None``,
   an int, or per filter for a ``StateAxes``).
2. The graph nodes are split once (``nnx.split``, sharing preserved) into
   carried, broadcast and scanned (per axis) state.
3. One abstract trace of a step (no compute) finds which carried leaves the
   step leaves untouched (parameters of a module passed as ``Carry``, as
   ``nnx.RNN`` does; rng keys). Those are closed over as constants instead of
   carried, so the schedule's checkpoints hold only what really changes (the
   hidden state, a counter, rng counts) -- with a carried parameter every
   saved carry would hold a copy of the weights. Values and gradients are the
   same either way.
4. ``autoremat._scan.scan_axes`` runs the loop; each step merges the state into
   fresh modules, calls ``f`` and splits them again.
5. The final carried state and the stacked scanned state are written back to
   the caller's modules (``nnx.update``); mutations of broadcast state are
   dropped, as ``nnx.scan`` drops them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
from flax import nnx
from flax.core.frozen_dict import FrozenDict
from flax.nnx import filterlib
from flax.nnx import graph as nnx_graph

from autoremat._scan import as_schedule, first_step, scan_axes, scanned_length
from autoremat._schedule import Schedule

Carry = nnx.Carry
StateAxes = nnx.StateAxes
PyTree = Any
_CARRY = "carry"  # the category of carried state (nnx.Carry is a class, not a key)


def _is_node(x: Any) -> bool:
    return isinstance(x, nnx.Variable) or nnx_graph.is_graph_node(x)


def _is_axis(x: Any) -> bool:
    return x is None or x is Carry or isinstance(x, (int, StateAxes))


def scan(
    f: Callable[..., Any] | None = None,
    *,
    schedule: Schedule | str | os.PathLike[str],
    length: int | None = None,
    reverse: bool = False,
    unroll: int | None = None,
    in_axes: Any = (Carry, 0),
    out_axes: Any = (Carry, 0),
    _split_transpose: bool = False,
    transform_metadata: Mapping[str, Any] = FrozenDict(),
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> Any:
    """``flax.nnx.scan`` run with a remat schedule (see ``autoremat.nnx``).

    Same call conventions as ``nnx.scan``: ``in_axes`` gives each positional
    argument ``nnx.Carry`` (carried), ``None`` (broadcast), an int (scanned
    along that axis) or, for a Module, an ``nnx.StateAxes`` mapping state
    filters to those; ``out_axes`` marks the output carry and the axis each
    output is stacked along. Use as a decorator (``@autoremat.nnx.scan(...)``)
    or call ``autoremat.nnx.scan(f, ...)``.

    Args:
      f: the step; with ``(Carry, 0)`` it is ``f(carry, x) -> (carry, y)``.
      schedule: the remat schedule, or the path of a schedule YAML file.
      length: the number of steps; needed only if nothing is scanned.
      reverse: scan from the last step to the first.
      unroll: the innermost ``lax.scan`` unroll; default: ``schedule.unroll``.
      in_axes, out_axes: as in ``nnx.scan``.
      _split_transpose, transform_metadata, graph, graph_updates: ``nnx.scan``
        options that are not supported (an error says so) unless left at
        their defaults (``graph=True`` and ``graph_updates=True`` are fine).

    Returns:
      The scanned function (or a decorator when ``f`` is omitted).
    """
    _check_unsupported(unroll, _split_transpose, transform_metadata, graph, graph_updates)
    sched = as_schedule(schedule)
    if unroll is not None:
        sched = dataclasses.replace(sched, unroll=unroll)
    options = dict(length=length, reverse=reverse, in_axes=in_axes, out_axes=out_axes)
    if f is None:
        return lambda fn: _scanned(fn, sched, **options)
    return _scanned(f, sched, **options)


def _check_unsupported(unroll: Any, split_transpose: bool, transform_metadata: Any,
                       graph: bool | None, graph_updates: bool | None) -> None:
    if unroll is not None and (isinstance(unroll, bool) or not isinstance(unroll, int)):
        raise ValueError(
            f"unroll: expected an int (the innermost lax.scan unroll), got {unroll!r}; "
            "full unrolling (unroll=True) is not supported by autoremat.nnx.scan")
    if split_transpose:
        raise ValueError("_split_transpose: not supported by autoremat.nnx.scan; "
                         "leave it out (or use nnx.scan)")
    if transform_metadata:
        raise ValueError("transform_metadata: not supported by autoremat.nnx.scan (it only "
                         "annotates scanned parameters, e.g. layer stacks); use nnx.scan")
    for name, value in (("graph", graph), ("graph_updates", graph_updates)):
        if value is False:
            raise ValueError(f"{name}=False (tree mode) is not supported by "
                             "autoremat.nnx.scan; leave it out to use graph mode")


def _arg_axes(in_axes: Any, nargs: int) -> tuple[Any, ...]:
    if not isinstance(in_axes, tuple):
        if in_axes is Carry and nargs != 1:
            raise ValueError(f"in_axes=nnx.Carry: the function must take exactly one "
                             f"argument, got {nargs}")
        return (in_axes,) * nargs
    if len(in_axes) != nargs:
        raise ValueError(f"in_axes: has {len(in_axes)} entries for {nargs} arguments")
    return in_axes


def _carry_index(axes: Any, name: str) -> int | None:
    """The position of the top-level ``nnx.Carry`` in a tuple of axes, if any."""
    if axes is Carry:
        return 0
    if not isinstance(axes, tuple):
        axes = (axes,)
    found = [i for i, a in enumerate(axes) if a is Carry]
    nested = [a for a in axes if a is not Carry and any(
        x is Carry for x in jax.tree_util.tree_leaves(a, is_leaf=_is_axis))]
    if nested or len(found) > 1:
        raise ValueError(f"{name}: nnx.Carry must appear once, at the top level, got {axes!r}")
    for a in jax.tree_util.tree_leaves(axes, is_leaf=_is_axis):
        if a is None and name == "out_axes":
            raise ValueError("out_axes: None (a broadcast output) is not supported, as in "
                             "nnx.scan; return it from outside the scanned function")
    return found[0] if found else None


def _leaf_axes(axes: tuple[Any, ...], args: tuple[Any, ...]) -> list[Any]:
    """The ``in_axes`` entry of every leaf of ``args`` (graph nodes are leaves)."""
    out: list[Any] = []

    def visit(axis: Any, sub: Any) -> None:
        out.extend([axis] * len(jax.tree_util.tree_leaves(sub, is_leaf=_is_node)))

    try:
        jax.tree_util.tree_map(visit, axes, args, is_leaf=_is_axis)
    except ValueError as e:
        raise ValueError(f"in_axes: must be a prefix tree of the arguments ({e})") from None
    return out


def _scanned(f: Callable[..., Any], schedule: Schedule, *, length: int | None,
             reverse: bool, in_axes: Any, out_axes: Any) -> Callable[..., Any]:
    if inspect.ismethod(f) and _is_node(f.__self__):
        raise ValueError("f: a bound method of a Module; scan the plain function and pass "
                         "the module as an argument (as nnx.scan requires)")
    in_carry = _carry_index(in_axes, "in_axes")
    out_carry = _carry_index(out_axes, "out_axes")
    if (in_carry is None) != (out_carry is None):
        raise ValueError(f"in_axes and out_axes: both or neither must contain nnx.Carry, got "
                         f"in_axes={in_axes!r}, out_axes={out_axes!r}")

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            args = tuple(inspect.signature(f).bind(*args, **kwargs).args)
        axes = _arg_axes(in_axes, len(args))
        loop = _Loop(f, args, axes, in_carry, out_axes)
        return loop.run(schedule, length, reverse)

    return wrapper


class _Loop:
    """One call of a scanned function: the split of its arguments and the step."""

    def __init__(self, f: Callable[..., Any], args: tuple[Any, ...], axes: tuple[Any, ...],
                 carry_arg: int | None, out_axes: Any) -> None:
        self.f, self.args, self.carry_arg, self.out_axes = f, args, carry_arg, out_axes
        leaves, self.treedef = jax.tree_util.tree_flatten(args, is_leaf=_is_node)
        specs = _leaf_axes(axes, args)
        self.is_node = [_is_node(x) for x in leaves]
        self.node_pos = [i for i, x in enumerate(leaves) if _is_node(x)]
        self.nodes = [leaves[i] for i in self.node_pos]
        self.node_specs = [specs[i] for i in self.node_pos]
        plain = [(i, x, s) for i, (x, s) in enumerate(zip(leaves, specs, strict=True))
                 if not _is_node(x)]
        for _, _, s in plain:
            if isinstance(s, StateAxes):
                raise ValueError("in_axes: nnx.StateAxes applies to Modules only, got it for "
                                 "a non-graph argument")
        self.plain = {i: x for i, x, _ in plain}
        self.pcarry_pos = [i for i, _, s in plain if s is Carry]
        self.px_pos = [i for i, _, s in plain if isinstance(s, int)]
        self.px_axes = [s for _, _, s in plain if isinstance(s, int)]
        self.carry_tree = (jax.tree_util.tree_flatten(args[carry_arg], is_leaf=_is_node)[1]
                           if carry_arg is not None else None)
        # Graph state, one group per category: carried, broadcast, each scanned axis.
        categories = {self._category(p, v) for p, v in _flat(self.nodes)}
        self.axes = sorted(c for c in categories if isinstance(c, int))
        self.filters = [self._filter(_CARRY), self._filter(None),
                        *(self._filter(a) for a in self.axes)]
        split: tuple[Any, ...] = nnx.split(self.nodes, *self.filters)
        self.graphdef: Any = split[0]
        gcarry, self.gbcast, self.gx = split[1], split[2], list(split[3:])
        self.gcarry_leaves, self.gcarry_def = jax.tree_util.tree_flatten(gcarry)
        self.changed: list[bool] = [True] * len(self.gcarry_leaves)

    def _category(self, path: tuple[Any, ...], value: Any) -> Any:
        spec = self.node_specs[path[0]]
        if isinstance(spec, StateAxes):
            for filt, axis in spec.items():
                if filterlib.to_predicate(filt)(path[1:], value):
                    return _CARRY if axis is Carry else axis
            raise ValueError(f"in_axes: {spec!r} has no filter matching the state at "
                             f"{'/'.join(map(str, path[1:]))}; add one (e.g. ...: nnx.Carry)")
        return _CARRY if spec is Carry else spec

    def _filter(self, category: Any) -> Callable[[Any, Any], bool]:
        def matches(path: tuple[Any, ...], value: Any) -> bool:
            c = self._category(path, value)
            return c == category and type(c) is type(category)

        return matches

    def step(self, carry: Any, x: Any, probe: bool = False) -> tuple[Any, Any]:
        """One step on pure state: ``((gcarry, pcarry), (gx, px)) -> (carry, (ys, gx))``."""
        gvar, pcarry = carry
        gx, px = x
        it = iter(gvar)
        gleaves = [next(it) if c else v
                   for c, v in zip(self.changed, self.gcarry_leaves, strict=True)]
        gcarry = jax.tree_util.tree_unflatten(self.gcarry_def, gleaves)
        gbcast = jax.tree_util.tree_map(lambda v: v, self.gbcast)  # fresh Variables
        nodes = nnx.merge(self.graphdef, gcarry, gbcast, *gx)
        leaves: list[Any] = [None] * len(self.is_node)
        for i, node in zip(self.node_pos, nodes, strict=True):
            leaves[i] = node
        for i, v in self.plain.items():
            leaves[i] = v
        for i, v in zip(self.pcarry_pos, pcarry, strict=True):
            leaves[i] = v
        for i, v in zip(self.px_pos, px, strict=True):
            leaves[i] = v
        args = jax.tree_util.tree_unflatten(self.treedef, leaves)
        carry_out, ys = self._split_output(self.f(*args))
        pcarry_out = self._carry_leaves(carry_out, args)
        if _contains_node(ys):
            raise ValueError("out_axes: the scanned function returns a Module or Variable; "
                             "autoremat.nnx.scan stacks arrays only (use nnx.scan to create "
                             "stacked modules)")
        split: tuple[Any, ...] = nnx.split(nodes, *self.filters)
        graphdef, gcarry_out, gx_out = split[0], split[1], split[3:]
        if graphdef != self.graphdef:
            raise ValueError("f: the scanned function changed the structure of a module (added "
                             "or removed a Variable or submodule); that is not supported")
        out_leaves = jax.tree_util.tree_leaves(gcarry_out)
        if probe:
            self.changed = [o is not v for o, v in zip(out_leaves, gleaves, strict=True)]
            gvar_out = out_leaves
        else:
            for c, o, v in zip(self.changed, out_leaves, gleaves, strict=True):
                if not c and o is not v:
                    raise ValueError("f: the scanned function wrote state it left untouched "
                                     "when first traced; it must trace the same way each time")
            gvar_out = [o for c, o in zip(self.changed, out_leaves, strict=True) if c]
        return (gvar_out, pcarry_out), (ys, tuple(gx_out))

    def _split_output(self, out: Any) -> tuple[Any, Any]:
        if self.carry_arg is None:
            return None, out
        if self.out_axes is Carry:
            return out, ()
        if not isinstance(out, tuple) or len(out) != len(self.out_axes):
            raise ValueError(f"out_axes: {self.out_axes!r} expects a tuple of "
                             f"{len(self.out_axes)} outputs, got {type(out).__name__}")
        i = self.out_axes.index(Carry)
        return out[i], out[:i] + out[i + 1:]

    def _ys_axes(self) -> Any:
        if self.carry_arg is None:
            return self.out_axes
        if self.out_axes is Carry:
            return ()
        return tuple(a for a in self.out_axes if a is not Carry)

    def _carry_leaves(self, carry_out: Any, args: tuple[Any, ...]) -> list[Any]:
        if self.carry_arg is None:
            return []
        leaves, tree = jax.tree_util.tree_flatten(carry_out, is_leaf=_is_node)
        ins = jax.tree_util.tree_leaves(args[self.carry_arg], is_leaf=_is_node)
        if tree != self.carry_tree or any(
                _is_node(a) != _is_node(b) or (_is_node(a) and a is not b)
                for a, b in zip(leaves, ins, strict=True)):
            raise ValueError("the returned carry must have the structure of the input carry "
                             f"and hold the same modules ({tree} != {self.carry_tree})")
        return [x for x in leaves if not _is_node(x)]

    def run(self, schedule: Schedule, length: int | None, reverse: bool) -> Any:
        px = [jax.numpy.asarray(self.plain.pop(i)) for i in self.px_pos]
        pcarry = [self.plain.pop(i) for i in self.pcarry_pos]
        xs, xs_axes = (tuple(self.gx), px), (tuple(self.axes), self.px_axes)
        if scanned_length(xs, xs_axes, length) > 0:
            jax.eval_shape(lambda c, x: self.step(c, x, probe=True),
                           (self.gcarry_leaves, pcarry), first_step(xs, xs_axes))
        init = ([v for c, v in zip(self.changed, self.gcarry_leaves, strict=True) if c], pcarry)
        (gvar, pcarry), (ys, gx_out) = scan_axes(
            self.step, init, xs, length, schedule=schedule, reverse=reverse,
            in_axes=xs_axes, out_axes=(self._ys_axes(), tuple(self.axes)))
        it = iter(gvar)
        gleaves = [next(it) if c else v
                   for c, v in zip(self.changed, self.gcarry_leaves, strict=True)]
        if self.nodes:
            nnx.update(self.nodes, jax.tree_util.tree_unflatten(self.gcarry_def, gleaves),
                       *gx_out)
        if self.carry_arg is None:
            return ys
        arg_leaves = jax.tree_util.tree_leaves(self.args[self.carry_arg], is_leaf=_is_node)
        it = iter(pcarry)
        carry = jax.tree_util.tree_unflatten(
            self.carry_tree, [x if _is_node(x) else next(it) for x in arg_leaves])
        if self.out_axes is Carry:
            return carry
        i = self.out_axes.index(Carry)
        return (*ys[:i], carry, *ys[i:])


def _flat(nodes: list[Any]) -> list[tuple[tuple[Any, ...], Any]]:
    """``(path, Variable)`` of every Variable under ``nodes``."""
    _, state = nnx.split(nodes)
    flat = nnx.to_flat_state(state) if hasattr(nnx, "to_flat_state") else state.flat_state()
    return list(flat)


def _contains_node(tree: Any) -> bool:
    return any(_is_node(x) for x in jax.tree_util.tree_leaves(tree, is_leaf=_is_node))
