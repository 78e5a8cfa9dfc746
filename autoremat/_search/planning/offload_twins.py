"""An offloading candidate's twin: the same schedule keeping on the device what it offloads.

An offload placement (``nested_space.OFFLOAD_POLICIES``) trades time for device memory:
the offloaded residuals are computed as its twin computes them, then copied to the host
and back. The twin keeps them on the device (``ON_DEVICE``: offloaded dots saved as
``dots_with_no_batch_dims_saveable``; offloaded chunk-boundary carries kept as
``nothing_saveable`` keeps them), so it does the same work without the copies: the
offloading schedule is never the faster of the two, and is worth trying only where its
twin does not fit the budget.

A ``Planner`` (``autoremat._search.planning.planner``) holds an ``OffloadTwins``: before it probes
or compiles an offloading candidate, it asks for the twin (``twin``, added to the pool):

* the twin fits (timed, or sized within the budget): the candidate is dominated, never
  probed, compiled or timed (a big model spent seconds probing carry offload and a trial
  on a schedule whose twin fitted with 6x room: ``studies/results/tune_time.md``);
* predicted far under the budget by a memory model that fits its points
  (``MemoryModel.far_under``): the same, without the twin's compile -- on the seed at 4 GB
  the twins of four offloads were compiled first, 1.4-2.3 s each, to find 100 MB;
* not known yet: the twin is compiled first (``first``);
* over the budget (or refused, or failed): the candidate goes on as any other -- unless
  the copies alone take longer than the search's stop allows (``copies_too_slow``): it
  moves at least the bytes its twin keeps more (the twin's size less its own, sized or
  predicted) over the host link (``device.host_bandwidth``, timed once), and its step is
  no shorter than that (a big model probed offloaded dots and lost a trial for a
  schedule moving some 44 GB a step, where the best took 0.39 s:
  ``studies/results/tune_time.md``).

With ``explore_front`` an offloading schedule is a point of the front in its own right
(less memory), so there it is tried as before; so is an offloading policy over the
problem's own names (``named_policies``), which has no twin here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final

from autoremat._measure.device import host_bandwidth
from autoremat._measure.measurement import OK
from autoremat._search.planning.candidates import Candidate, Verdict
from autoremat._search.planning.memory_model import MemoryModel

#: The offload labels that move a step's dots: every step's, out and back, each step.
DOTS_OFFLOADS: Final = ("offload_step", "offload_dots")
#: Each offload label's twin, keeping the same residuals on the device.
ON_DEVICE: Final[dict[str, str]] = {"offload_step": "dots_no_batch",
                                    "offload_dots": "dots_no_batch",
                                    "offload_carries": "nothing"}


def on_device(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """``params`` with each offload label swapped for its twin (``ON_DEVICE``); ``None``
    where none is used."""
    if not any(isinstance(v, str) and v in ON_DEVICE for v in params.values()):
        return None
    return {k: ON_DEVICE.get(v, v) if isinstance(v, str) else v for k, v in params.items()}


class OffloadTwins:
    """The twins of one planner's offloading candidates (module doc).

    It reads the planner's measured figures (``measured``: its timed and cut schedules,
    key -> ``(bytes, seconds)``, timed first) and its memory model, and adds a twin to the
    pool through ``add`` (a parameter set proposed in the planner's space, added to its
    pool: the pool's candidate), and sets a candidate its twin dominates aside through
    ``mark`` (``Pool.mark``). ``taken`` (the study's measured or claimed keys) and
    ``limit`` (``stop_ratio`` times the best step that fits; ``None``: none yet) come with
    each question.
    """

    def __init__(self, seq_len: int, budget_bytes: int, memory_model: MemoryModel,
                 measured: Sequence[Mapping[str, tuple[int, float]]],
                 add: Callable[[Mapping[str, Any]], Candidate],
                 mark: Callable[[Candidate, Verdict], None]) -> None:
        self.seq_len, self.budget_bytes, self.memory_model = seq_len, budget_bytes, memory_model
        self.measured, self.add, self.mark = measured, add, mark
        self.twins: dict[str, Candidate | None] = {}  # candidate key -> its twin (or none)

    def twin(self, cand: Candidate) -> Candidate | None:
        """``cand``'s twin in the pool (added there, once); ``None``: it offloads nothing."""
        key = cand.schedule.key()
        if key not in self.twins:
            params = on_device(cand.params)
            self.twins[key] = None if params is None else self.add(params)
        return self.twins[key]

    def fits(self, twin: Candidate, taken: Collection[str]) -> bool | None:
        """The twin fits the budget (timed, or sized within it, or predicted far under it);
        ``False``: it does not, or will not be measured; ``None``: not known yet."""
        size = self._measured(twin)
        if size is not None:
            return size <= self.budget_bytes
        m = twin.sized
        if m is not None:
            return m.status == OK and m.total_bytes is not None and \
                m.total_bytes <= self.budget_bytes
        if twin.verdict is not Verdict.UNDECIDED or twin.schedule.key() in taken:
            return False
        return True if self.memory_model.far_under(twin.structure, self.budget_bytes) else None

    def waits(self, cand: Candidate, taken: Collection[str]) -> bool:
        """``cand`` is not compiled yet: its twin first, or it is dominated by its twin."""
        twin = self.twin(cand)
        return twin is not None and self.fits(twin, taken) is not False

    def first(self, cand: Candidate, taken: Collection[str],
              limit: float | None) -> Candidate | None:
        """What to screen in ``cand``'s place: its twin while the twin's fit is unknown,
        ``cand`` where the twin does not fit; ``None`` where it does (``cand`` is then
        dominated)."""
        twin = self.twin(cand)
        if twin is None:
            return cand
        fits = self.fits(twin, taken)
        if fits is None:
            return twin
        if fits or self.copies_too_slow(cand, twin, limit):
            self.mark(cand, Verdict.DOMINATED)
            return None
        return cand

    def copies_too_slow(self, cand: Candidate, twin: Candidate, limit: float | None) -> bool:
        """Moving what ``cand`` offloads over the host link takes longer than ``limit``
        seconds (module doc). It moves at least what its twin keeps more and, offloading
        dots, every step's dots (``MemoryModel.step_dots_bytes``): an inner level's copies
        come and go chunk by chunk, so the twin keeps only a chunk's more (``5000x2
        nothing/offload_dots`` of a big model passed the first bound alone, was probed and
        ran over the budget: ``studies/results/tune_time.md``)."""
        if limit is None:
            return False
        kept, own = self._bytes(twin), self.memory_model.predict(cand.structure)
        moved = 0.0 if kept is None or own is None else kept - own
        per_step = self.memory_model.step_dots_bytes()
        if per_step is not None and any(v in DOTS_OFFLOADS for v in cand.params.values()):
            moved = max(moved, self.seq_len * per_step)
        bandwidth = host_bandwidth() if moved > 0 else None
        return bandwidth is not None and moved / bandwidth > limit

    def _measured(self, cand: Candidate) -> int | None:
        key = cand.schedule.key()
        return next((figures[key][0] for figures in self.measured if key in figures), None)

    def _bytes(self, cand: Candidate) -> float | None:
        """``cand``'s bytes: measured, sized (or stated by a compiler out of memory), else
        the memory model's guess."""
        measured = self._measured(cand)
        if measured is not None:
            return float(measured)
        m = cand.sized
        if m is not None and m.size_bytes is not None:
            return float(m.size_bytes)
        return self.memory_model.predict(cand.structure)
