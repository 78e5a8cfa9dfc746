"""The groups kind: consecutive groups of steps, each step under its group's policy.

MaxText, Haliax and Flax give every layer of a stack one remat policy. Between two
presets -- ``nothing_saveable`` fits the budget, ``checkpoint_dots_with_no_batch_dims``
is faster but does not -- one policy for all leaves the difference unspent. Here the
first ``k`` layers keep what the faster policy keeps and the rest keep nothing, so
the budget buys as much of the faster one as fits: memory and the recompute saved are
both about linear in ``k`` (each layer stores its own residuals, Chen et al. 2016's
per-layer accounting), and the search picks ``k`` from the two presets' measured peaks
(``autoremat._search.planning.presets``). The builder is one ``lax.scan`` per group (the nested
kind's one-level scan, ``nested_scan``): gradients are exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from autoremat._errors import ScheduleError
from autoremat._schedules.base import NO_NAMES, SHORT_SCAN, Features, Param, Schedule, at
from autoremat._schedules.nested import (
    KEEPS_EVERYTHING,
    PARTIAL,
    level_terms,
    levels_data,
    parse_levels,
    policy_label,
)
from autoremat._schedules.nested_space import policy_choices
from autoremat._schedules.policy import NO_REMAT, Level, Policy, _show, check_levels
from autoremat.bounds import Cost

#: At most this many groups (a schedule of more is a list of layers, not of groups).
MAX_GROUPS: Final = 64


@dataclass(frozen=True, kw_only=True)
class GroupsSchedule(Schedule):
    """``kind: groups`` -- consecutive groups of steps, each with its own policy.

    * Group ``i`` is ``groups[i].length`` consecutive steps, each step's body
      wrapped in ``jax.checkpoint(policy=groups[i].policy)`` (``none``: stored
      whole, as in a plain scan); the groups run one after another, first to last
      (last to first with ``reverse``).
    * Any sequence length ``T`` runs: the groups take their lengths in order and the
      last one takes what is left -- more steps or fewer -- (``spans``); groups
      past ``T`` are not run. A schedule tuned for a 24-layer stack runs a 24-layer
      stack as written.
    * Memory: each step stores what its policy keeps (its residuals, or only its
      carry), so the stack's peak is the sum over groups; time: each step under a
      recomputing policy re-runs once in the backward pass.
    * ``unroll`` is each group's ``lax.scan`` unroll.

    Attributes:
      groups: ``Level(length, policy)`` per group, first steps first (1 to
        ``MAX_GROUPS``).
    """

    kind: ClassVar[str] = "groups"
    FIELDS: ClassVar[Mapping[str, str]] = {
        "groups": "groups: [{length: 8, policy: checkpoint_dots_with_no_batch_dims}, "
                  "{length: 4, policy: nothing_saveable}]"}

    groups: tuple[Level, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", check_levels("groups", self.groups, MAX_GROUPS))
        super().__post_init__()

    @classmethod
    def build(cls, groups: Sequence[tuple[int, str | Policy | Mapping[str, Any]]], *,
              unroll: int = 1, meta: Mapping[str, Any] | None = None) -> GroupsSchedule:
        """``autoremat.groups``: ``[(length, policy), ...]``, first steps first."""
        levels = []
        for i, item in enumerate(groups):
            with at(f"groups[{i}]"):
                if not isinstance(item, (tuple, list)) or len(item) != 2:
                    raise ScheduleError(f"expected a (length, policy) pair, got {_show(item)}")
                levels.append(Level(item[0], Policy.from_data(item[1])))
        return cls(groups=tuple(levels), unroll=unroll, meta=dict(meta or {}))

    def policies(self) -> list[tuple[str, Policy]]:
        return [(f"groups[{i}].policy", g.policy) for i, g in enumerate(self.groups)]

    def spans(self, steps: int) -> list[tuple[int, int, Policy]]:
        """``(start, length, policy)`` of each group run at ``T = steps`` (the last one
        run takes what is left)."""
        out, start = [], 0
        for i, g in enumerate(self.groups):
            if start >= steps:
                break
            n = steps - start if i == len(self.groups) - 1 else min(g.length, steps - start)
            out.append((start, n, g.policy))
            start += n
        return out

    @property
    def tuned_length(self) -> int:
        """The length the groups cover as written (their sum)."""
        return sum(g.length for g in self.groups)

    # -- the file form -------------------------------------------------------------
    @classmethod
    def parse_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        return {"groups": parse_levels(data["groups"], "groups")}

    def fields_data(self) -> dict[str, Any]:
        return {"groups": levels_data(self.groups)}

    # -- summaries -----------------------------------------------------------------
    def describe(self) -> str:
        parts = " + ".join(f"{g.length} {policy_label(g.policy)}" for g in self.groups)
        return f"groups {parts} unroll={self.unroll}{self.options_note()}"

    def explain(self) -> list[str]:
        lines = [f"  {len(self.groups)} groups over T = {self.tuned_length} "
                 "(any T runs: the last group takes the rest)"]
        start = 0
        for i, g in enumerate(self.groups):
            lines.append(f"  group {i}: steps {start}-{start + g.length - 1}, "
                         f"policy {g.policy.to_data()}")
            start += g.length
            meaning = g.policy.explain_names()
            if meaning:
                lines.append(f"           {meaning}")
        lines.append(f"  unroll: {self.unroll}")
        return lines

    def cost(self, seq_len: int) -> Cost:
        """Each step under a recomputing policy is evaluated twice; every step stores
        one carry's worth or more (counted as one, like remat of each step)."""
        evaluations = sum(n * (1 + (p.name not in KEEPS_EVERYTHING))
                          for _, n, p in self.spans(seq_len))
        return Cost(seq_len, evaluations, seq_len)

    def features(self, seq_len: int) -> Features:
        """Per group, what one level of the nested kind of that length stores
        (``nested.level_terms``); the peak adds one step's full residuals."""
        kept = [0.0, 0.0, 0.0]
        partial = 0.0
        for _, n, policy in self.spans(seq_len):
            group_kept, _ = level_terms((Level(n, policy),), n)
            kept = [a + b for a, b in zip(kept, group_kept, strict=True)]
            partial += n * policy.name.startswith(PARTIAL)
        return Features(evaluations=float(self.cost(seq_len).evaluations), partial=partial,
                        terms=(kept[0], kept[1] + 1.0, kept[2]))

    def run(self, step: Callable[..., Any], init: Any, leaves: list[Any], axes: list[int],
            steps: int, reverse: bool) -> tuple[Any, Any]:
        import jax
        import jax.numpy as jnp

        from autoremat._schedules.nested_scan import nested_scan

        spans = self.spans(steps)
        carry, outs = init, {}
        for start, n, policy in reversed(spans) if reverse else spans:
            carry, outs[start] = nested_scan(step, carry, leaves, axes, [(start, n, 0)],
                                             (Level(n, policy),), min(self.unroll, n), reverse)
        parts = [outs[start] for start, _, _ in spans]
        if len(parts) == 1:
            return carry, parts[0]
        return carry, jax.tree_util.tree_map(lambda *p: jnp.concatenate(p, axis=0), *parts)

    # -- the search space ------------------------------------------------------------
    @classmethod
    def searched(cls, seq_len: int) -> bool:
        """Offered for short scans (``SHORT_SCAN``) of two steps or more; the search's
        planner keeps its draws for a layer stack only (``autoremat._search.planning.presets``)."""
        return 2 <= seq_len <= SHORT_SCAN

    @classmethod
    def parameters(cls, seq_len: int, platform: str, chosen: Mapping[str, Any],
                   named: Mapping[str, Policy] = NO_NAMES) -> list[Param]:
        """Two groups: ``g_first`` steps (ordered: a quarter, half or three quarters of
        ``T``) under ``g_policy0``, the rest under ``g_policy1`` (each a per-step policy
        of the nested kind's depth 1, ``nested_space.policy_choices``, with the
        problem's ``named`` ones). A coarse ladder, not every split: a short scan's
        structures are all listed (``short_scans``), and 63 splits of a 64-step scan
        were ~190 candidates, compiled to be ruled out; the split that pays is sized
        from measured presets (``autoremat._search.planning.presets``)."""
        labels = (NO_REMAT, *policy_choices(platform, "step", named))
        splits = sorted({min(max(1, round(seq_len * q)), max(1, seq_len - 1))
                         for q in (0.25, 0.5, 0.75)})
        return [Param("g_first", tuple(splits), ordered=True),
                Param("g_policy0", labels), Param("g_policy1", labels)]

    @classmethod
    def from_params(cls, params: Mapping[str, Any], seq_len: int, platform: str,
                    named: Mapping[str, Policy] = NO_NAMES) -> GroupsSchedule:
        choices = {NO_REMAT: Policy(NO_REMAT), **policy_choices(platform, "step", named)}
        first = min(params["g_first"], max(1, seq_len - 1))
        return cls.build([(first, choices[params["g_policy0"]]),
                          (max(1, seq_len - first), choices[params["g_policy1"]])])

    @classmethod
    def seed_params(cls, seq_len: int, platform: str = "cpu") -> list[dict[str, Any]]:
        """None: a groups schedule is proposed from two presets' measured peaks
        (``autoremat._search.planning.presets``), not guessed."""
        return []

    @classmethod
    def examples(cls) -> Sequence[Schedule]:
        """Two and three groups, every kind of policy, a group of one, T shorter and
        longer than the groups."""
        build = cls.build
        return [build([(2, "dots_with_no_batch_dims_saveable"), (3, "nothing_saveable")]),
                build([(1, NO_REMAT), (2, "everything_saveable"), (1, "dots_saveable")]),
                build([(4, "nothing_saveable")]),
                build([(3, "dots_saveable"), (2, NO_REMAT)], unroll=2),
                build([(5, "nothing_saveable"), (40, "dots_saveable")])]
