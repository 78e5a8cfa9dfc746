"""Named policies: policies over the problem's own ``checkpoint_name`` tags, for the search.

A model that tags its values (MaxText's ``query_proj``, ``mlpwo``, ...) is
rematerialized by hand with presets over those tags. A study of such a problem
finds the tags in its traced step (``autoremat._scan.checkpoint_names``) and
offers, per level, beside the fixed policies (``autoremat._schedules.nested_space``):

* ``save_only_these_names`` of the tags that are dearest to recompute per byte
  kept (``TaggedValue.flops_per_byte``), a chain of ``SUBSETS`` growing prefixes
  of that ranking (a third, two thirds, all: not the power set);
* ``save_anything_except_these_names`` of the cheapest tags (a third, two
  thirds): everything kept but those;
* where offload is offered (GPU, TPU; each choice probed before the study offers
  it, ``autoremat._search.probes.probe``), ``save_and_offload_only_these_names``
  moving the same prefixes to host memory;
* MaxText's ``remat_policy`` presets (``maxtext_names.SEARCHED``, and where offload is
  offered ``SEARCHED_OFFLOADED``) that save or offload one of the step's tags, under
  MaxText's names (``save_qkv_proj``, ``minimal``, ...), each over the tags the step has
  (``maxtext_names.presets_over``: what the preset does on this model): what a user of
  such a model would pick by hand, tried first on a layer stack
  (``autoremat._search.planning.presets``).

The trade-off: the ranking is an estimate from the trace (bytes and matmul
FLOPs), which keeps the space small -- a few choices per level -- and the
search's measurements decide among them; a subset outside the chains is not
offered (write it in a schedule by hand). Labels name the tags, so a study's
trials read as what they keep.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from autoremat._schedules import maxtext_names
from autoremat._schedules.maxtext_names import SEARCHED, SEARCHED_OFFLOADED
from autoremat._schedules.platforms import OFFLOAD_PLATFORMS
from autoremat._schedules.policy import Policy, offload_names

if TYPE_CHECKING:
    from autoremat._scan.checkpoint_names import StepCosts, TaggedValue

#: Fractions of the ranked tags each family offers (rounded up, duplicates dropped).
SUBSETS: Final = (1 / 3, 2 / 3, 1.0)
#: Labels longer than this list the first tags and a count.
_LABEL_NAMES: Final = 4


def step_costs(step: Any, args: tuple[Any, ...], seq_len: int) -> StepCosts | None:
    """What the step inside ``step(*args)``'s scans of ``seq_len`` steps computes and
    keeps (``checkpoint_names.StepCosts``: its tags, matmul FLOPs and outputs), from one
    abstract trace (nothing is compiled or run); ``None`` when it has no such scan or
    the trace fails (the search's first compile then says why)."""
    import jax

    from autoremat._scan.checkpoint_names import scanned_costs

    try:
        traced = jax.make_jaxpr(step)(*args)
    except Exception:  # the step's own compile reports it, with the tuner's message
        return None
    return scanned_costs(traced.jaxpr, seq_len)


def scanned_tags(step: Any, args: tuple[Any, ...], seq_len: int) -> dict[str, TaggedValue]:
    """The tags (``TaggedValue`` by name) inside the step's scans of ``seq_len`` steps
    (``step_costs``); none when it has none."""
    costs = step_costs(step, args, seq_len)
    return {} if costs is None else costs.tags


def name_policies(tags: Mapping[str, Any], offload: bool) -> dict[str, Policy]:
    """The choices of the module docstring for these tags: label -> policy."""
    ranked = sorted(tags.values(), key=lambda t: (-t.flops_per_byte, t.name))
    names = [t.name for t in ranked]
    counts = sorted({max(1, math.ceil(f * len(names))) for f in SUBSETS})
    out: dict[str, Policy] = {}
    for k in counts:
        out[_label("save", names[:k])] = Policy("save_only_these_names", args=tuple(names[:k]))
    for k in counts:
        if k < len(names):
            cheap = names[len(names) - k:]
            out[_label("all_but", cheap)] = Policy("save_anything_except_these_names",
                                                   args=tuple(cheap))
    if offload:
        for k in counts:
            out[_label("offload", names[:k])] = offload_names(names[:k])
    for label, (kept, _) in maxtext_names.presets_over(set(names), SEARCHED).items():
        out[label] = Policy("save_only_these_names", args=kept)
    if offload:
        for label, (_, moved) in maxtext_names.presets_over(set(names),
                                                            SEARCHED_OFFLOADED).items():
            out[label] = offload_names(moved)
    return out


def named_policies(tags: Mapping[str, Any], platform: str) -> dict[str, Policy]:
    """``name_policies`` of a step's tags (none when it has none), offloading ones where
    the platform offers offload: the ``named`` input of the search space
    (``autoremat._search.space``)."""
    return name_policies(tags, platform in OFFLOAD_PLATFORMS) if tags else {}


def _label(family: str, names: list[str]) -> str:
    shown = names if len(names) <= _LABEL_NAMES else [*names[:_LABEL_NAMES - 1],
                                                      f"+{len(names) - _LABEL_NAMES + 1}"]
    return f"{family}({','.join(shown)})"
