"""The binomial (Revolve) checkpointing tables: where to snapshot, what to redo.

Pure Python, computed once per ``(T, snapshots)`` and run by
``autoremat._schedules.binomial``. The plan is the optimal recursion of Griewank &
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

import bisect
import functools
import math
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
    return _Recorder(seq_len, min(snapshots, seq_len)).run()


@dataclass(frozen=True)
class _Range:
    """Work item: reverse ``length`` steps from ``start``, whose first carry is in
    ``slot`` (already in hand: ``in_hand``), with ``free`` free slots."""

    start: int
    length: int
    free: int
    slot: int
    in_hand: bool


@dataclass(frozen=True)
class _Free:
    """Work item: slot ``slot`` is free again (its range is reversed)."""

    slot: int


class _Recorder:
    """Walks Revolve's recursion (an explicit stack of work items) and records what
    each action does: the forward sweep's snapshots, then per reversal its restore
    and its (advance, store) pairs."""

    def __init__(self, seq_len: int, s: int) -> None:
        self.seq_len, self.s = seq_len, s
        self.handoff, initial = s - 1, s
        self.free = list(range(s - 2, -1, -1))  # pop() hands out slot 0 first
        self.where = {initial: 0}  # slot -> position of the carry it holds
        self.fwd: list[tuple[int, int]] = []
        self.restore_slot: list[int] = []
        self.restore_pos: list[int] = []
        self.pair_start: list[int] = []
        self.pair_adv: list[int] = []
        self.pair_slot: list[int] = []
        self.pos, self.pending, self.forward, self.advances = 0, 0, True, 0
        self.stack: list[_Range | _Free] = [_Range(0, seq_len, s - 1, initial, True)]

    # -- the actions ----------------------------------------------------------------
    def advance(self, n: int) -> None:
        self.pos += n
        if not self.forward:
            self.pending += n
            self.advances += n

    def snapshot(self, slot: int) -> None:
        self.where[slot] = self.pos
        if self.forward:
            self.fwd.append((self.pos, slot))
        else:
            self.pair_adv.append(self.pending)
            self.pair_slot.append(slot)
            self.pending = 0

    def restore(self, slot: int) -> None:
        self.restore_slot.append(slot)
        self.restore_pos.append(self.where[slot])
        self.pair_start.append(len(self.pair_adv))
        self.pos = self.where[slot]

    def reverse(self, position: int) -> None:
        assert self.pos == position, (self.pos, position)
        if self.forward:  # end of the first sweep: the forward pass ends here
            assert position == self.seq_len - 1
            self.fwd.append((position, self.handoff))
            self.where[self.handoff] = position
            self.forward = False
            self.restore(self.handoff)
        elif self.pending:
            self.pair_adv.append(self.pending)
            self.pair_slot.append(-1)
            self.pending = 0

    # -- the recursion --------------------------------------------------------------
    def run(self) -> Tables:
        while self.stack:
            item = self.stack.pop()
            if isinstance(item, _Free):
                self.free.append(item.slot)
            elif item.length == 1 or item.free == 0:
                self.step_by_step(item)
            else:
                self.split(item)
        return self.result()

    def step_by_step(self, r: _Range) -> None:
        """No free slot (or one step): re-advance from the start for each step."""
        for j in range(r.length - 1, -1, -1):
            if not (r.in_hand and j == r.length - 1):
                self.restore(r.slot)
            self.advance(j)
            self.reverse(r.start + j)

    def split(self, r: _Range) -> None:
        """Advance ``m`` (``_split``), snapshot, then reverse the last ``length - m``
        steps with one slot fewer, free it, and reverse the first ``m``."""
        m = _split(r.length, r.free)
        if not r.in_hand:
            self.restore(r.slot)
        self.advance(m)
        first = _Range(r.start, m, r.free, r.slot, False)
        if r.length - m == 1:  # the last step is reversed at once: no snapshot needed
            self.reverse(r.start + m)
            self.stack.append(first)
            return
        k = self.free.pop()
        self.snapshot(k)
        self.stack += [first, _Free(k), _Range(r.start + m, r.length - m, r.free - 1, k, True)]

    def result(self) -> Tables:
        self.pair_start.append(len(self.pair_adv))
        assert len(self.restore_slot) == self.seq_len
        assert self.advances + self.seq_len - 1 == min_advances(self.seq_len, self.s)
        as_array = functools.partial(np.asarray, dtype=np.int32)
        return Tables(
            seq_len=self.seq_len, snapshots=self.s,
            forward_positions=as_array([p for p, _ in self.fwd]),
            forward_slots=as_array([k for _, k in self.fwd]),
            restore_slot=as_array(self.restore_slot),
            restore_position=as_array(self.restore_pos),
            pair_start=as_array(self.pair_start), pair_advance=as_array(self.pair_adv),
            pair_slot=as_array(self.pair_slot), advances=self.advances,
        )


#: Advance lengths of the backward's ops (``program``): a reversal's re-advance
#: is split into blocks of ``BLOCKS`` steps and a remainder below ``BLOCKS[-1]``.
BLOCKS: tuple[int, ...] = (64, 8)

#: The most snapshots one op of the backward takes on its way (``program``).
STORES: int = 4

#: A reversal's ops are padded (with ops that do nothing) to a power of this.
BUCKET_BASE: int = 4


@dataclass(frozen=True, eq=False)
class Program:
    """The backward pass of ``Tables`` as ops of static lengths, grouped by reversal.

    Reversal ``k`` (of step ``T - 1 - k``) restores the carry in slot
    ``restore_slot[k]`` (slot ``s``: the initial carry), runs ops ``start[k]
    ..`` (``sizes[bucket[k]]`` of them; bucket 0 has none: nothing to
    re-advance), then the VJP of its step. Op ``i`` advances
    ``lengths[branch[i]]`` steps from the carry before step ``position[i]``,
    keeping the carries before steps ``store_position[i]`` (``-1``: unused)
    for slots ``store_slot[i]`` (``s``: unused). A reversal's ops are padded to
    its bucket's size with ops of length 0. So the backward is a scan over the
    reversals with a switch over the buckets (each a fixed number of ops, each
    a switch over ``lengths``): no loop of dynamic trip count, and exactly the
    tables' re-advances (no step is masked; a padding op runs no step).

    Attributes:
      lengths: the advance lengths: ``0`` and those of ``1 .. BLOCKS[-1] - 1``
        and ``BLOCKS`` that the plan uses.
      sizes: the bucket sizes (ops per reversal): ``0``, then powers of
        ``BUCKET_BASE``, those used.
      branch, position, store_position, store_slot: per op (``STORES`` of
        the last two each).
      restore_slot, bucket, start: per reversal.
    """

    lengths: tuple[int, ...]
    sizes: tuple[int, ...]
    branch: np.ndarray
    position: np.ndarray
    store_position: np.ndarray
    store_slot: np.ndarray
    restore_slot: np.ndarray
    bucket: np.ndarray
    start: np.ndarray

    @property
    def advances(self) -> int:
        """Forward steps the ops run (equal to ``Tables.advances``)."""
        return int(np.asarray(self.lengths)[self.branch].sum())

    @property
    def ops(self) -> int:
        """Ops that run a step or store (the rest is padding)."""
        return int(((np.asarray(self.lengths)[self.branch] > 0)
                    | (self.store_position >= 0).any(axis=1)).sum())


@functools.lru_cache(maxsize=32)
def program(seq_len: int, snapshots: int, blocks: tuple[int, ...] = BLOCKS,
            stores: int = STORES) -> Program:
    """The ops of the backward pass of ``tables(seq_len, snapshots)``.

    A reversal re-advancing ``a > 0`` steps becomes ops of the largest lengths
    of ``blocks`` and ``1 .. blocks[-1] - 1`` that fit and take at most
    ``stores`` snapshots each. ``T = 10^5``, ``s = 17``: 0.26 T reversals
    re-advance, in 0.48 T ops (0.77 T with the padding).
    """
    t = tables(seq_len, snapshots)
    lengths = (*range(blocks[-1]), *blocks)
    by_size = sorted(lengths[1:], reverse=True)
    ops: list[tuple[int, int, list[int], list[int]]] = []
    size: list[int] = []
    start: list[int] = []
    for k in range(seq_len):
        position = int(t.restore_position[k])
        end = seq_len - 1 - k
        todo: dict[int, int] = {}  # position -> slot of this reversal's snapshots
        at = position
        for j in range(int(t.pair_start[k]), int(t.pair_start[k + 1])):
            at += int(t.pair_advance[j])
            if t.pair_slot[j] >= 0:
                todo[at] = int(t.pair_slot[j])
        assert at == end and all(q < end for q in todo), (k, at)
        marks = sorted(todo)
        start.append(len(ops))
        while position < end:
            first = bisect.bisect_left(marks, position)
            n = next(n for n in by_size if n <= end - position and
                     bisect.bisect_left(marks, position + n) - first <= stores)
            taken = marks[first:bisect.bisect_left(marks, position + n)]
            ops.append((lengths.index(n), position, taken, [todo[q] for q in taken]))
            position += n
        count = len(ops) - start[-1]
        bucket = 0 if count == 0 else BUCKET_BASE ** math.ceil(
            round(math.log(count, BUCKET_BASE), 9))
        ops += [(0, end, [], [])] * (bucket - count)
        size.append(bucket)
    used = sorted({0, *(o[0] for o in ops)})  # only the lengths this plan runs
    sizes = sorted(set(size))
    as_array = functools.partial(np.asarray, dtype=np.int32)
    pad = lambda v, fill: v + [fill] * (stores - len(v))  # noqa: E731
    out = Program(
        lengths=tuple(lengths[b] for b in used), sizes=tuple(sizes),
        branch=as_array(np.searchsorted(used, [o[0] for o in ops] or [0])),
        position=as_array([o[1] for o in ops] or [0]),
        store_position=as_array([pad(o[2], -1) for o in ops] or [pad([], -1)]).reshape(-1, stores),
        store_slot=as_array([pad(o[3], t.snapshots) for o in ops] or [pad([], t.snapshots)]
                            ).reshape(-1, stores),
        restore_slot=t.restore_slot, bucket=as_array(np.searchsorted(sizes, size)),
        start=as_array(start),
    )
    assert out.advances == t.advances
    assert (out.store_position >= 0).sum() == (t.pair_slot >= 0).sum()
    return out
