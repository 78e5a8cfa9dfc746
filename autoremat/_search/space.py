"""What the search can choose: an Optuna trial -> a ``Schedule``.

The space, for a sequence of length ``T``: first ``kind``, one of the kinds
of ``autoremat._schedules.KINDS``; then that kind's own parameters
(``Schedule.suggest``, documented in each kind's module: the nested kind's
depth, chunk lengths, policies and unroll; the binomial kind's snapshots).
A study leaves out the choices its probe refused (``refused``: categorical
values, e.g. ``offload_dots``; ``autoremat._search.probe``): no candidate uses them.

On a GPU (``CUDA_PLATFORMS``) every schedule also takes a ``compiler`` choice
(``COMPILER_CHOICES``): the XLA options its step is compiled with
(``Schedule.compiler_options``) -- by default none, or command buffers (CUDA
graphs) that also capture ``while`` loops and conditionals, so a scan's
iterations are not launched one kernel at a time from the host
(``docs/tuning.md`` has the sources). Seeds take the default; the search
finds out, by timing, whether the other helps this problem. On any other
platform the space is as it was.

``seed_params`` gives the obvious candidates, enqueued before the planner's picks:
each kind's ``Schedule.seed_params``, kind by kind (e.g. plain scan,
per-step remat, the sqrt(T) and cube-root schedules of Chen et al. 2016,
and the binomial schedule with three repetitions).

Where fusing the readout into the step is a choice (``Problem.fuse_choice``),
every schedule also takes ``fuse`` (``FUSE_CHOICES``; ``Schedule.fuse``).

``propose`` and ``neighbours`` draw candidates from the same space for the
planner's pool (``ParamTrial`` stands in for a trial; nothing is sampled by
Optuna): random schedules, and schedules one parameter away from the best so far.
"""

from __future__ import annotations

import math
import random
from typing import Any, Final

from autoremat._schedules import KINDS, plain
from autoremat._schedules.base import Check, Schedule
from autoremat._schedules.platforms import CUDA_PLATFORMS

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
#: The ``fuse`` choice's labels (``Schedule.fuse``), for a problem where it is one.
FUSE_CHOICES: Final = {"fused": True, "unfused": False}


def suggest(trial: Any, seq_len: int, platform: str = "cpu",
            refused: frozenset[str] = frozenset(), fuse: bool = False) -> Schedule:
    """Sample a schedule for a length-``seq_len`` scan from an Optuna trial; no
    categorical choice in ``refused`` is ever offered to the trial. ``fuse``: fusing
    the readout into the step is a choice (``Problem.fuse_choice``): ``fuse`` too."""
    if refused:
        trial = _Without(trial, refused)
    kind = trial.suggest_categorical("kind", list(KINDS))
    schedule = KINDS[kind].suggest(trial, seq_len, platform)
    if fuse:
        schedule = schedule.with_fuse(
            FUSE_CHOICES[trial.suggest_categorical("fuse", list(FUSE_CHOICES))])
    if platform not in CUDA_PLATFORMS:
        return schedule
    label = trial.suggest_categorical("compiler", list(COMPILER_CHOICES))
    return schedule.with_options(**COMPILER_CHOICES[label])


def checks(seq_len: int, platform: str) -> dict[str, Check]:
    """The space's own choices to probe before a study offers them
    (``autoremat._search.probe``): on a GPU, each non-default ``compiler`` choice on a
    plain scan (its option names and values must exist in this XLA, and it must not
    change the results)."""
    if platform not in CUDA_PLATFORMS:
        return {}
    reference = plain(seq_len)
    return {label: Check(reference.with_options(**options))
            for label, options in COMPILER_CHOICES.items() if options}


class _Without:
    """An Optuna trial (or ``ParamTrial``) whose categorical choices lack ``refused``."""

    def __init__(self, trial: Any, refused: frozenset[str]) -> None:
        self.trial, self.refused = trial, refused

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        kept = [c for c in choices if not (isinstance(c, str) and c in self.refused)]
        return self.trial.suggest_categorical(name, kept or list(choices))

    def suggest_int(self, name: str, low: int, high: int, *, log: bool = False) -> int:
        return int(self.trial.suggest_int(name, low, high, log=log))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.trial, name)


