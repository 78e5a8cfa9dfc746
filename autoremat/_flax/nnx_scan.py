"""``autoremat.nnx.scan``: ``flax.nnx.scan`` run with a remat schedule.

It is ``nnx.scan`` itself -- the same argument checks and errors, graph mode
and tree mode (``graph=False``, ``graph_updates=False``), ``StateAxes``,
carried / broadcast / scanned state, Modules and Variables returned from the
step (scan over layers), ``transform_metadata`` -- with the loop Flax hands
to ``jax.lax.scan`` run by ``autoremat._scan.scan.scan_axes`` under the schedule
(``autoremat._jax.nnx_scan_with``).

Memory: Flax carries some state the step only reads (the parameters of a
module passed as ``nnx.Carry``, as ``nnx.RNN`` does; broadcast arrays).
``scan_axes`` forwards every carry leaf the step returns unchanged, as
``lax.scan`` does: it is held once, not in every checkpoint the schedule
saves. Values and gradients are those of ``nnx.scan``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from flax import nnx
from flax.core.frozen_dict import FrozenDict

from autoremat._jax import nnx_scan_with
from autoremat._scan.scan import as_schedule, scan_axes
from autoremat._schedules.base import Schedule

Carry = nnx.Carry
StateAxes = nnx.StateAxes
PyTree = Any


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

    Same call conventions, checks and errors as ``nnx.scan``: ``in_axes``
    gives each positional argument ``nnx.Carry`` (carried), ``None``
    (broadcast), an int (scanned along that axis) or, for a Module, an
    ``nnx.StateAxes`` mapping state filters to those; ``out_axes`` marks the
    output carry and the axis each output (array, Module or Variable) is
    stacked along. Use as a decorator (``@autoremat.nnx.scan(...)``) or call
    ``autoremat.nnx.scan(f, ...)``.

    Args:
      f: the step; with ``(Carry, 0)`` it is ``f(carry, x) -> (carry, y)``.
      schedule: the remat schedule, or the path of a schedule YAML file.
      length: the number of steps; needed only if nothing is scanned.
      reverse: scan from the last step to the first.
      unroll: the innermost ``lax.scan`` unroll; default: ``schedule.unroll``.
      in_axes, out_axes, transform_metadata, graph, graph_updates: as in
        ``nnx.scan``.
      _split_transpose: not supported (an error says so) unless ``False``.

    Returns:
      The scanned function (or a decorator when ``f`` is omitted).
    """
    if unroll is not None and (isinstance(unroll, bool) or not isinstance(unroll, int)):
        raise ValueError(
            f"unroll: expected an int (the innermost lax.scan unroll), got {unroll!r}; "
            "full unrolling (unroll=True) is not supported by autoremat.nnx.scan")
    if _split_transpose:
        raise ValueError("_split_transpose: not supported by autoremat.nnx.scan; "
                         "leave it out (or use nnx.scan)")
    sched = as_schedule(schedule)

    def loop(body: Callable[..., Any], init: Any, xs: Any = None, length: int | None = None,
             reverse: bool = False, **_: Any) -> Any:
        # Flax's own unroll (default 1) is ignored: the schedule's, or ours.
        return scan_axes(body, init, xs, length, schedule=sched, reverse=reverse, unroll=unroll)

    options: dict[str, Any] = dict(length=length, reverse=reverse, in_axes=in_axes,
                                   out_axes=out_axes, transform_metadata=transform_metadata)
    # Passed only when given: flax < 0.12.6 has no tree mode.
    options.update({k: v for k, v in (("graph", graph), ("graph_updates", graph_updates))
                    if v is not None})
    flax_scan = nnx_scan_with(loop)
    if f is None:
        return flax_scan(**options)
    return flax_scan(f, **options)
