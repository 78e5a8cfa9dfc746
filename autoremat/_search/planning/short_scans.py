"""Short heavy scans: every structure of the space, enumerated.

A transformer's scan over layers has 12-100 steps of heavy work, not 10^4
light ones. Its space is small in all but the policies: the depths, the chunk
lengths (after ``snap``, mostly exact tilings such as 4x6 or 2x3x4 for 24
layers) and the binomial snapshots can all be listed. For a scan of
at most ``SHORT_SCAN`` steps, ``structure_params`` lists every one -- every
kind, every integer parameter in its range, every ordered choice (``depth``)
-- and the planner adds each to its pool, ``DRAWS`` times with the other
choices (policies per level, unroll) drawn at random, beside its usual random
draws: no structure is missed by chance, and the time and memory models rank
them all. The neighbours of the best then vary its policies one level at a
time (``space.neighbours``).

The trade-off: the policies are not enumerated (their product over levels,
with a model's named tags, is thousands of schedules, each a compile of the
whole stack); a space with more than ``MAX_STRUCTURES`` structures is left to
random draws.
"""

from __future__ import annotations

import random
from typing import Any, Final

from autoremat._schedules.base import NO_NAMES, SHORT_SCAN
from autoremat._search.space import Named, build, unchosen

#: A space with more structures than this is not enumerated.
MAX_STRUCTURES: Final = 400
#: Random completions (policies, unroll) added per structure.
DRAWS: Final = 3


def structure_params(seq_len: int, platform: str, refused: frozenset[str] = frozenset(),
                     named: Named = NO_NAMES) -> list[dict[str, Any]] | None:
    """Every structure of a short scan's space as partial trial params (the module
    docstring), one per distinct schedule; ``None`` when the scan is longer than
    ``SHORT_SCAN`` or has more than ``MAX_STRUCTURES`` structures."""
    if seq_len > SHORT_SCAN:
        return None
    found: dict[str, dict[str, Any]] = {}
    pending: list[dict[str, Any]] = [{}]
    while pending:
        fixed = pending.pop()
        chosen = dict(fixed)  # and the first choice of every parameter not enumerated
        branch = None
        while branch is None and (todo := unchosen(chosen, seq_len, platform, refused,
                                                           named=named)):
            for param in todo:
                if param.name == "kind" or param.ordered or not param.choices:
                    branch = param  # the next one to enumerate
                    break
                chosen[param.name] = param.choices[0]
        if branch is not None:
            values = branch.choices or range(branch.low, branch.high + 1)
            pending.extend({**fixed, branch.name: v} for v in reversed(values))
            if len(pending) + len(found) > 50 * MAX_STRUCTURES:
                return None
            continue
        found.setdefault(build(chosen, seq_len, platform, named).key(), fixed)
        if len(found) > MAX_STRUCTURES:
            return None
    return list(found.values())


def short_scan_params(seq_len: int, platform: str, rng: random.Random,
                      refused: frozenset[str] = frozenset(),
                      named: Named = NO_NAMES) -> list[dict[str, Any]]:
    """``DRAWS`` copies of each of ``structure_params`` (none when it is ``None``), for
    ``space.propose`` to complete at random."""
    structures = structure_params(seq_len, platform, refused, named) or []
    return [dict(p) for p in structures for _ in range(DRAWS)]
