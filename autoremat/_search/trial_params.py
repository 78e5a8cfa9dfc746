"""Each trial's schedule as Optuna params, so Optuna's own tools see what was measured:
optuna-dashboard's parameter, slice and importance views, ``optuna.importance``,
``study.trials_dataframe()``.

The schedule itself lives in the trial's user attrs (``attrs.SCHEDULE``), which the search
reads; the params are a view of it, written once the trial has claimed its schedule, and
read by nothing in autoremat (measuring and resuming are as without them). Every param has
the same distribution in every trial of a study -- Optuna's importance reads only those --
so the names and distributions are fixed by the study's ``T``, not by the trial:

* ``kind``: one of the registered kinds;
* each whole number of the schedule's YAML form, named by its path (``levels[0].length``,
  ``unroll``, ``snapshots``): an integer in ``1..T`` on a log scale;
* each policy, named by its field (``levels[1].policy``): its ``jax.checkpoint_policies``
  name (the names it keeps are in the schedule, not here);
* ``fuse``, where the search chose it: ``True`` or ``False``;
* two figures of the schedule on its length, the same for every kind: ``stored_carries``
  (the most carries it keeps at once, ``0..T``) and ``recompute`` (step evaluations per
  step, ``1..64``): the memory/time trade-off as the carry model counts it.

A value outside its distribution is left out (Optuna could not record it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from autoremat._schedules import KINDS
from autoremat._schedules.base import Schedule
from autoremat._schedules.policy import ALL_POLICY_NAMES
from autoremat.bounds import cost

#: The most step evaluations per step ``recompute`` can record.
MAX_RECOMPUTE: Final = 64.0
#: The schedule's YAML keys that are not its structure.
_SKIPPED: Final = ("version", "kind", "meta", "compiler_options")


@dataclass(frozen=True)
class ParamSpec:
    """One param: its value and its distribution, as Optuna's constructor arguments.

    Attributes:
      value: the param's value.
      choices: a categorical's choices (empty: a number).
      low, high, log: a number's range; ``integer``: whole numbers.
    """

    value: Any
    choices: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    integer: bool = True

    def distribution(self) -> Any:
        """The Optuna distribution."""
        import optuna

        if self.choices:
            return optuna.distributions.CategoricalDistribution(self.choices)
        if self.integer:
            return optuna.distributions.IntDistribution(int(self.low), int(self.high),
                                                        log=self.log)
        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log)

    def holds(self) -> bool:
        """The value lies within the distribution."""
        if self.choices:
            return self.value in self.choices
        return isinstance(self.value, (int, float)) and self.low <= self.value <= self.high


def schedule_params(schedule: Schedule, seq_len: int) -> dict[str, ParamSpec]:
    """The params of ``schedule`` on a length-``seq_len`` scan (module doc)."""
    top = max(1, seq_len)
    out: dict[str, ParamSpec] = {"kind": ParamSpec(schedule.kind, tuple(KINDS))}
    for path, value in _leaves(schedule.to_data(), ""):
        if isinstance(value, bool):
            out[path] = ParamSpec(value, (False, True))
        elif isinstance(value, int):
            out[path] = ParamSpec(value, low=1, high=top, log=True)
    for field, policy in schedule.policies():
        out[field] = ParamSpec(policy.name, ALL_POLICY_NAMES)
    figures = cost(schedule, top)
    out["stored_carries"] = ParamSpec(figures.stored_carries, low=0, high=top)
    out["recompute"] = ParamSpec(figures.recompute_factor, low=1.0, high=MAX_RECOMPUTE,
                                 integer=False)
    return {name: spec for name, spec in out.items() if spec.holds()}


def _leaves(data: Any, path: str) -> Iterator[tuple[str, Any]]:
    """The scalar leaves of a schedule's YAML form by path, its policies left out
    (``Schedule.policies`` names them)."""
    if isinstance(data, dict):
        for key, value in data.items():
            if (not path and key in _SKIPPED) or key == "policy" or key == "policies":
                continue
            yield from _leaves(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _leaves(value, f"{path}[{i}]")
    else:
        yield path, data
