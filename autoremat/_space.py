"""What the search can choose: an Optuna trial -> a ``Schedule``.

The space, for a sequence of length ``T``:

* ``kind``: ``nested`` or ``binomial``;
* binomial: ``snapshots`` on a log scale from the fewest that keep every step
  within ``MAX_REPETITIONS`` re-runs (``autoremat.bounds.repetitions``) up to
  ``4 sqrt(T)`` (past that it is per-step remat with extra bookkeeping);
* nested: ``depth`` in 1..4 (only depths with ``2**depth <= T``);
* depth 1: one plain scan; its policy is ``none`` (no remat, linear memory)
  or one of the zero-argument policies (remat of every step);
* depth ``d > 1``: the ``d - 1`` inner chunk lengths, innermost first, each
  drawn on a log scale and snapped to the nearest divisor of what is left of
  ``T`` when one is within 25% (so most schedules tile ``T`` exactly; the
  builder runs any remainder); the outermost count is derived,
  ``ceil(T / prod(inner))``. Each level's policy is one of
  ``nothing_saveable``, ``dots_saveable``, ``dots_with_no_batch_dims_saveable``,
  ``everything_saveable``; on GPU/TPU also ``offload_dot_with_no_batch_dims``
  (device -> ``pinned_host``);
* the innermost ``unroll`` in {1, 2, 4, 8} (at most the innermost length).

``seed_params`` gives the obvious candidates, enqueued before any sampling:
plain scan, per-step remat, sqrt(T) two levels, cube-root three levels
(Chen et al. 2016, arXiv 1604.06174: ``d`` levels store ``O(d T^(1/d))``),
and the binomial schedule with three repetitions (Griewank & Walther 2000:
``C(s + 3, 3) >= T`` snapshots).
"""

from __future__ import annotations

import math
from typing import Any, Final

from autoremat._schedule import NO_REMAT, Policy, Schedule, root_lengths, snap
from autoremat.bounds import max_steps

POLICIES: Final[dict[str, Policy]] = {
    "nothing": Policy("nothing_saveable"),
    "dots": Policy("dots_saveable"),
    "dots_no_batch": Policy("dots_with_no_batch_dims_saveable"),
    "everything": Policy("everything_saveable"),
}
OFFLOAD_POLICIES: Final[dict[str, Policy]] = {
    "offload_dots": Policy(
        "offload_dot_with_no_batch_dims",
        kwargs=(("offload_dst", "pinned_host"), ("offload_src", "device")),
    ),
}
UNROLLS: Final = (1, 2, 4, 8)
MAX_DEPTH: Final = 4
#: Binomial schedules re-run a step at most this often (about ``r + 1`` times
#: the forward work); fewer snapshots than that are never faster than nested.
MAX_REPETITIONS: Final = 6


def policy_choices(platform: str) -> dict[str, Policy]:
    """Per-level policy labels -> policies; offload only on ``gpu``/``tpu``."""
    if platform in ("gpu", "cuda", "rocm", "tpu"):
        return {**POLICIES, **OFFLOAD_POLICIES}
    return dict(POLICIES)


def depths(seq_len: int) -> list[int]:
    """The depths worth trying at this ``T`` (each level at least 2 long)."""
    return [d for d in range(1, MAX_DEPTH + 1) if d == 1 or 2**d <= seq_len]


def snapshot_range(seq_len: int) -> tuple[int, int]:
    """The binomial ``snapshots`` worth trying at this ``T`` (low, high)."""
    high = max(1, min(seq_len, 4 * math.isqrt(seq_len)))
    return min(_fewest_snapshots(seq_len, MAX_REPETITIONS), high), high


def _fewest_snapshots(seq_len: int, reps: int) -> int:
    """The fewest snapshots reversing ``seq_len`` steps with ``reps`` repetitions."""
    s = 1
    while max_steps(s, reps) < seq_len:
        s += 1
    return s


def suggest(trial: Any, seq_len: int, platform: str = "cpu") -> Schedule:
    """Sample a schedule for a length-``seq_len`` scan from an Optuna trial."""
    if trial.suggest_categorical("kind", ["nested", "binomial"]) == "binomial":
        low, high = snapshot_range(seq_len)
        return Schedule.binomial(trial.suggest_int("snapshots", low, high, log=True))
    choices = policy_choices(platform)
    depth = trial.suggest_categorical("depth", depths(seq_len))
    if depth == 1:
        label = trial.suggest_categorical("d1_policy", [NO_REMAT, *choices])
        policy = Policy(NO_REMAT) if label == NO_REMAT else choices[label]
        unroll = trial.suggest_categorical("d1_unroll", list(UNROLLS))
        return Schedule.nested([seq_len], [policy], unroll=min(unroll, seq_len))
    remaining = seq_len
    inner: list[int] = []  # innermost first
    for i in range(depth - 1):
        levels_left = depth - 1 - i  # levels still to place outside this one
        high = max(2, remaining // 2**levels_left)
        raw = trial.suggest_int(f"d{depth}_n{i}", 2, high, log=True)
        length = snap(raw, remaining)
        inner.append(length)
        remaining = math.ceil(remaining / length)
    outer = remaining
    lengths = [outer, *reversed(inner)]
    policies = [
        choices[trial.suggest_categorical(f"d{depth}_p{i}", list(choices))]
        for i in range(depth)
    ]  # outermost first
    unroll = trial.suggest_categorical(f"d{depth}_unroll", list(UNROLLS))
    return Schedule.nested(lengths, policies, unroll=min(unroll, lengths[-1]))


def seed_params(seq_len: int) -> list[dict[str, Any]]:
    """Trial parameters of the obvious candidates, in the order to try them.

    Plain scan, per-step remat (``nothing_saveable`` on every step), sqrt(T)
    two levels (outer ``nothing``, inner chunk stored), cube-root three
    levels (``nothing/nothing/everything``).
    """
    params: list[dict[str, Any]] = [
        {"kind": "nested", "depth": 1, "d1_policy": NO_REMAT, "d1_unroll": 1},
        {"kind": "nested", "depth": 1, "d1_policy": "nothing", "d1_unroll": 1},
    ]
    for depth, policies in ((2, ["nothing", "everything"]),
                            (3, ["nothing", "nothing", "everything"])):
        if depth not in depths(seq_len):
            continue
        p: dict[str, Any] = {"kind": "nested", "depth": depth, f"d{depth}_unroll": 1}
        for i, length in enumerate(reversed(root_lengths(seq_len, depth)[1:])):
            p[f"d{depth}_n{i}"] = length
        for i, label in enumerate(policies):
            p[f"d{depth}_p{i}"] = label
        params.append(p)
    if seq_len >= 2:
        low, high = snapshot_range(seq_len)
        snapshots = min(max(_fewest_snapshots(seq_len, 3), low), high)
        params.append({"kind": "binomial", "snapshots": snapshots})
    return params


def seed_schedules(seq_len: int) -> list[Schedule]:
    """The schedules of ``seed_params`` (what the first trials will measure)."""
    import optuna

    out = []
    for params in seed_params(seq_len):
        trial = optuna.trial.FixedTrial(params)
        out.append(suggest(trial, seq_len))
    return out
