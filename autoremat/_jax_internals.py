"""JAX and Flax private APIs that autoremat relies on, in one place.

Each function names the private name it reads and what happens on a version
without it. Keep every use of a private module, class or parameter here.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

# -- Flax: nnx.scan with another loop (drop-in, issue 23) ----------------------------
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


# -- JAX: running a traced step from its jaxpr (trace once, as lax.scan) ---------------

def jaxpr_function(closed_jaxpr: Any) -> Callable[..., list[Any]]:
    """The flat function a ``ClosedJaxpr`` computes (``jax._src.core.jaxpr_as_fun``,
    present from jax 0.4 to at least 0.10): evaluating it binds the jaxpr's equations
    again, without calling the Python function that was traced."""
    from jax._src import core

    run: Callable[..., list[Any]] = core.jaxpr_as_fun(closed_jaxpr)  # curried
    return run
