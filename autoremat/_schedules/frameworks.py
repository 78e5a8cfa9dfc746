"""A schedule in the user's framework: MaxText's ``remat_policy: custom`` and Flax's remat.

MaxText, Flax (``nn.remat`` / ``nnx.remat`` inside ``nn.scan`` / ``nnx.scan``) and most
layer-stack code give every layer of the stack one ``jax.checkpoint`` policy. A schedule
says the same when it is the nested kind with one level (``24 save(attention_out,mlpwo)``:
each of the 24 steps under that policy) or groups that all share one policy. Anything
else -- several levels (chunks of layers), groups with different policies, binomial --
has no such form; ``framework_policy`` says why (``why_not``), and the study side
(``autoremat._search.export_forms``) finds the nearest schedule that has one.

MaxText (``configs/base.yml``): ``remat_policy: custom`` reads one key per name it knows
(``MAXTEXT_NAMES``: the pinned reading of MaxText's source, ``maxtext_names``), each
``device`` (saved), ``offload`` (moved to host memory) or ``remat`` (recomputed), and
builds ``save_and_offload_only_these_names(names_which_can_be_saved=<device>,
names_which_can_be_offloaded=<offload>, offload_src="device", offload_dst="pinned_host")``.
So it expresses exactly the policies over names that keep or offload them to pinned host
memory, and ``nothing_saveable`` (every name ``remat``); one that keeps what is not named
(``save_anything_except_these_names``) or no remat at all has no ``custom`` form, and a
policy by kind of value (the dots policies) has one only where the step says which of
its tags are exactly what that policy keeps (``dots``: every matmul output it keeps is
one tagged value). A name the problem tags that MaxText's custom policy does not read is
flagged (``unknown``): MaxText cannot save it. A block that does to the problem's names
what one of MaxText's presets does (its name list restricted to them: ``minimal`` on a
model without ``kv_proj``) is named as that preset (``maxtext_preset``).
``decoder_layer_input`` is never ``remat`` in MaxText (base.yml: it is the layers' remat
start point); a pick that recomputes it gets ``device`` with a note: it tags the layer's
input, which remat of each layer keeps anyway (``jax.checkpoint`` saves its arguments):
the built-in stack compiles to the same total either way (``tests/test_export.py``).

Flax: every one-policy-per-layer pick is a ``policy=`` argument
(``flax_policy``: the ``jax.checkpoint_policies`` call as Python source), or no remat at
all (``policy`` ``none``). Pure Python: nothing here imports jax.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from autoremat._schedules import maxtext_names
from autoremat._schedules.base import Schedule
from autoremat._schedules.groups import GroupsSchedule
from autoremat._schedules.nested import NestedSchedule
from autoremat._schedules.policy import NO_REMAT, Policy, _as_names

#: The names MaxText's ``remat_policy: custom`` reads (its config keys, base.yml's order),
#: from the pinned inventory of its source (``maxtext_names``).
MAXTEXT_NAMES: Final = maxtext_names.NAMES
#: What each key may say: recomputed, saved on the device, moved to host memory.
REMAT, DEVICE, OFFLOAD = "remat", "device", "offload"
#: The one name MaxText never recomputes.
LAYER_INPUT: Final = "decoder_layer_input"
#: The dots policies by each of their names (``checkpoint_names.DOTS_POLICIES``'s), the
#: offloading one by what it keeps on the device otherwise.
_OFFLOAD_DOTS: Final = "offload_dot_with_no_batch_dims"
_DOTS: Final = {"dots_saveable": "dots_saveable", "checkpoint_dots": "dots_saveable",
                "dots_with_no_batch_dims_saveable": "dots_with_no_batch_dims_saveable",
                "checkpoint_dots_with_no_batch_dims": "dots_with_no_batch_dims_saveable",
                _OFFLOAD_DOTS: "dots_with_no_batch_dims_saveable"}
#: Where MaxText's custom policy moves what it offloads (``Policy.kwargs`` form).
_MAXTEXT_OFFLOAD: Final = {"offload_src": "device", "offload_dst": "pinned_host"}


@dataclass(frozen=True)
class FrameworkPolicy:
    """One schedule as one remat policy per layer (``framework_policy``).

    Attributes:
      schedule: the schedule, in one line (``Schedule.describe``).
      policy: the policy every layer has; ``None`` when the layers do not share one.
      why_not: why no one-policy-per-layer form exists ("" when ``policy`` is set).
      unroll: the scan's unroll (``nn.scan`` / ``nnx.scan`` ``unroll=``).
      maxtext: MaxText's ``custom`` keys, ``(name, remat|device|offload)`` in base.yml's
        order, for the names MaxText reads; empty when it has no form (``maxtext_why_not``).
      maxtext_why_not: why MaxText's ``custom`` policy cannot say it ("" when it can).
      maxtext_preset: MaxText's own preset that does what the block does to these names
        (``save_qkv_proj``, ``minimal``, ``qkv_proj_offloaded``, ``full``), or "".
      unknown: the problem's names MaxText does not read, with what the schedule does with
        each (``remat`` / ``device`` / ``offload``); MaxText cannot save or offload them.
      notes: where the MaxText block differs from the schedule (``decoder_layer_input``).
      flax_policy: the ``jax.checkpoint_policies`` call as Python source; "" for no remat
        (``policy`` ``none``) or when ``policy`` is ``None``.
    """

    schedule: str
    policy: Policy | None
    why_not: str = ""
    unroll: int = 1
    maxtext: tuple[tuple[str, str], ...] = ()
    maxtext_why_not: str = ""
    maxtext_preset: str = ""
    unknown: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    flax_policy: str = ""

    @property
    def flax_ok(self) -> bool:
        """Flax can write it: one policy on every layer."""
        return self.policy is not None

    @property
    def maxtext_ok(self) -> bool:
        """MaxText's ``remat_policy: custom`` can write it."""
        return self.policy is not None and not self.maxtext_why_not