def seed_params(seq_len: int, platform: str = "cpu", refused: frozenset[str] = frozenset(),
                fuse: bool = False) -> list[dict[str, Any]]:
    """Trial parameters of the obvious candidates, kind by kind, in the order to try
    them (each kind's ``seed_params`` on ``platform``), none using a ``refused`` choice.
    ``fuse`` (a choice): each seed fused (less memory; faster on a CPU) and, off a CPU,
    each nested seed of two levels or more unfused too (on a TPU unfused ran faster at
    the same memory: ``docs/tuning.md``)."""
    compiler = {"compiler": DEFAULT_COMPILER} if platform in CUDA_PLATFORMS else {}
    seeds = [{"kind": name, **p, **compiler} for name, kind in KINDS.items()
             for p in kind.seed_params(seq_len, platform)
             if not any(isinstance(v, str) and v in refused for v in p.values())]
    if not fuse:
        return seeds
    unfused = [{**p, "fuse": "unfused"} for p in seeds
               if platform != "cpu" and p["kind"] == "nested" and p.get("depth", 1) >= 2]
    return [{**p, "fuse": "fused"} for p in seeds] + unfused


def seed_schedules(seq_len: int, platform: str = "cpu", fuse: bool = False) -> list[Schedule]:
    """The schedules of ``seed_params`` (what the first trials will measure)."""
    import optuna

    return [suggest(optuna.trial.FixedTrial(p), seq_len, platform, fuse=fuse)
            for p in seed_params(seq_len, platform, fuse=fuse)]


class ParamTrial:
    """Stands in for an Optuna trial in ``suggest``: each value from ``wanted``
    (clipped into its range), the rest drawn at random from ``rng``.

    ``params`` is what was chosen (the planner keeps it with the candidate);
    ``space`` each parameter's range or choices.
    """

    def __init__(self, wanted: dict[str, Any], rng: random.Random) -> None:
        self.wanted, self.rng = wanted, rng
        self.params: dict[str, Any] = {}
        self.space: dict[str, tuple[int, int] | list[Any]] = {}

    def suggest_int(self, name: str, low: int, high: int, *, log: bool = False) -> int:
        value = self.wanted.get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            value = (round(math.exp(self.rng.uniform(math.log(low), math.log(high)))) if log
                     else self.rng.randint(low, high))
        value = min(max(value, low), high)
        self.params[name], self.space[name] = value, (low, high)
        return value

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        value = self.wanted.get(name)
        if value not in choices:
            value = self.rng.choice(choices)
        self.params[name], self.space[name] = value, list(choices)
        return value


def propose(wanted: dict[str, Any], seq_len: int, platform: str, rng: random.Random,
            refused: frozenset[str] = frozenset(),
            fuse: bool = False) -> tuple[Schedule, dict[str, Any], ParamTrial]:
    """The schedule of ``wanted`` (missing values random, ``refused`` choices
    replaced), its exact params, the trial."""
    trial = ParamTrial(wanted, rng)
    schedule = suggest(trial, seq_len, platform, refused, fuse)
    return schedule, trial.params, trial


def neighbours(params: dict[str, Any], seq_len: int, platform: str, rng: random.Random,
               refused: frozenset[str] = frozenset(),
               fuse: bool = False) -> list[tuple[Schedule, dict[str, Any]]]:
    """Schedules one parameter away from ``params``: each length scaled by 1/2..2,
    each choice swapped for every other, or for the choice before or after it in
    the kind's ``Schedule.ORDERED`` parameters (e.g. the nested depth)."""
    _, _, trial = propose(params, seq_len, platform, rng, refused, fuse)
    ordered = KINDS[trial.params["kind"]].ORDERED
    out = []
    for name, space in trial.space.items():
        if isinstance(space, tuple):
            values: list[Any] = [round(params[name] * f) for f in (0.5, 0.7, 1.4, 2.0)]
        elif name in ordered:
            i = space.index(params[name])
            values = space[max(0, i - 1):i] + space[i + 1:i + 2]
        else:
            values = [c for c in space if c != params[name]]
        for v in values:
            schedule, p, _ = propose({**params, name: v}, seq_len, platform, rng, refused, fuse)
            out.append((schedule, p))
    return out
