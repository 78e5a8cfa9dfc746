"""The binomial (Revolve) checkpointing tables: where to snapshot, what to redo.

Pure Python, computed once per ``(T, snapshots)`` and run by
``autoremat._binomial``. The plan is the optimal recursion of Griewank &
Walther (2000, "Algorithm 799: Revolve"): to reverse ``l`` steps whose first
carry is stored, with ``c`` free slots, advance ``m`` steps, snapshot, reverse
the last ``l - m`` steps with ``c - 1`` slots, free the slot, and reverse the
first ``m`` with ``c``; with no free slot, re-advance from the start for each
step. The split ``m`` minimises ``m + G(l - m, c - 1) + G(m, c)`` with ``G``
the closed-form optimum (``autoremat.bounds.min_advances``), so the plan
executes exactly ``bounds.min_evaluations(T, s)`` step evaluations.

Slots: ``0 .. s - 2`` hold snapshots, ``s - 1`` (``handoff``) the carry of
step ``T - 1``, which the forward pass keeps for the first reversal (Revolve's
"carry in hand"), and ``s`` stands for the scan's initial carry (not stored).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from autoremat.bounds import min_advances


@dataclass(frozen=True, eq=False)
class Tables:
    """Tables of the binomial schedule for ``seq_len`` steps (positions in scan order).

    Attributes:
      seq_len, snapshots: ``T`` and the slots used (``min(s, T)``).
      forward_positions, forward_slots: the forward pass stores the carry
        *before* step ``forward_positions[i]`` in ``forward_slots[i]``
        (ascending positions; the last is ``T - 1`` into the handoff slot).
      restore_slot, restore_position: reversal ``k`` (of step ``T - 1 - k``)
        starts from the carry in ``restore_slot[k]``, which is the carry before
        step ``restore_position[k]``.
      pair_start: reversal ``k`` runs pairs ``pair_start[k] .. pair_start[k+1]``:
        advance ``pair_advance[j]`` steps, then store the carry in
        ``pair_slot[j]`` (``-1``: do not store).
      advances: forward steps in the backward pass (re-advances).
    """

    seq_len: int
    snapshots: int
    forward_positions: np.ndarray
    forward_slots: np.ndarray
    restore_slot: np.ndarray
    restore_position: np.ndarray
    pair_start: np.ndarray
    pair_advance: np.ndarray
    pair_slot: np.ndarray
    advances: int

    @property
    def evaluations(self) -> int:
        """Step evaluations of a forward + backward pass: ``T + advances + T``."""
        return 2 * self.seq_len + self.advances


def _g(length: int, free: int) -> int:
    """Fewest advances to reverse ``length`` steps, start stored, ``free`` slots."""
    return min_advances(length, free + 1)


def _split(length: int, free: int) -> int:
    """An optimal first advance ``m`` (the cost is convex in ``m``)."""

    def cost(m: int) -> int:
        return m + _g(length - m, free - 1) + _g(m, free)

    lo, hi = 1, length - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cost(mid + 1) < cost(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


@functools.lru_cache(maxsize=32)
def tables(seq_len: int, snapshots: int) -> Tables:
    """The binomial plan for ``seq_len >= 1`` steps and ``snapshots >= 1`` slots."""
    if seq_len < 1 or snapshots < 1:
        raise ValueError(f"plan: need seq_len >= 1 and snapshots >= 1, got {seq_len}, {snapshots}")
    s = min(snapshots, seq_len)
    handoff, initial = s - 1, s
    free = list(range(s - 2, -1, -1))  # pop() hands out slot 0 first
    where = {initial: 0}  # slot -> position of the carry it holds
    fwd: list[tuple[int, int]] = []
    restore_slot: list[int] = []
    restore_pos: list[int] = []
    pair_start: list[int] = []
    pair_adv: list[int] = []
    pair_slot: list[int] = []
    state = {"pos": 0, "pending": 0, "forward": True, "advances": 0}

    def advance(n: int) -> None:
        state["pos"] += n
        if not state["forward"]:
            state["pending"] += n
            state["advances"] += n

    def snapshot(slot: int) -> None:
        where[slot] = state["pos"]
        if state["forward"]:
            fwd.append((state["pos"], slot))
        else:
            pair_adv.append(state["pending"])
            pair_slot.append(slot)
            state["pending"] = 0

    def restore(slot: int) -> None:
        restore_slot.append(slot)
        restore_pos.append(where[slot])
        pair_start.append(len(pair_adv))
        state["pos"] = where[slot]

    def reverse(position: int) -> None:
        assert state["pos"] == position, (state["pos"], position)
        if state["forward"]:  # end of the first sweep: the forward pass ends here
            assert position == seq_len - 1
            fwd.append((position, handoff))
            where[handoff] = position
            state["forward"] = False
            restore(handoff)
        elif state["pending"]:
            pair_adv.append(state["pending"])
            pair_slot.append(-1)
            state["pending"] = 0

    # Work items: ("range", start, length, free slots, start slot, start in hand) | ("free", slot).
    stack: list[tuple] = [("range", 0, seq_len, s - 1, initial, True)]
    while stack:
        item = stack.pop()
        if item[0] == "free":
            free.append(item[1])
            continue
        _, start, length, nfree, slot, in_hand = item
        if length == 1 or nfree == 0:
            for j in range(length - 1, -1, -1):
                if not (in_hand and j == length - 1):
                    restore(slot)
                advance(j)
                reverse(start + j)
            continue
        m = _split(length, nfree)
        if not in_hand:
            restore(slot)
        advance(m)
        if length - m == 1:  # the last step is reversed at once: no snapshot needed
            reverse(start + m)
            stack.append(("range", start, m, nfree, slot, False))
            continue
        k = free.pop()
        snapshot(k)
        stack.append(("range", start, m, nfree, slot, False))
        stack.append(("free", k))
        stack.append(("range", start + m, length - m, nfree - 1, k, True))
    pair_start.append(len(pair_adv))
    assert len(restore_slot) == seq_len
    assert state["advances"] + seq_len - 1 == min_advances(seq_len, s)
    as_array = functools.partial(np.asarray, dtype=np.int32)
    return Tables(
        seq_len=seq_len, snapshots=s,
        forward_positions=as_array([p for p, _ in fwd]),
        forward_slots=as_array([k for _, k in fwd]),
        restore_slot=as_array(restore_slot), restore_position=as_array(restore_pos),
        pair_start=as_array(pair_start), pair_advance=as_array(pair_adv),
        pair_slot=as_array(pair_slot), advances=state["advances"],
    )