def layer_policy(schedule: Schedule, recurrence: bool = False) -> tuple[Policy | None, str]:
    """The one policy every step of ``schedule`` has, or ``None`` and why not; the scan's
    steps are layers, or time steps where ``recurrence``."""
    steps, step = ("time steps", "time step") if recurrence else ("layers", "layer")
    if isinstance(schedule, NestedSchedule):
        if schedule.depth == 1:
            return schedule.levels[0].policy, ""
        return None, (f"{schedule.depth} nested levels remat chunks of {steps} "
                      f"({'x'.join(map(str, schedule.lengths))}), not each {step} alone")
    if isinstance(schedule, GroupsSchedule):
        policies = {g.policy for g in schedule.groups}
        if len(policies) == 1:
            return schedule.groups[0].policy, ""
        return None, f"its {len(schedule.groups)} groups of {steps} have different policies"
    return None, (f"the {schedule.kind} kind remats chunks of {steps}, not each {step} "
                  "under one policy")


def framework_policy(schedule: Schedule, names: Iterable[str] = (),
                     dots: Mapping[str, tuple[str, ...]] | None = None, *,
                     recurrence: bool = False) -> FrameworkPolicy:
    """``schedule`` as MaxText's ``remat_policy: custom`` keys and Flax's ``policy=``, or why
    it has no such form. ``names``: the step's ``checkpoint_name`` tags (a tune's
    ``TuneResult.checkpoint_names``); the policy's own names are added to them. ``dots``:
    the dots policies that keep exactly some of those tags in this problem's step (a
    study's ``dot_forms``: policy -> the tags), which then have a ``custom`` form.
    ``recurrence``: the scan runs time steps of a recurrence, not layers: the words say so.
    The form is a translation only: it runs the memory/time trade-off the schedule was
    measured at only where every step of the scan is remat under that one policy."""
    policy, why = layer_policy(schedule, recurrence)
    line = schedule.describe()
    if policy is None:
        return FrameworkPolicy(line, None, why_not=why, unroll=schedule.unroll)
    tags = tuple(dict.fromkeys([*names, *policy.names]))
    per_name, maxtext_why = _per_name(policy, tags, dots or {})
    known = tuple((n, per_name[n]) for n in MAXTEXT_NAMES if n in per_name)
    notes: list[str] = []
    if not maxtext_why and dict(known).get(LAYER_INPUT, DEVICE) == REMAT:
        notes.append(f"{LAYER_INPUT}: the schedule recomputes it; MaxText never does "
                     "(base.yml: the remat start point), so this key keeps it: the layer's "
                     "input, which remat of each layer keeps anyway")
    if not maxtext_why:
        known = tuple((n, DEVICE if n == LAYER_INPUT and v == REMAT else v)
                      for n, v in known)
    return FrameworkPolicy(
        line, policy, unroll=schedule.unroll, maxtext=() if maxtext_why else known,
        maxtext_why_not=maxtext_why,
        maxtext_preset="" if maxtext_why else _preset(per_name),
        unknown=tuple((n, per_name[n]) for n in tags if n not in MAXTEXT_NAMES),
        notes=tuple(notes), flax_policy=flax_source(policy))


