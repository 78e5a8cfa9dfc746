"""Every read of JAX's and Flax's internals, in one place: the compatibility layer.

``remat_scans`` re-evaluates a traced function's jaxpr and so must know a few
primitives (``scan``, ``jit``, ``checkpoint``, ``cond``, the custom-derivative
calls, ``transpose``) and the names of their parameters, which JAX renames
between releases (jax 0.11 dropped ``scan``'s ``num_consts``/``num_carry`` for a
flat tree of its operands, ``ft_in``: ``scan_split`` reads either). Public
``jax.extend`` API is used where it exists; the rest (``remat_p``, source
locations, re-binding an equation with its own source information, the tracer
classes the binomial builder tells apart, the multi-controller client, the form of
a lowered step's source locations) is imported here and nowhere else
(``tests/test_imports.py``), and
``tests/test_jax.py`` checks each reader against the installed JAX: CI runs it on
the floor in ``pyproject.toml`` and on the newest release pip resolves.

``autoremat.nnx.scan`` is Flax's own ``nnx.scan`` with its loop replaced
(``nnx_scan_with``): Flax's checks, errors, graph and tree modes and state
handling, with the schedule's loop. ``autoremat.linen.scan`` is built on Flax's
scope lifting (``flax.core.lift.pack``, ``flax.core.scope``, as ``nn.scan`` itself is).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax.extend.core as jex_core
import jax.extend.core.primitives as prims
from jax._src import source_info_util
from jax._src.ad_checkpoint import remat_p
from jax._src.util import weakref_lru_cache

ClosedJaxpr = jex_core.ClosedJaxpr
Jaxpr = jex_core.Jaxpr
JaxprEqn = jex_core.JaxprEqn
Literal = jex_core.Literal
Var = jex_core.Var
# jax.extend.core has DropVar from jax 0.8; before, jax.core alone had it
DropVar = getattr(jex_core, "DropVar", None) or importlib.import_module("jax.core").DropVar

#: The JAX releases these readers are tested on: the floor in ``pyproject.toml`` to the
#: newest (``tests/test_jax.py`` checks each reader on the installed one).
SUPPORTED_JAX = ">= 0.7.1"

SCAN = prims.scan_p
JIT = prims.jit_p
COND = prims.cond_p
REMAT = remat_p
TRANSPOSE = prims.transpose_p

# scan's parameters (how many operands are consts and carries: ``scan_split``)
SCAN_BODY = "jaxpr"  # a ClosedJaxpr: (consts, carry, x) -> (carry, y)
LENGTH = "length"
REVERSE = "reverse"
UNROLL = "unroll"
# jit's / checkpoint's body, cond's branches, transpose's permutation, checkpoint's options
JIT_BODY = "jaxpr"  # ClosedJaxpr
REMAT_BODY = "jaxpr"  # an open Jaxpr (no consts)
REMAT_POLICY = "policy"
REMAT_PREVENT_CSE = "prevent_cse"
COND_BRANCHES = "branches"  # tuple of ClosedJaxpr; operand 0 is the branch index
PERMUTATION = "permutation"


def scan_split(params: dict[str, Any]) -> tuple[int, int]:
    """``(consts, carries)``: how many of a ``scan`` equation's operands are constants and
    how many are the carry (the rest are the scanned inputs; its outputs are the carry,
    then the stacked outputs).

    jax < 0.11 states both counts (``num_consts``, ``num_carry``); from 0.11 the operands
    are a flat tree of three groups (``ft_in``: consts, carry, xs) and the counts are
    their lengths.
    """
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    tree = params.get("ft_in")
    if tree is None:
        raise NotImplementedError(
            "this jax's scan states neither num_consts/num_carry nor ft_in; autoremat supports "
            f"jax {SUPPORTED_JAX}: install one of those")
    consts, carry, _ = tree.unpack()
    return len(consts), len(carry)


def trace_context() -> Any:
    """JAX's trace context: the flags a trace depends on (x64, matmul precision, ...). Its
    context managers (``jax.default_matmul_precision``) set them per thread, so a thread
    traces as another only when both read the same (``autoremat._search.planning.compile_pool``)."""
    from jax._src import config

    return config.trace_context()


def trace_cache(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` cached as JAX caches a traced function (``lax.scan``'s body, ``jit``'s):
    weakly on its first argument (the entry goes with it), strongly on the others,
    with JAX's trace context (x64 and the other flags a trace depends on) in the key."""
    cached: Callable[..., Any] = weakref_lru_cache(fn)
    return cached


def sub_jaxprs(params: dict[str, Any]) -> Iterator[Jaxpr]:
    """Every jaxpr held in an equation's parameters (open or closed, alone or in a tuple)."""
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, Jaxpr):
                yield item


