"""What the search can choose: a schedule as a choice of parameters (``Param``).

The space, for a sequence of length ``T``: first ``kind``, one of the kinds
of ``autoremat._schedules.KINDS``; then that kind's own parameters
(``Schedule.parameters``, documented in each kind's module: the nested kind's
depth, chunk lengths, policies and unroll; the binomial kind's snapshots).
``parameters`` lists them, ``build`` makes the schedule of a choice of them
(``Schedule.from_params``). A study leaves out the choices its probe refused
(``refused``: categorical values, e.g. ``offload_dots``;
``autoremat._search.probes.probe``): no candidate uses them.

On a GPU (``CUDA_PLATFORMS``) every schedule also takes a ``compiler`` choice
(``COMPILER_CHOICES``): the XLA options its step is compiled with
(``Schedule.compiler_options``) -- by default none, or command buffers (CUDA
graphs) that also capture ``while`` loops and conditionals, so a scan's
iterations are not launched one kernel at a time from the host
(``docs/tuning.md`` has the sources). Seeds take the default; the search
finds out, by timing, whether the other helps this problem. On any other
platform the space is as it was.

``seeds`` gives the obvious candidates, enqueued in the study before the planner's picks:
each kind's ``Schedule.seed_params``, kind by kind (e.g. plain scan,
per-step remat, the sqrt(T) and cube-root schedules of Chen et al. 2016,
and the binomial schedule with three repetitions).

Where fusing the readout into the step is a choice (``Problem.fuse_choice``),
every schedule also takes ``fuse`` (``FUSE_CHOICES``; ``Schedule.fuse``).

A problem that tags its values (``checkpoint_name``) also gets policies over those
tags (``named``: ``autoremat._search.named_policies``), passed to every function here
like ``refused`` and ``fuse``.

``propose`` and ``neighbours`` give the planner's pool its candidates from the same
space, a parameter at a time (``unchosen``): random schedules, and schedules one
parameter away from the best so far.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

from autoremat._schedules import KINDS, plain
from autoremat._schedules.base import NO_NAMES, Check, Param, Schedule
from autoremat._schedules.platforms import CUDA_PLATFORMS
from autoremat._schedules.policy import Policy

#: XLA:GPU's default command-buffer types (openxla/xla ``debug_options_flags.cc``,
#: 2025-26: FUSION, CUBLAS, CUBLASLT, CUSTOM_CALL, CUDNN, DYNAMIC_SLICE_FUSION), plus
#: the two that put control flow on the device: WHILE and CONDITIONAL (CUDA graph
#: conditional nodes, openxla/xla 6973; separate types since openxla/xla 19528).
#: Setting the option replaces the whole list, so the defaults are named too.
GRAPH_TYPES: Final = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,CONDITIONAL,WHILE"
#: ``compiler`` label -> ``Schedule.compiler_options``. ``graph_loops``: command
#: buffers that capture loops, from one command up (default 5: a small step's loop
#: body would stay outside).
COMPILER_CHOICES: Final[dict[str, dict[str, bool | int | float | str]]] = {
    "default": {},
    "graph_loops": {"xla_gpu_enable_command_buffer": GRAPH_TYPES,
                    "xla_gpu_graph_min_graph_size": 1},
}
DEFAULT_COMPILER: Final = "default"
#: Policies over a problem's own ``checkpoint_name`` tags, label -> policy
#: (``autoremat._search.named_policies``), offered by the kinds beside their own.
Named = Mapping[str, Policy]
#: The ``fuse`` choice's labels (``Schedule.fuse``), for a problem where it is one.
FUSE_CHOICES: Final = {"fused": True, "unfused": False}


def checks(seq_len: int, platform: str) -> dict[str, Check]:
    """The space's own choices to probe before a study offers them
    (``autoremat._search.probes.probe``): on a GPU, each non-default ``compiler`` choice on a
    plain scan (its option names and values must exist in this XLA, and it must not
    change the results)."""
    if platform not in CUDA_PLATFORMS:
        return {}
    reference = plain(seq_len)
    return {label: Check(reference.with_options(**options))
            for label, options in COMPILER_CHOICES.items() if options}


def parameters(chosen: Mapping[str, Any], seq_len: int, platform: str,
               refused: frozenset[str] = frozenset(), fuse: bool = False,
               named: Named = NO_NAMES) -> list[Param]:
    """The space's parameters in the order they are chosen, as far as ``chosen`` fixes
    them: ``kind``; the kind's own (``Schedule.parameters``, offered the ``named``
    policies); once those are all chosen, ``fuse`` where it is a choice and ``compiler``
    on a GPU. No categorical choice in ``refused`` is offered (unless it is all there
    is)."""
    out = [Param("kind", tuple(k for k, c in KINDS.items() if c.searched(seq_len)))]
    kind = chosen.get("kind")
    if kind in KINDS:
        out += KINDS[kind].parameters(seq_len, platform, chosen, named)
        if all(p.name in chosen for p in out):
            if fuse:
                out.append(Param("fuse", tuple(FUSE_CHOICES)))
            if platform in CUDA_PLATFORMS:
                out.append(Param("compiler", tuple(COMPILER_CHOICES)))
    return [_offered(p, refused) for p in out]


def unchosen(chosen: Mapping[str, Any], seq_len: int, platform: str,
             refused: frozenset[str] = frozenset(), fuse: bool = False,
             named: Named = NO_NAMES) -> list[Param]:
    """Those of ``parameters`` not in ``chosen``, to choose in order (each one's range
    is fixed by the values chosen before it); none: the choice is complete."""
    return [p for p in parameters(chosen, seq_len, platform, refused, fuse, named)
            if p.name not in chosen]


def _offered(param: Param, refused: frozenset[str]) -> Param:
    """``param`` without the ``refused`` choices (all of them, where none is left)."""
    if not refused:
        return param
    kept = tuple(c for c in param.choices if not (isinstance(c, str) and c in refused))
    return replace(param, choices=kept) if kept and len(kept) < len(param.choices) else param


def build(params: Mapping[str, Any], seq_len: int, platform: str,
          named: Named = NO_NAMES) -> Schedule:
    """The schedule of a complete choice of ``parameters`` (``Schedule.from_params``)."""
    schedule = KINDS[params["kind"]].from_params(params, seq_len, platform, named)
    if "fuse" in params:
        schedule = schedule.with_fuse(FUSE_CHOICES[params["fuse"]])
    if platform not in CUDA_PLATFORMS:
        return schedule
    return schedule.with_options(**COMPILER_CHOICES[params["compiler"]])


def seeds(seq_len: int, platform: str = "cpu", refused: frozenset[str] = frozenset(),
          fuse: bool = False, layer_stack: bool = False) -> list[tuple[Schedule, dict[str, Any]]]:
    """The obvious candidates and their params, kind by kind, in the order to try them
    (each kind's ``seed_params`` on ``platform``), none using a ``refused`` choice; of a
    ``layer_stack`` (``autoremat._search.planning.presets``), remat of each layer alone.
    ``fuse`` (a choice): each seed fused (less memory; faster on a CPU) and, off a CPU,
    the first nested seed of two levels or more and no unroll (sqrt(T)'s) unfused too,
    right before its fused twin (on a TPU unfused ran faster at the same memory:
    ``docs/tuning.md``; the time model learns the difference from that pair, and the
    neighbours of an unfused best are unfused: each further unfused seed would cost a trial
    that was never the pick). There it is compiled in the first round and an unfused
    leader's unrolls compile while the last seeds are timed (timed last, the device waited
    for them); timed second, before any best it could be cut against, a slow one was timed
    in full (``studies/results/tune_time_v5e_workers.md``)."""
    compiler = {"compiler": DEFAULT_COMPILER} if platform in CUDA_PLATFORMS else {}
    params = [{"kind": name, **p, **compiler} for name, kind in KINDS.items()
              for p in kind.seed_params(seq_len, platform)
              if not any(isinstance(v, str) and v in refused for v in p.values())]
    if layer_stack:
        params = [{"kind": "nested", "depth": 1, "d1_policy": "nothing", "d1_unroll": 1,
                   **compiler}]
    if fuse:
        twin = next((p for p in params if platform != "cpu" and p["kind"] == "nested"
                     and p.get("depth", 1) >= 2 and p[f"d{p['depth']}_unroll"] == 1), None)
        params = [q for p in params for q in (
            [{**p, "fuse": "unfused"}] if p is twin else []) + [{**p, "fuse": "fused"}]]
    return [(build(p, seq_len, platform), p) for p in params]


def propose(wanted: Mapping[str, Any], seq_len: int, platform: str, rng: random.Random,
            refused: frozenset[str] = frozenset(), fuse: bool = False,
            named: Named = NO_NAMES) -> tuple[Schedule, dict[str, Any]]:
    """The schedule of ``wanted`` and its params: each parameter takes its value from
    ``wanted`` (an integer clipped into its range), or a random one from ``rng`` where
    ``wanted`` has none that is offered."""
    chosen: dict[str, Any] = {}
    while todo := unchosen(chosen, seq_len, platform, refused, fuse, named):
        for param in todo:
            value = wanted.get(param.name)
            if param.choices:
                chosen[param.name] = value if value in param.choices else rng.choice(param.choices)
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                value = (round(math.exp(rng.uniform(math.log(param.low), math.log(param.high))))
                         if param.log else rng.randint(param.low, param.high))
            chosen[param.name] = min(max(value, param.low), param.high)
    return build(chosen, seq_len, platform, named), chosen


def neighbours(params: dict[str, Any], seq_len: int, platform: str, rng: random.Random,
               refused: frozenset[str] = frozenset(), fuse: bool = False,
               named: Named = NO_NAMES) -> list[tuple[Schedule, dict[str, Any]]]:
    """Schedules one parameter away from ``params``: each length scaled by 1/2..2,
    each choice swapped for every other, or, of an ``ordered`` parameter (e.g. the
    nested depth), for the choice before or after it; and the kind's ``tied_moves``."""
    chosen = propose(params, seq_len, platform, rng, refused, fuse, named)[1]
    out = []
    for param in parameters(chosen, seq_len, platform, refused, fuse, named):
        value = params[param.name]
        if not param.choices:
            values: list[Any] = [round(value * f) for f in (0.5, 0.7, 1.4, 2.0)]
        elif param.ordered:
            i = param.choices.index(value)
            values = [*param.choices[max(0, i - 1):i], *param.choices[i + 1:i + 2]]
        else:
            values = [c for c in param.choices if c != value]
        out += [propose({**params, param.name: v}, seq_len, platform, rng, refused, fuse, named)
                for v in values]
    kind = KINDS.get(str(params.get("kind")))
    tied = kind.tied_moves(params) if kind is not None else []
    return out + [propose(p, seq_len, platform, rng, refused, fuse, named) for p in tied]