def _per_name(policy: Policy, tags: tuple[str, ...],
              dots: Mapping[str, tuple[str, ...]]) -> tuple[dict[str, str], str]:
    """What ``policy`` does with each tag, and why MaxText's custom policy cannot say it
    ("" when it can)."""
    kept = dots.get(_DOTS.get(policy.name, ""))
    offloads = policy.name == _OFFLOAD_DOTS
    if kept is not None and (not offloads or dict(policy.kwargs) == _MAXTEXT_OFFLOAD):
        dest = OFFLOAD if offloads else DEVICE
        return {n: dest if n in kept else REMAT for n in tags}, ""
    if policy.name == "nothing_saveable":
        return dict.fromkeys(tags, REMAT), ""
    if policy.name == "save_only_these_names":
        return {n: DEVICE if n in policy.args else REMAT for n in tags}, ""
    if policy.name == "save_and_offload_only_these_names":
        kw = dict(policy.kwargs)
        saved = _as_names(kw.get("names_which_can_be_saved", ()))
        moved = _as_names(kw.get("names_which_can_be_offloaded", ()))
        per = {n: DEVICE if n in saved else OFFLOAD if n in moved else REMAT for n in tags}
        where = {k: kw.get(k) for k in _MAXTEXT_OFFLOAD}
        if where != _MAXTEXT_OFFLOAD:
            return per, (f"it offloads from {where['offload_src']} to "
                         f"{where['offload_dst']}, and MaxText's custom policy offloads from "
                         "device to pinned_host only")
        return per, ""
    if policy.name in ("save_anything_except_these_names", "save_any_names_but_these"):
        return ({n: REMAT if n in policy.args else DEVICE for n in tags},
                f"{policy.name} keeps every value it does not name, tagged or not, and "
                "MaxText's custom policy keeps only the names it lists")
    if policy.name == NO_REMAT:
        return dict.fromkeys(tags, DEVICE), ("no remat keeps every value, and MaxText's "
                                             "custom policy keeps only the names it lists")
    return dict.fromkeys(tags, REMAT), (f"{policy.name} keeps values by kind (matmul "
                                        "outputs), not by name, and MaxText's custom policy "
                                        "lists names")


def _preset(per_name: dict[str, str]) -> str:
    """MaxText's preset that does to these names what the block does, or "" (its names
    restricted to the problem's: ``maxtext_names.preset_named``)."""
    body = {n: v for n, v in per_name.items() if n != LAYER_INPUT}
    saved = {n for n, v in body.items() if v == DEVICE}
    moved = {n for n, v in body.items() if v == OFFLOAD}
    return maxtext_names.preset_named(saved, moved, frozenset(body))


def flax_source(policy: Policy) -> str:
    """``policy`` as the Python source of its ``jax.checkpoint_policies`` member (called,
    for a factory); "" for ``none`` (no remat)."""
    if policy.name == NO_REMAT:
        return ""
    member = f"jax.checkpoint_policies.{policy.name}"
    if policy.kwargs:
        parts = [f"{k}={_py(v)}" for k, v in policy.kwargs]
        return f"{member}({', '.join(parts)})"
    if policy.args:
        return f"{member}({', '.join(repr(a) for a in policy.args)})"
    return member


def _py(value: object) -> str:
    """A keyword argument's value as Python source: a list of names, or a string."""
    if isinstance(value, tuple):
        return "[" + ", ".join(repr(v) for v in value) + "]"
    return repr(value)