def bind(eqn: JaxprEqn, invals: Sequence[Any], where: JaxprEqn | None = None) -> list[Any]:
    """Evaluate ``eqn`` on ``invals`` as ``jax.core.eval_jaxpr`` does (its outputs, a list),
    in the source context of ``where`` (default ``eqn``)."""
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    # jax < 0.8 returns (subfuns, params), newer jax the params alone
    subfuns, params = bind_params if isinstance(bind_params, tuple) else ([], bind_params)
    with source_context(where or eqn), eqn.ctx.manager:
        out = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def bind_with(eqn: JaxprEqn, invals: Sequence[Any], params: dict[str, Any] | Any,
              where: JaxprEqn | None = None) -> list[Any]:
    """``eqn``'s primitive bound on ``invals`` with ``params`` (a non-call primitive), in
    the source context of ``where`` (default ``eqn``); its outputs, a list."""
    with source_context(where or eqn), eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def custom_jvp_rule(eqn: JaxprEqn) -> tuple[Jaxpr, Sequence[Any]] | None:
    """The derivative rule of a ``custom_jvp_call`` equation as an open jaxpr and its consts:
    ``(*primals, *tangents) -> (*primal_outs, *tangent_outs)`` (no constants, every tangent
    non-zero); ``None`` when this jax does not expose it as ``jvp_jaxpr_fun``."""
    fun = eqn.params.get("jvp_jaxpr_fun")
    if fun is None or eqn.params.get("num_consts"):
        return None
    try:
        jaxpr, consts, out_zeros = fun.call_wrapped(*[False] * len(eqn.invars))
    except Exception:  # another jax's signature: left as written, and said so
        return None
    if any(out_zeros) or not isinstance(jaxpr, Jaxpr):
        return None
    return jaxpr, consts


def is_drop(v: Any) -> bool:
    """``v`` is an output nobody reads (``_`` in a printed jaxpr)."""
    return isinstance(v, DropVar)


def source_context(eqn: JaxprEqn) -> contextlib.AbstractContextManager[Any]:
    """Equations emitted inside keep ``eqn``'s traceback and name stack (for errors, profiles)."""
    info = eqn.source_info
    return source_info_util.user_context(
        info.traceback, name_stack=source_info_util.current_name_stack() + info.name_stack)


def _library_dirs() -> tuple[str, ...]:
    dirs = []
    for name in ("jax", "autoremat", "flax", "optax", "equinox"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            dirs.append(os.path.dirname(path))
    return tuple(d + os.sep for d in dirs)


def has_user_frame(eqn: JaxprEqn) -> bool:
    """``eqn``'s traceback reaches code outside jax and the libraries ``user_location`` skips."""
    skip = _library_dirs()
    return any(not f.file_name.startswith(skip)
               for f in source_info_util.user_frames(eqn.source_info.traceback))


def user_location(eqn: JaxprEqn) -> str:
    """``file:line (function)`` of the user code that emitted ``eqn`` (libraries skipped)."""
    skip = _library_dirs()
    frames = list(source_info_util.user_frames(eqn.source_info.traceback))
    for frame in frames:
        if not frame.file_name.startswith(skip):
            return f"{_short(frame.file_name)}:{frame.start_line} ({frame.function_name})"
    if frames:
        frame = frames[0]
        return f"{_short(frame.file_name)}:{frame.start_line} ({frame.function_name})"
    return "unknown location"


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if rel.startswith("..") else rel


# -- Flax: nnx.scan with another loop (the drop-in) ----------------------------------
# ``flax.nnx.transforms.iteration`` runs its loop through the module global
# ``jax`` (``jax.lax.scan(...)``) in ``scan`` (flax 0.12.0-0.12.5) or in
# ``_simple_scan`` / ``_graph_updates_scan`` (0.12.6+, tree and graph modes).

_FLAX_SCAN_FUNCTIONS = ("scan", "_simple_scan", "_graph_updates_scan")


class _Swapped:
    """A module with some attributes replaced; every other attribute is the module's."""

    def __init__(self, module: Any, **swapped: Any) -> None:
        self._module, self._swapped = module, swapped

    def __getattr__(self, name: str) -> Any:
        swapped = self.__dict__["_swapped"]
        return swapped[name] if name in swapped else getattr(self._module, name)


def nnx_scan_with(loop: Callable[..., Any]) -> Callable[..., Any]:
    """``flax.nnx.scan`` itself -- its argument checks, errors, graph and tree
    modes, state handling -- with ``loop`` (``jax.lax.scan``'s signature) in place
    of ``jax.lax.scan``.

    A copy of Flax's scan functions over a copy of their module's globals in
    which ``jax.lax.scan`` is ``loop``; Flax's module is left untouched. With a
    Flax whose scan no longer reaches the loop through its ``jax`` global the
    copy would run ``jax.lax.scan``: ``tests/test_nnx.py`` checks that the loop
    is reached.
    """
    import jax
    from flax.nnx.transforms import iteration

    namespace = dict(vars(iteration))
    namespace["jax"] = _Swapped(jax, lax=_Swapped(jax.lax, scan=loop))
    for name in _FLAX_SCAN_FUNCTIONS:
        fn = namespace.get(name)
        if isinstance(fn, types.FunctionType):
            copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__,
                                      fn.__closure__)
            copy.__kwdefaults__ = fn.__kwdefaults__
            copy.__dict__.update(fn.__dict__)
            copy.__qualname__, copy.__doc__ = fn.__qualname__, fn.__doc__
            namespace[name] = copy
    scan: Callable[..., Any] = namespace["scan"]
    return scan


