"""An unfused candidate's twin: the same schedule with the readout fused into the step.

Where fusing the readout is a choice of the search (``Problem.fuse_choice``), a schedule
and its twin differ only in where the readout runs: unfused, the ``(T, B, H)`` stack of
per-step outputs, its cotangent and the readout's residuals are held besides what the
schedule keeps -- the same bytes whatever the schedule. So once both twins of one
schedule were measured (the seeds: ``100x100`` fused and unfused), what unfusing costs is
known, and an unfused candidate whose fused twin's figure plus that cost is over the
budget is over too: it is not compiled (``Planner._surely_over``).

On a TPU v5e the big model (T=10^4, batch 128, hidden 1024, 12 GB) compiled four to six
unfused schedules a tune, 2-10 s each on the compile threads, none timed: unfusing cost
10.3 GB there (its stack and cotangent, 5.24 GB each), and every fused twin took 1.6 GB
or more (``studies/results/tune_time.md``).

The figures are each schedule's ``fit_bytes`` (the measured runtime peak where there is
one); a fused twin only sized counts as its size less the most any size overstated a
run (``Planner.overstated``); what unfusing costs is the least any measured pair showed.
"""

from __future__ import annotations

from autoremat._search.candidates import Candidate


class FuseTwins:
    """The fuse-twin part of ``Planner`` (module doc); the attributes declared here are the
    planner's."""

    budget_bytes: int
    pool: dict[str, Candidate]
    timed: dict[str, tuple[int, float]]
    cut: dict[str, tuple[int, float]]
    overstated: int | None

    def unfusing(self) -> int | None:
        """The least bytes unfusing cost a schedule both of whose twins were measured
        (``None``: no such pair yet)."""
        figures = {**self.cut, **self.timed}
        costs = []
        for key, (fit, _) in figures.items():
            schedule = self.pool[key].schedule if key in self.pool else None
            if schedule is None or schedule.fuse is not False:
                continue
            fused = figures.get(schedule.with_fuse(True).key())
            if fused is not None:
                costs.append(fit - fused[0])
        return min(costs) if costs else None

    def unfused_over(self, cand: Candidate) -> bool:
        """``cand`` is unfused, and its fused twin's figure plus ``unfusing()`` is over the
        budget (module doc)."""
        if cand.schedule.fuse is not False:
            return False
        cost = self.unfusing()
        if cost is None:
            return False
        key = cand.schedule.with_fuse(True).key()
        figures = {**self.cut, **self.timed}
        if key in figures:
            fused: float | None = figures[key][0]
        else:
            twin = self.pool.get(key)
            sized = None if twin is None else twin.sized
            fused = None if sized is None or sized.total_bytes is None else (
                sized.total_bytes - (self.overstated or 0))
        return fused is not None and fused + cost > self.budget_bytes
