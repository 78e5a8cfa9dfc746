"""Inline the calls that stand between a long scan and its readout (for ``fuse``).

``remat_scans`` moves a readout into a scan only when both are in one jaxpr.
Two kinds of call equations can stand between them:

* ``jit`` (a jitted helper such as ``jnp.take_along_axis`` in a loss, or a
  jitted model): inlining it changes nothing -- inside a traced function a
  ``jit`` is inlined by XLA anyway (its shardings and donation are not kept,
  as for a ``jit`` holding a long scan);
* ``checkpoint`` (``jax.checkpoint``, ``nn.remat``) around the model whose
  stacked outputs leave it towards the loss: inlined, its body's residuals are
  stored instead of recomputed, while the scan inside keeps the schedule's
  memory; the extra forward pass the checkpoint made in the backward pass is
  saved. Values and gradients are unchanged (remat recomputes, it never
  approximates). ``fuse=False`` keeps it.

``flatten`` re-traces the function with exactly those calls inlined and says
which checkpoints it inlined; every other equation is bound as written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from autoremat import _jax as ji
from autoremat._scan.fuse_readout import analyse


def _long(eqn: Any, min_length: int) -> bool:
    return eqn.primitive is ji.SCAN and eqn.params[ji.LENGTH] >= min_length


def _holds_long(jaxpr: Any, min_length: int) -> bool:
    return any(_long(e, min_length) or any(_holds_long(s, min_length)
                                          for s in ji.sub_jaxprs(e.params))
               for e in jaxpr.eqns)


def _crosses(body: Any, min_length: int) -> bool:
    """A long scan in ``body`` whose stacked outputs leave ``body`` through per-step work."""
    heavy = lambda e: _long(e, min_length) or any(  # noqa: E731
        _holds_long(s, min_length) for s in ji.sub_jaxprs(e.params))
    return any(_long(e, min_length) and analyse(body, i, heavy, "checkpoint body").returned
               for i, e in enumerate(body.eqns))


def _decide(jaxpr: Any, depends_in: Sequence[bool], min_length: int) -> dict[int, str]:
    """Which call equations of ``jaxpr`` to inline: index -> ``jit`` or ``checkpoint``."""
    depends = {v for v, d in zip(jaxpr.invars, depends_in, strict=True) if d}
    out: dict[int, str] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        dep = any(isinstance(v, ji.Var) and v in depends for v in eqn.invars)
        subs = list(ji.sub_jaxprs(eqn.params))
        holds = _long(eqn, min_length) or any(_holds_long(s, min_length) for s in subs)
        if eqn.primitive is ji.JIT and (holds or dep):
            out[i] = "jit"
        elif eqn.primitive is ji.REMAT and holds and _crosses(subs[0], min_length):
            out[i] = "checkpoint"
        if holds or dep:
            depends.update(eqn.outvars)
    return out


def flatten(closed: Any, args: Sequence[Any], min_length: int) -> tuple[Any, tuple[str, ...]]:
    """``closed`` re-traced on ``args`` with the calls between long scans and their readouts
    inlined, and a note per inlined checkpoint; ``closed`` itself when there is none."""
    if not _needs(closed.jaxpr, [False] * len(closed.jaxpr.invars), min_length):
        return closed, ()
    notes: list[str] = []

    def run(*flat: Any) -> list[Any]:
        return _inline(closed.jaxpr, closed.consts, flat, [False] * len(flat), min_length, notes)

    return jax.make_jaxpr(run)(*args), tuple(dict.fromkeys(notes))


def _needs(jaxpr: Any, depends_in: Sequence[bool], min_length: int) -> bool:
    return bool(_decide(jaxpr, depends_in, min_length))


def _inline(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], depends_in: Sequence[bool],
            min_length: int, notes: list[str], caller: Any = None) -> list[Any]:
    """``jaxpr`` evaluated with ``_decide``'s calls inlined; an inlined equation whose own
    traceback has no user frame (a library's jitted helper) takes its ``caller``'s."""
    decide = _decide(jaxpr, depends_in, min_length)
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    depends = {v for v, d in zip(jaxpr.invars, depends_in, strict=True) if d}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, ji.Literal) else env[v]

    for i, eqn in enumerate(jaxpr.eqns):
        invals = [read(v) for v in eqn.invars]
        dep = [isinstance(v, ji.Var) and v in depends for v in eqn.invars]
        kind = decide.get(i)
        where = eqn if caller is None or ji.has_user_frame(eqn) else caller
        with ji.source_context(where):
            if kind == "jit":
                body = eqn.params[ji.JIT_BODY]
                outs = _inline(body.jaxpr, body.consts, invals, dep, min_length, notes, where)
            elif kind == "checkpoint":
                notes.append(f"the jax.checkpoint (nn.remat) at {ji.user_location(eqn)} is "
                             "inlined so that the readout after its scan can move into the "
                             "scan (the schedule decides what the scan stores; fuse=False "
                             "keeps the checkpoint)")
                outs = _inline(eqn.params[ji.REMAT_BODY], (), invals, dep, min_length, notes,
                               where)
            else:
                outs = ji.bind(eqn, invals, where)
        if kind or any(dep) or _long(eqn, min_length):
            depends.update(eqn.outvars)
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]
