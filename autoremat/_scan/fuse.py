"""The readout inside the scanned step: stack ``(T, B, Y)`` predictions, or nothing.

A step that returns its hidden state makes every scan -- plain or remat --
stack a ``(T, B, H)`` array of per-step outputs; the readout after the scan
then needs that stack, its cotangent and the readout's residual, all growing
linearly with ``T``. They are outputs, not residuals, so no schedule removes
them: at the seed's sizes they are ~92% of the best schedule's memory
(``autoremat show`` lists them as "stacked by the scan").

Moving the readout into the step removes that floor; remat recomputes, it
never approximates, so loss and gradients are the unfused model's:

* ``fuse_head(step, head)``: ``head`` applied to each step's output, so only
  its result is stacked (``(T, B, Y)`` predictions instead of ``(T, B, H)``
  states). Use it when you need the per-step predictions (metrics, decoding).
* ``fuse_loss(step, loss)``: each step's loss is added into the carry, so
  nothing is stacked at all; memory is then the schedule's alone (the
  stored carries and one chunk's residuals). Use it when you only need the
  loss (training).

Both are plain Python wrappers (no jax import); the head/loss may close over
parameters (they are differentiated like the step's own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Step = Callable[[Any, Any], tuple[Any, Any]]


def fuse_head(step: Step, head: Callable[[Any], Any]) -> Step:
    """``step`` with ``head`` applied to its per-step output, inside the step.

    ``(carry, x) -> (carry, head(y))``: a scan of it stacks ``head``'s outputs
    (e.g. ``(T, B, Y)`` predictions) instead of ``step``'s (``(T, B, H)``).

    Example:
      >>> import jax.numpy as jnp, autoremat
      >>> step = lambda c, x: (c + x, jnp.stack([c, x]))
      >>> fused = autoremat.fuse_head(step, lambda y: y.sum())
      >>> c, ys = autoremat.scan(fused, 0.0, jnp.ones(4), schedule=autoremat.plain(4))
      >>> ys.tolist()
      [1.0, 2.0, 3.0, 4.0]
    """
    if not callable(step) or not callable(head):
        raise TypeError("fuse_head: expected fuse_head(step, head) with two callables")

    def fused(carry: Any, x: Any) -> tuple[Any, Any]:
        carry, y = step(carry, x)
        return carry, head(y)

    return fused


def fuse_loss(step: Step, loss: Callable[[Any, Any], Any]) -> Step:
    """``step`` whose per-step ``loss(y, target)`` is summed into the carry; nothing stacked.

    The fused step's carry is ``(carry, total)`` and its input ``(x, target)``;
    it returns ``((carry, total + loss(y, target)), None)``. Scan it with
    ``init=(carry0, 0.0)`` and ``xs=(xs, targets)``; the final ``total`` is the
    sum over steps (divide for a mean).

    Example:
      >>> import jax.numpy as jnp, autoremat
      >>> step = lambda c, x: (c + x, c * x)
      >>> fused = autoremat.fuse_loss(step, lambda y, t: (y - t) ** 2)
      >>> (c, total), ys = autoremat.scan(fused, (0.0, 0.0), (jnp.ones(3), jnp.zeros(3)),
      ...                                 schedule=autoremat.nested([3]))
      >>> float(total), ys is None
      (5.0, True)
    """
    if not callable(step) or not callable(loss):
        raise TypeError("fuse_loss: expected fuse_loss(step, loss) with two callables")

    def fused(state: tuple[Any, Any], xt: tuple[Any, Any]) -> tuple[tuple[Any, Any], None]:
        carry, total = state
        x, target = xt
        carry, y = step(carry, x)
        return (carry, total + loss(y, target)), None

    return fused
