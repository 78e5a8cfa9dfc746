"""``autoremat.nnx.remat_scans``: ``remat_scans`` for functions of NNX modules.

NNX modules are mutable Python objects, not arrays: the wrapper splits the
modules among the arguments into a graph definition and their state, runs
``autoremat.remat_scans`` over a pure function of that state (merge, call,
read the state back), and writes the new state into the caller's modules with
``nnx.update`` -- so in-place updates made inside (rng counts, ``BatchNorm``
statistics, any ``nnx.Variable`` mutation) survive exactly as without the
wrapper. Memory and time are the schedule's, values and gradients unchanged.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from flax import nnx
from flax.nnx.graph import is_graph_node

from autoremat._scan.remat_scans import DEFAULT_MIN_LENGTH, RematScans, RewriteReport
from autoremat._schedules.base import Schedule


class NnxRematScans:
    """The wrapper ``autoremat.nnx.remat_scans`` returns: ``fn``'s signature."""

    def __init__(self, fn: Callable[..., Any], schedule: Schedule | str | os.PathLike[str],
                 min_length: int, fuse: bool = True) -> None:
        RematScans(fn, schedule, min_length=min_length, fuse=fuse)  # checks the arguments
        self.fn, self.schedule, self.min_length, self.fuse = fn, schedule, min_length, fuse
        functools.update_wrapper(self, fn)

    def _pure(self, args: tuple[Any, ...]) -> tuple[RematScans, tuple[Any, ...], Any]:
        """A pure function of the modules' state (and the other arguments), and that state."""
        nodes = [i for i, a in enumerate(args) if is_graph_node(a)]
        modules = tuple(args[i] for i in nodes)
        graphdef, state = nnx.split(modules)
        others = {i: a for i, a in enumerate(args) if i not in nodes}

        def pure(state: Any, others: dict[int, Any], kwargs: dict[str, Any]) -> Any:
            merged = iter(nnx.merge(graphdef, state))  # type: ignore[arg-type]
            full = [next(merged) if i in nodes else others[i] for i in range(len(args))]
            out = self.fn(*full, **kwargs)
            return out, nnx.state(tuple(full[i] for i in nodes))

        return (RematScans(pure, self.schedule, min_length=self.min_length, fuse=self.fuse),
                modules,
                (state, others))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        pure, modules, (state, others) = self._pure(args)
        out, new_state = pure(state, others, kwargs)
        nnx.update(modules, new_state)
        return out

    def describe(self, *args: Any, **kwargs: Any) -> RewriteReport:
        """Which scans ``self(*args)`` rewrites and which it leaves; runs nothing."""
        pure, _, (state, others) = self._pure(args)
        return pure.describe(state, others, kwargs)


def remat_scans(fn: Callable[..., Any], schedule: Schedule | str | os.PathLike[str], *,
                min_length: int = DEFAULT_MIN_LENGTH, fuse: bool = True) -> NnxRematScans:
    """``fn`` (a function of NNX modules and arrays) with its long scans under ``schedule``.

    Like ``autoremat.remat_scans``; arguments that are NNX graph nodes
    (modules, ``nnx.Rngs``, optimizers) are split into state and merged inside,
    and their new state is written back after the call. Differentiate the
    result (``nnx.grad``, ``nnx.value_and_grad``), not the other way round.
    """
    return NnxRematScans(fn, schedule, min_length, fuse)
