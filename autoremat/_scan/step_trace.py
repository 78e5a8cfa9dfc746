"""The step's one abstract trace: ``lax.scan``'s checks of the carry, and the
jaxpr every loop of a schedule runs.

``autoremat.scan`` traces the step once per call (or not at all, when the same
step was traced before on the same abstract inputs, as ``lax.scan`` caches its
body's trace), checks its output against ``init`` as ``lax.scan`` does, and
hands the schedule a step that evaluates that jaxpr: however many loops a
schedule nests (and a binomial schedule's re-advances), the step's Python runs
once, so tracing time does not grow with the schedule and code that counts its
traces (Flax's ``nnx.scan`` tests do) sees ``lax.scan``'s count. Costs
nothing at run time: the jaxpr is the step.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
from jax import lax

from autoremat._jax import trace_cache
from autoremat._scan.checkpoint_names import check_policy_names
from autoremat._schedules.base import Schedule

PyTree = Any


def checked_step(f: Callable[..., Any], init: Any, xs: PyTree, leaves: list[jax.Array],
                 axes: list[int], schedule: Schedule) -> tuple[Any, list[bool], Callable[..., Any]]:
    """``f`` (``f(carry, x)``, ``x`` the tree ``xs`` has) as a step on the flat
    ``leaves`` (scanned along ``axes``), checked against ``init`` as ``lax.scan``
    checks it: ``(init, forwarded, step)`` -- ``init`` with weakly typed leaves
    promoted, which carry leaves the step returns unchanged, and the step that
    runs the trace's jaxpr. A step whose output does not fit ``init`` raises
    ``lax.scan``'s own error, the schedule named after it.
    """
    treedef = jax.tree_util.tree_structure(xs)

    def step(carry: Any, x_leaves: Sequence[jax.Array]) -> tuple[Any, PyTree]:
        return f(carry, jax.tree_util.tree_unflatten(treedef, list(x_leaves)))

    try:
        return _checked_init(f, treedef, step, init, leaves, axes, schedule)
    except TypeError:
        _raise_lax_scans_error(f, init, xs, leaves, axes, schedule)
        raise


@trace_cache
def _trace_slot(f: Callable[..., Any], key: Hashable) -> dict[str, Any]:
    """Where the trace of ``f`` on the abstract inputs ``key`` is kept (empty at first).

    Cached as ``lax.scan`` caches its body's trace: weakly on ``f`` (dropped
    with it), on the inputs' structure and types, and on JAX's trace context.
    """
    return {}


def _trace(f: Callable[..., Any], treedef: Any, step: Callable[..., Any], init: Any,
           x_avals: list[jax.ShapeDtypeStruct]) -> tuple[Any, Any]:
    """``jax.make_jaxpr(step, return_shape=True)(init, x_avals)``, traced once per
    ``f``, input structure and types (``step`` is ``f`` on flat inputs of the
    tree ``treedef``). A trace that closes over another trace's values (a
    tracer among its constants) is not kept: it is valid only inside that trace.
    """
    try:
        weakref.ref(f)
        key = (treedef, jax.tree_util.tree_structure(init),
               tuple(jax.typeof(v) for v in jax.tree_util.tree_leaves(init)),
               tuple((x.shape, x.dtype) for x in x_avals))
        slot = _trace_slot(f, key)
    except TypeError:  # f not weakly referable or not hashable, or init not arrays
        return jax.make_jaxpr(step, return_shape=True)(init, x_avals)
    if "trace" not in slot:
        traced = jax.make_jaxpr(step, return_shape=True)(init, x_avals)
        if any(isinstance(c, jax.core.Tracer) for c in traced[0].consts):
            return traced
        slot["trace"] = traced
    trace: tuple[Any, Any] = slot["trace"]
    return trace


def _checked_init(f: Callable[..., Any], treedef: Any, step: Callable[..., Any], init: Any,
                  leaves: list[jax.Array], axes: list[int],
                  schedule: Schedule) -> tuple[Any, list[bool], Callable[..., Any]]:
    """``init``, checked against one abstract trace of the step, as ``lax.scan`` does;
    which carry leaves the step returns unchanged (``lax.scan`` forwards those); and
    the step run from that trace's jaxpr, so that the step's Python runs once per
    call however many loops the schedule has (as under ``lax.scan``).

    The step must return a pair whose carry has ``init``'s structure, shapes
    and dtypes; a weakly typed ``init`` leaf (a Python scalar) takes the dtype
    the step returns. Errors name the leaf and the schedule.
    """
    x_avals = [jax.ShapeDtypeStruct(x.shape[:a] + x.shape[a + 1:], x.dtype)
               for x, a in zip(leaves, axes, strict=True)]
    jaxpr, out = _trace(f, treedef, step, init, x_avals)
    check_policy_names(jaxpr.jaxpr, schedule)
    where = f"(autoremat.scan with schedule {schedule.describe()})"
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"scan body output must be a pair (carry, y), got {_summary(out)} {where}")
    difference = _structure_difference(init, out[0], "")
    if difference:
        raise TypeError("scan body function carry input and carry output must have the same "
                        f"pytree structure, but they differ: {difference} {where}. Revise the "
                        "function so that the carry output has the same structure as the input.")
    promoted = []
    for (path, leaf), new in zip(jax.tree_util.tree_flatten_with_path(init)[0],
                                 jax.tree_util.tree_leaves(out[0]), strict=True):
        old = jax.typeof(leaf)
        what = "shapes" if old.shape != new.shape else "dtypes" if old.dtype != new.dtype else ""
        if what == "dtypes" and old.weak_type and jnp.result_type(leaf, new.dtype) == new.dtype:
            leaf = lax.convert_element_type(leaf, new.dtype)
        elif what:
            raise TypeError(
                "scan body function carry input and carry output must have equal types, but "
                f"they differ: the input carry{jax.tree_util.keystr(path)} has type "
                f"{old.str_short()} but the output carry has type "
                f"{jax.typeof(new).str_short()}, so the {what} do not match {where}. Revise "
                "the function so that all output types match the corresponding input types.")
        promoted.append(leaf)
    n = len(promoted)
    invars, outvars = jaxpr.jaxpr.invars[:n], jaxpr.jaxpr.outvars[:n]
    forwarded = [o is i for i, o in zip(invars, outvars, strict=True)]
    checked = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(init), promoted)
    if any(p is not v for p, v in zip(promoted, jax.tree_util.tree_leaves(init), strict=True)):
        return checked, forwarded, step  # a promoted carry: the trace's types differ
    run, out_tree = jax.extend.core.jaxpr_as_fun(jaxpr), jax.tree_util.tree_structure(out)
    traced_avals = [v.aval for v in jaxpr.jaxpr.invars]

    def traced(carry: Any, x_leaves: Sequence[jax.Array]) -> Any:
        flat = jax.tree_util.tree_leaves((carry, list(x_leaves)))
        if [jax.typeof(v) for v in flat] != traced_avals:
            # Other types than the trace's -- inside shard_map, values vary over manual
            # axes the abstract inputs did not: the jaxpr's own casts would not fit.
            return step(carry, x_leaves)
        return jax.tree_util.tree_unflatten(out_tree, run(*flat))

    return checked, forwarded, traced


def _structure_difference(a: Any, b: Any, path: str) -> str:
    """Where the pytrees ``a`` (input carry) and ``b`` (output) first differ; ``""`` if equal."""
    if jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b):  # type: ignore[operator]
        return ""
    kids_a, kids_b = _children(a), _children(b)
    if (kids_a is None or kids_b is None or type(a) is not type(b)
            or [k for k, _ in kids_a] != [k for k, _ in kids_b]):
        return (f"the input carry{path} is {_summary(a)} but the output carry{path} is "
                f"{_summary(b)}")
    for (key, x), (_, y) in zip(kids_a, kids_b, strict=True):
        found = _structure_difference(x, y, path + key)
        if found:
            return found
    return f"the input carry{path} and the output carry{path} differ in their node data"


def _children(tree: Any) -> list[tuple[str, Any]] | None:
    """The immediate children of a pytree node with their key strings; ``None`` for a leaf."""
    if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(tree)) and tree is not None:
        return None
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda n: n is not tree)
    return [(jax.tree_util.keystr(p), x) for p, x in flat]


def _summary(value: Any) -> str:
    """A short description: ``a tuple of 3``, ``an array float32[2]``."""
    kids = _children(value)
    if kids is not None:
        return f"a {type(value).__name__} of {len(kids)}"
    try:
        return f"an array {jax.typeof(value).str_short()}"
    except TypeError:  # not an array type (a string, an object)
        return f"a {type(value).__name__}"


def _raise_lax_scans_error(f: Callable[..., Any], init: Any, xs: PyTree, leaves: list[jax.Array],
                           axes: list[int], schedule: Schedule) -> None:
    """Raise ``lax.scan``'s own error for a step whose output does not fit ``init``
    (not a pair, another carry structure or type), with the schedule after it.

    One abstract ``lax.scan`` of a single step (nothing runs); returns if that
    raises nothing, so the caller's own error stands.
    """
    one = [jax.ShapeDtypeStruct((1, *x.shape[:a], *x.shape[a + 1:]), x.dtype)
           for x, a in zip(leaves, axes, strict=True)]
    xs1 = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(xs), one)
    try:
        jax.eval_shape(lambda c, x: lax.scan(f, c, x, length=1), init, xs1)
    except TypeError as e:
        raise TypeError(f"{e}\n(autoremat.scan with schedule {schedule.describe()})") from None