#: The custom call JAX's GPU and TPU lowering wraps around a value placed in another
#: memory kind (``mlir.wrap_with_memory_kind``; its frontend attribute
#: ``_xla_buffer_placement`` names the kind, e.g. ``pinned_host``). On a CPU, jax
#: (0.10) lowers a ``device_put`` to another memory space to nothing, so an offload
#: policy's lowered step holds none: ``autoremat._search.probes.probe`` reads this.
HOST_PLACEMENT_CALL = "annotate_device_placement"

#: The primitive ``jax.ad_checkpoint.checkpoint_name`` binds (its parameter ``name``: the
#: tag a ``save_only_these_names``-style policy refers to); ``autoremat._scan.checkpoint_names``.
CHECKPOINT_NAME = "name"
CHECKPOINT_NAME_PARAM = "name"
#: Call-like primitives (by name): one inner jaxpr computes their outputs from their
#: inputs, one to one, so a value passes through them unchanged (``jnp.einsum``'s jit,
#: custom derivatives, a remat inside the step); ``checkpoint_names.dot_forms`` reads it.
CALLS = frozenset({"pjit", "jit", "closed_call", "core_call", "custom_jvp_call",
                   "custom_vjp_call", "custom_vjp_call_jaxpr", "checkpoint", "remat"})
#: Primitives (by name) that rearrange a value without changing its bytes.
SAME_BYTES = frozenset({"transpose", "reshape", "squeeze", "expand_dims", "copy"})


def distributed_client() -> Any:
    """The multi-controller runtime's client, whose key-value store the processes of a job
    share (``jax.distributed.initialize`` makes it; ``None`` before): ``key_value_set_bytes``,
    ``blocking_key_value_get_bytes``, ``key_value_set``, ``key_value_try_get``.
    ``autoremat._search.lockstep`` talks through it."""
    from jax._src import distributed

    return distributed.global_state.client


def same_locations_anywhere() -> contextlib.AbstractContextManager[Any]:
    """Steps lowered inside give each operation its innermost user frame as its source
    location instead of the whole Python stack the trace ran under: a program traced
    under different callers then compiles to the same executable fingerprint. JAX
    derives a multi-process run's launch id from that fingerprint, and from jax 0.11 the
    processes' CPU collectives meet only on equal launch ids (a lockstep tune's processes
    trace the same step under different callers: ``autoremat._search.lockstep``). Only
    debug information changes (a profile's or a dump's stack per operation); the program,
    its memory and its time do not. Per thread, as JAX's config contexts are."""
    from jax._src import config

    return config.include_full_tracebacks_in_locations(False)


def traced_by(name: str, *trees: Any) -> bool:
    """Whether a leaf of ``trees`` is a tracer of JAX's ``ad.<name>`` (``JVPTracer``: forward
    mode; ``LinearizeTracer``: reverse mode); the binomial builder tells the two apart.
    Private classes: with a jax without them the answer is ``False`` and JAX's own errors
    apply."""
    import jax
    from jax._src.interpreters import ad

    kind = getattr(ad, name, None)
    return isinstance(kind, type) and any(
        isinstance(leaf, kind) for leaf in jax.tree_util.tree_leaves(trees))


@contextlib.contextmanager
def cache_writes_under(gate: Callable[[], contextlib.AbstractContextManager[Any]],
                       ) -> Iterator[None]:
    """Inside, each compile's persistent-cache entry write (``compilation_cache
    .put_executable_and_time``, which ``compiler`` calls through its module, on whichever
    thread compiles) runs inside ``gate()``; as it was after. The write serializes the
    executable with the GIL kept: beside a step's timing, a timed run read slow by as
    long (on a TPU, the outliers of ``studies/results/tune_time_v5e_workers.md``). With a
    jax without that function, nothing changes."""
    from jax._src import compilation_cache

    real = getattr(compilation_cache, "put_executable_and_time", None)
    if real is None:
        yield
        return

    def gated(*args: Any, **kwargs: Any) -> Any:
        with gate():
            return real(*args, **kwargs)

    compilation_cache.put_executable_and_time = gated
    try:
        yield
    finally:
        compilation_cache.put_executable_and_time = real
