"""The memory model: a schedule's compiled total before compiling it, so the planner skips
what is surely over the budget (``autoremat._search.planning.planner``).

``MemoryModel`` fits ``total_bytes`` on what a schedule stores (``Features.terms``:
carries, steps kept whole, steps' dots; ``nested.level_terms``) and whether it is
unfused (the readout's stack), over the schedules sized so far, each by its relative
error and with no pull towards a prior: plain's point alone sets the bytes of a whole
step (a fit pulled towards a prior put them far under, and let the planner compile
schedules that ran out of memory). It only *orders* and screens candidates: every
figure the tuner reports is measured.
"""

from __future__ import annotations

from typing import Final

from autoremat._search.planning.predict import Structure, _dot, _ridge

#: A schedule the memory model predicts at this many times the budget is not compiled
#: (``MemoryModel.far_over``): on a user's GRU (T=160, budget half of plain's) the
#: model's guesses were 0.63-1.25x the compiled totals, and 21 of 27 schedules it
#: compiled were 1.6-3.7x over the budget.
FAR_OVER: Final = 1.5
#: ... once it is fit on at least this many sized schedules (the seeds, typically).
FAR_POINTS: Final = 5


def _memory_row(structure: Structure) -> list[float]:
    """The memory model's features: a constant, ``Structure.terms``, and unfused (the
    per-step outputs stacked: the same bytes for every unfused schedule of a problem)."""
    return [1.0, *structure.terms, float(structure.kind.endswith("/unfused"))]


class MemoryModel:
    """``total_bytes`` before compiling, from what a schedule stores (``Structure.terms``).

    ``predict``: a least-squares fit of bytes on the terms over the schedules
    sized so far (to rank them; ``None`` before two were sized), never under ``least``,
    what the step's arguments and outputs take: where every schedule is at that floor (a
    TPU keeps the seed's residuals on chip), a guess under it let the planner compile
    candidates that, sized at the floor, were dominated by a faster one timed there.
    ``far_over``: predicted far over the budget (``FAR_OVER``), not compiled;
    ``far_under``: far under it.
    ``surely_over``: a schedule that stores at least as much as one already over
    the budget (``Structure.stores_at_least``: more saved policies at the same
    lengths, a larger unroll, plain at any unroll once plain is over), or one
    predicted at least as large as a program the compiler refused for want of
    device memory (``refused``: the size it stated) -- it is not compiled.
    """

    def __init__(self) -> None:
        self.points: list[tuple[Structure, float]] = []
        self.over: list[Structure] = []
        self.refused: list[float] = []  # sizes the compiler stated, out of memory
        self._coef: list[float] | None = None  # the fit (``_fit``), made when first needed
        self._trusted: bool | None = None  # ``far_over``'s check of the fit
        #: Bytes under every schedule's total (``breakdown.least_bytes``; 0: not known
        #: yet): no guess is under it.
        self.least = 0.0

    def add(self, structure: Structure, total_bytes: int, over_budget: bool,
            refused: bool = False) -> None:
        """One sized schedule; ``refused``: ``total_bytes`` is the size the compiler
        stated when it ran out of memory (over the budget too)."""
        self.points.append((structure, float(total_bytes)))
        if over_budget or refused:
            self.over.append(structure)
        if refused:
            self.refused.append(float(total_bytes))
        self._coef = None
        self._trusted = None

    def mark_over(self, structure: Structure) -> None:
        """``structure`` was over the budget by its run (sized at compile as fitting)."""
        self.over.append(structure)

    def far_over(self, structure: Structure, budget_bytes: int) -> bool:
        """Predicted at ``FAR_OVER`` times the budget or more, by a fit on at least
        ``FAR_POINTS`` sized schedules that misses none of them by ``FAR_OVER - 1`` of
        its size or more: not worth a compile."""
        guess = self.predict(structure) if len(self.points) >= FAR_POINTS else None
        return guess is not None and guess >= FAR_OVER * budget_bytes and self._trust()

    def far_under(self, structure: Structure, budget_bytes: int) -> bool:
        """Predicted at the budget over ``FAR_OVER`` or less, by a fit ``far_over`` trusts:
        sure to fit without a compile (an offload's twin, ``offload_twins``)."""
        guess = self.predict(structure) if len(self.points) >= FAR_POINTS else None
        return guess is not None and guess * FAR_OVER <= budget_bytes and self._trust()

    def step_dots_bytes(self) -> float | None:
        """Bytes of one step's partial residuals (what a ``dots`` policy keeps of a step), by
        a fit ``far_over`` trusts; ``None``: no such fit, or it saw no dots kept."""
        coef = self._fit() if len(self.points) >= FAR_POINTS else None
        if coef is None or not self._trust() or not any(s.terms[2] for s, _ in self.points):
            return None
        return coef[3] if coef[3] > 0 else None

    def _trust(self) -> bool:
        """The fit misses none of its points by ``FAR_OVER - 1`` of its size, and storing
        more of a term costs no fewer bytes (a slope taking 5% of the smallest point off
        at the largest term: a fit bent through few points, not a machine); once per fit."""
        if self._trusted is None:
            fits = all(abs((self.predict(s) or 0.0) - y) < (FAR_OVER - 1) * y
                       for s, y in self.points)
            rows = [_memory_row(s) for s, _ in self.points]
            low = 0.05 * min(y for _, y in self.points)
            self._trusted = fits and all(c * max(r[j] for r in rows) >= -low
                                         for j, c in enumerate(self._fit() or []) if j)
        return self._trusted

    def surely_over(self, structure: Structure) -> bool:
        if any(structure.stores_at_least(o) for o in self.over):
            return True
        if not self.refused:
            return False
        guess = self.predict(structure)
        return guess is not None and guess >= min(self.refused)

    def predict(self, structure: Structure) -> float | None:
        coef = self._fit()
        if coef is None:
            return None
        return max(self.least, 0.5 * min(y for _, y in self.points),
                   _dot(coef, _memory_row(structure)))

    def _fit(self) -> list[float] | None:
        """Bytes per unit of ``_memory_row``, each point weighed by its relative error, not
        pulled towards a prior (module doc); ``None`` before two schedules were sized.

        Until a schedule that keeps steps' dots is sized, a step's dots are guessed at a
        whole step's bytes (they are part of it): an upper bound, not 0. Where the seeds
        keep no dots, a fit would put them at 0 bytes, and neighbours keeping every step's
        dots (an outer ``dots`` level) would be compiled, out of memory.
        The seed LSTM's dots are 0.66 of its whole step (H=64, compiled on a CPU): such a
        guess is at most 1.5x the truth, so one ``FAR_OVER`` the budget is over it; where
        a step's dots are a smaller share, ``far_over`` may skip a schedule keeping many
        dots that fits, until one keeping dots is sized."""
        if self._coef is None and len(self.points) >= 2:
            rows = [_memory_row(s) for s, _ in self.points]
            ys = [y for _, y in self.points]
            self._coef = _ridge(rows, ys, [min(ys), 0.0, 0.0, 0.0, 0.0],
                                [1.0 / y**2 for y in ys], ridge=1e-9)
            if not any(row[3] for row in rows):
                self._coef[3] = max(self._coef[3], self._coef[2])
        return self._coef
