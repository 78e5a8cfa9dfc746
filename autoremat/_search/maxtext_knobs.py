"""Tune a MaxText model by its own remat knobs: each candidate a MaxText config, measured.

A MaxText user's answer is MaxText's config: ``remat_policy`` and, for ``custom``, one
key per tagged tensor (``device`` / ``offload`` / ``remat``), and ``scan_layers``. So the
candidates here are exactly those settings (``knobs``): ``full``; MaxText's own presets
over the tensors the model tags (``maxtext_names.presets_over``); the chains of the
tags dearest to recompute per byte kept, saved and, where the platform offloads,
offloaded (``named_policies.name_policies``: a third, two thirds, all of them); each
written as ``remat_policy: custom`` keys, duplicates (two settings that say the same
keys) measured once. Each is compiled and run as MaxText's own train step
(``autoremat._models.maxtext``) with ``autoremat.measure``; the pick is the fastest
within the budget, and then the same keys with ``scan_layers`` flipped are measured
too (unrolled layers: more compile, sometimes a faster step). The trade-off: every
candidate is a full compile of MaxText's step (tens of seconds on a CPU), so the
list is short -- about a dozen -- and nothing is predicted: the measurements decide.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autoremat._measure.measure import measure
from autoremat._measure.measurement import Measurement
from autoremat._schedules import maxtext_names
from autoremat._schedules.nested import NestedSchedule
from autoremat._schedules.platforms import OFFLOAD_PLATFORMS
from autoremat._schedules.policy import Policy, offload_names
from autoremat._search.named_policies import name_policies

if TYPE_CHECKING:
    from autoremat._models.maxtext import MaxTextModel


@dataclass(frozen=True)
class Knob:
    """One MaxText setting: a label, the schedule it is (one policy on every layer), the
    ``key=value`` overrides that say it, and ``scan_layers``."""

    label: str
    schedule: NestedSchedule
    overrides: tuple[str, ...]
    scan_layers: bool = True

    @property
    def config(self) -> tuple[str, ...]:
        """The overrides with ``scan_layers``."""
        return (*self.overrides, f"scan_layers={str(self.scan_layers).lower()}")


@dataclass(frozen=True)
class Tried:
    """A knob and its measurement."""

    knob: Knob
    measurement: Measurement


@dataclass(frozen=True)
class MaxTextTune:
    """What ``tune_maxtext`` measured and picked.

    Attributes:
      overrides: the model's own overrides.
      budget_bytes: the memory budget per device.
      tried: every knob measured, in order.
      pick: the fastest within the budget (``None``: none fits).
    """

    overrides: tuple[str, ...]
    budget_bytes: int
    tried: tuple[Tried, ...]
    pick: Tried | None


def knobs(model: MaxTextModel, platform: str) -> list[Knob]:
    """The candidates of the module docstring, in order, each distinct setting once."""
    from autoremat._models.maxtext import config_overrides

    layers = model.layers
    policies: dict[str, Policy] = {"full": Policy("nothing_saveable")}
    offload = platform in OFFLOAD_PLATFORMS
    tags = set(model.tags)
    labels = maxtext_names.SEARCHED + (maxtext_names.SEARCHED_OFFLOADED if offload else ())
    for label, (saved, moved) in maxtext_names.presets_over(tags, labels).items():
        policies[label] = offload_names(list(moved)) if moved else Policy(
            "save_only_these_names", args=saved)
    named = {k: p for k, p in name_policies(model.costs, offload).items()
             if p.name in ("save_only_these_names", "save_and_offload_only_these_names")}
    policies.update({k: p for k, p in named.items() if k not in policies})
    out: dict[tuple[str, ...], Knob] = {}
    for label, policy in policies.items():
        schedule = NestedSchedule.build([layers], [policy])
        overrides = tuple(config_overrides(schedule, model.tags))
        out.setdefault(overrides, Knob(label, schedule, overrides))
    return list(out.values())


def tune_maxtext(model: MaxTextModel, budget_bytes: int, *, platform: str = "",
                 limit: int | None = None, time_budget: float = 2.0,
                 on_tried: Callable[[Tried], None] | None = None) -> MaxTextTune:
    """Measure ``knobs`` (the first ``limit``) as MaxText's train step, then the pick's
    keys with ``scan_layers`` flipped; the fastest within ``budget_bytes``."""
    import jax

    found = knobs(model, platform or jax.default_backend())
    tried: list[Tried] = []

    def run(knob: Knob) -> None:
        m = measure(model.problem(scan_layers=knob.scan_layers), knob.schedule,
                    budget_bytes=budget_bytes, time_budget=time_budget)
        tried.append(Tried(knob, m))
        if on_tried is not None:
            on_tried(tried[-1])

    for knob in found[:limit] if limit is not None else found:
        run(knob)
    pick = fastest(tried, budget_bytes)
    scan = model.scan_layers
    if pick is not None:
        run(replace(pick.knob, scan_layers=not scan, label=f"{pick.knob.label}, "
                    f"scan_layers={str(not scan).lower()}"))
    return MaxTextTune(model.overrides, budget_bytes, tuple(tried), fastest(tried, budget_bytes))


def fastest(tried: Sequence[Tried], budget_bytes: int) -> Tried | None:
    """The fastest timed knob within the budget (ties: less memory), or ``None``."""
    fits = [t for t in tried if t.measurement.step_seconds is not None
            and t.measurement.fits(budget_bytes)]
    return min(fits, key=lambda t: (t.measurement.step_seconds or 0.0,
                                    t.measurement.fit_bytes or 0), default=None)


def config_lines(knob: Knob) -> list[str]:
    """The knob as MaxText YAML config lines (``key: value``)."""
    return [line.replace("=", ": ", 1) for line in knob.config]


def as_data(result: MaxTextTune) -> dict[str, Any]:
    """The tune as plain data (its file)."""
    def row(t: Tried) -> dict[str, Any]:
        m = t.measurement
        return {"label": t.knob.label, "config": list(t.knob.config), "status": m.status,
                "reason": m.reason, "total_bytes": m.total_bytes, "fit_bytes": m.fit_bytes,
                "step_seconds": m.step_seconds}

    return {"overrides": list(result.overrides), "budget_bytes": result.budget_bytes,
            "pick": row(result.pick) if result.pick else None,
            "tried": [row(t) for t in result.tried]}
