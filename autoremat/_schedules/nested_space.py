"""The nested kind's search space: its parameters, policy choices per level, seeds, checks.

What the search may choose for a nested schedule (``NestedSchedule.parameters``,
``from_params``, ``seed_params`` and ``checks`` delegate here): the depth
(``depths``), the inner chunk lengths, one policy per level (``policy_choices``:
the fixed ``POLICIES``, the offload placements where the platform offers them,
and the policies over the problem's own ``checkpoint_name`` tags, ``named``,
passed in by the search like every other input of the space) and the innermost
unroll. Pure Python: no jax, no schedule objects (``nested.py`` builds those).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from autoremat._schedules.base import NO_NAMES, Param
from autoremat._schedules.lengths import root_lengths, snap
from autoremat._schedules.platforms import OFFLOAD_PLATFORMS
from autoremat._schedules.policy import CARRY_NAME, NO_REMAT, OFFLOAD_TO_HOST, Policy, offload_names

#: The fixed per-level policy choices: label -> policy.
POLICIES: Final[dict[str, Policy]] = {
    "nothing": Policy("nothing_saveable"),
    "dots": Policy("dots_saveable"),
    "dots_no_batch": Policy("dots_with_no_batch_dims_saveable"),
    "everything": Policy("everything_saveable"),
}
_OFFLOAD_DOTS: Final = Policy("offload_dot_with_no_batch_dims", kwargs=OFFLOAD_TO_HOST)
#: Offload choices by placement: label -> policy. Each is offered only where it is placed
#: (``PLACEMENTS``) and probed there on its own (``NestedSchedule.checks``): XLA:TPU
#: compiles offload of the innermost level and of each step but not of a value stacked by
#: two loops (an outer level's residuals; maxtext PR #4995, jax 0.10.2); the outer level
#: offloads only its chunk-boundary carries, by name, as MaxText (``decoder_layer_input``)
#: and Haliax (``save_carries="offload"``) do.
OFFLOAD_POLICIES: Final[dict[str, Policy]] = {
    "offload_step": _OFFLOAD_DOTS,  # remat of each step (depth 1)
    "offload_dots": _OFFLOAD_DOTS,  # the innermost level of a nested schedule
    "offload_carries": offload_names([CARRY_NAME]),  # an outer level
}
#: Where each offload label may be placed: ``"step"`` (the one level of depth 1),
#: ``"innermost"`` or ``"outer"`` (any level but the innermost).
PLACEMENTS: Final[dict[str, str]] = {"offload_step": "step", "offload_dots": "innermost",
                                     "offload_carries": "outer"}
UNROLLS: Final = (1, 2, 4, 8)
#: Off a CPU, the innermost chunk of the unrolled-chunk seed (``NestedSchedule.seed_params``):
#: ``T/4 x 4`` ``nothing/everything``, the four steps unrolled.
UNROLLED_CHUNK: Final = 4
MAX_DEPTH: Final = 4

Named = Mapping[str, Policy]


def policy_choices(platform: str, where: str | None = None,
                   named: Named = NO_NAMES) -> dict[str, Policy]:
    """Per-level policy labels -> policies: ``POLICIES`` and the problem's ``named``
    policies; offload only on ``gpu``/``tpu``, each label only at its placement
    (``where``: ``"step"``, ``"innermost"``, ``"outer"``; ``None``: every placement's;
    the problem's own offloading names at the innermost level, as ``offload_dots``)."""
    if platform in OFFLOAD_PLATFORMS:
        offload = {label: policy for label, policy in OFFLOAD_POLICIES.items()
                   if where is None or PLACEMENTS[label] == where}
        return {**POLICIES, **offload,
                **{label: p for label, p in named.items()
                   if not p.offloads or where in (None, "innermost")}}
    return {**POLICIES, **{label: p for label, p in named.items() if not p.offloads}}


def depths(seq_len: int) -> list[int]:
    """The depths worth trying at this ``T`` (each level at least 2 long)."""
    return [d for d in range(1, MAX_DEPTH + 1) if d == 1 or 2**d <= seq_len]


def parameters(seq_len: int, platform: str, chosen: Mapping[str, Any],
               named: Named = NO_NAMES) -> list[Param]:
    """``depth`` in ``depths(T)``; depth 1: a plain scan (policy ``none``) or per-step
    remat, and the ``unroll``; deeper: the inner chunk lengths, innermost first,
    log-scaled (``inner``: each snapped to a divisor of what is left of ``T`` when one
    is within 25%, ``snap``; the outermost count is ``ceil(T / prod(inner))``); one
    policy per level, outermost first; the innermost ``unroll`` in ``UNROLLS``."""
    out = [Param("depth", tuple(depths(seq_len)), ordered=True)]
    depth = chosen.get("depth")
    if depth is None:
        return out
    if depth == 1:
        return [*out, Param("d1_policy", (NO_REMAT, *policy_choices(platform, "step", named))),
                Param("d1_unroll", UNROLLS)]
    found, inner_lengths, _ = inner(seq_len, depth, chosen)
    if len(inner_lengths) < len(found):
        return out + found
    outer = policy_choices(platform, "outer", named)
    innermost = policy_choices(platform, "innermost", named)
    return [*out, *found,
            *(Param(f"d{depth}_p{i}", tuple(innermost if i == depth - 1 else outer))
              for i in range(depth)),  # outermost first
            Param(f"d{depth}_unroll", UNROLLS)]


def from_params(params: Mapping[str, Any], seq_len: int, platform: str,
                named: Named = NO_NAMES) -> tuple[list[int], list[Policy], int]:
    """The lengths, policies and unroll of a complete choice of ``parameters``."""
    depth = params["depth"]
    if depth == 1:
        label = params["d1_policy"]
        policy = Policy(NO_REMAT) if label == NO_REMAT else \
            policy_choices(platform, "step", named)[label]
        return [seq_len], [policy], min(params["d1_unroll"], seq_len)
    found, inner_lengths, remaining = inner(seq_len, depth, params)
    if len(inner_lengths) < len(found):
        raise KeyError(found[len(inner_lengths)].name)
    lengths = [remaining, *reversed(inner_lengths)]
    outer = policy_choices(platform, "outer", named)
    innermost = policy_choices(platform, "innermost", named)
    policies = [(innermost if i == depth - 1 else outer)[params[f"d{depth}_p{i}"]]
                for i in range(depth)]
    return lengths, policies, min(params[f"d{depth}_unroll"], lengths[-1])


def unrolled_inner(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The innermost chunk length and the unroll set together to one value of ``UNROLLS``
    (2 and up): the current unroll and those beside it, within a factor 2 of the length
    -- the innermost level run fully unrolled, where it is short. A move of one of them at
    a time passes through slow schedules (an inner length with a mismatched unroll), at
    which the search cuts and stops before the fast one with both moved together
    (``studies/results/tune_time.md``)."""
    depth = params.get("depth")
    length, unroll = params.get(f"d{depth}_n0"), params.get(f"d{depth}_unroll")
    if not isinstance(depth, int) or depth < 2 or length is None or unroll not in UNROLLS:
        return []
    i = UNROLLS.index(unroll)
    tied = [u for u in UNROLLS[max(0, i - 1):i + 2]
            if u >= 2 and length <= 2 * u <= 4 * length and (u, u) != (length, unroll)]
    return [{**params, f"d{depth}_n0": u, f"d{depth}_unroll": u} for u in tied]


def seed_params(seq_len: int, platform: str = "cpu") -> list[dict[str, Any]]:
    """``NestedSchedule.seed_params`` (its docstring says why these)."""
    params: list[dict[str, Any]] = [
        {"depth": 1, "d1_policy": NO_REMAT, "d1_unroll": 1},
        {"depth": 1, "d1_policy": "nothing", "d1_unroll": 1},
    ]
    if platform != "cpu" and seq_len >= 2 * UNROLLED_CHUNK:
        params.append({"depth": 2, "d2_n0": UNROLLED_CHUNK, "d2_unroll": UNROLLED_CHUNK,
                       "d2_p0": "nothing", "d2_p1": "everything"})
    for depth, labels in ((2, ["nothing", "everything"]),
                          (3, ["nothing", "nothing", "everything"])):
        if depth not in depths(seq_len):
            continue
        p: dict[str, Any] = {"depth": depth, f"d{depth}_unroll": 1}
        for i, length in enumerate(reversed(root_lengths(seq_len, depth)[1:])):
            p[f"d{depth}_n{i}"] = length
        for i, label in enumerate(labels):
            p[f"d{depth}_p{i}"] = label
        params.append(p)
    if seq_len >= 1000 and platform == "cpu":
        params.append({"depth": 3, "d3_unroll": 1, "d3_n0": 10, "d3_n1": 10,
                       "d3_p0": "nothing", "d3_p1": "dots", "d3_p2": "everything"})
    return params


def check_levels(seq_len: int, platform: str,
                 named: Named = NO_NAMES) -> dict[str, tuple[tuple[int, ...], list[Policy]]]:
    """Each offload placement this platform offers (``policy_choices``) on its own, as
    (lengths, policies): remat of each step under ``offload_step``; two levels
    (``root_lengths``) with the innermost under ``offload_dots`` or a ``named``
    offloading policy, or the outer under ``offload_carries`` (the other level
    ``nothing``)."""
    offered = policy_choices(platform, named=named)
    two = tuple(root_lengths(seq_len, 2)) if seq_len >= 4 else None
    nothing = Policy("nothing_saveable")
    out: dict[str, tuple[tuple[int, ...], list[Policy]]] = {
        "offload_step": ((seq_len,), [OFFLOAD_POLICIES["offload_step"]])}
    if two is not None:
        out["offload_dots"] = (two, [nothing, OFFLOAD_POLICIES["offload_dots"]])
        out["offload_carries"] = (two, [OFFLOAD_POLICIES["offload_carries"], nothing])
        for label, policy in offered.items():  # the problem's own names: innermost
            if label not in out and policy.offloads:
                out[label] = (two, [nothing, policy])
    return {label: levels for label, levels in out.items() if label in offered}


def inner(seq_len: int, depth: int,
          params: Mapping[str, Any]) -> tuple[list[Param], list[int], int]:
    """The inner chunk lengths of ``depth`` levels, innermost first, as far as ``params``
    holds them: their parameters (each from 2 to what leaves the levels outside it at
    least 2 steps each), the lengths (``snap``ped to what is left of ``T``), and what is
    left of ``T`` for the levels outside them."""
    found: list[Param] = []
    lengths: list[int] = []
    remaining = seq_len
    for i in range(depth - 1):
        levels_left = depth - 1 - i  # levels still to place outside this one
        found.append(Param(f"d{depth}_n{i}", low=2, high=max(2, remaining // 2**levels_left),
                           log=True))
        if found[-1].name not in params:
            break
        lengths.append(snap(params[found[-1].name], remaining))
        remaining = math.ceil(remaining / lengths[-1])
    return found, lengths, remaining
