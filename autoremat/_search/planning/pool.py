"""A planner's pool: the candidate schedules it may measure, drawn from the search space.

The pool starts with the space's seeds (``space.seeds``), every structure of a short
scan (``short_scans``) and ``POOL_SIZE`` random draws (``space.propose``), and grows
around each new best (``space.neighbours``). Its draws follow one seeded random
stream, so a worker's pool -- and its trial sequence -- is the same on every run.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import Any, Final

from autoremat._schedules.base import Schedule
from autoremat._schedules.groups import GroupsSchedule
from autoremat._schedules.policy import Policy
from autoremat._search.planning.candidates import Candidate, Verdict
from autoremat._search.planning.predict import Structure
from autoremat._search.planning.short_scans import short_scan_params
from autoremat._search.space import neighbours, parameters, propose, seeds

#: Random draws in the initial pool.
POOL_SIZE: Final = 300


class Pool(Mapping[str, Candidate]):
    """The candidates by schedule key (module doc), in the space of one problem.

    Its ``refused`` choices (the study's probe left them out: no longer proposed) and
    ``taken`` keys (in the study: measured, or claimed by a worker; not open) are read
    here and set by ``refuse`` and ``take``; a candidate's verdict is set by ``mark``
    alone.
    """

    def __init__(self, seq_len: int, platform: str, *, seed: int = 0,
                 refused: frozenset[str] = frozenset(), fuse: bool = False,
                 named: Mapping[str, Policy] | None = None, layer_stack: bool = False) -> None:
        self.seq_len, self.platform, self.fuse = seq_len, platform, fuse
        self.named = dict(named or {})
        self.layer_stack = layer_stack
        self._refused = refused
        self._taken: frozenset[str] = frozenset()
        self.rng = random.Random(seed)
        self._candidates: dict[str, Candidate] = {}
        for schedule, params in seeds(seq_len, platform, refused, fuse):
            self.add(schedule, params)
        for p in short_scan_params(seq_len, platform, self.rng, refused, self.named):
            self.add(*self.propose(p))
        for _ in range(POOL_SIZE):
            self.add(*self.propose({}))

    @property
    def refused(self) -> frozenset[str]:
        """Choices the study's probe left out: no longer proposed."""
        return self._refused

    @property
    def taken(self) -> frozenset[str]:
        """Keys in the study (measured, or claimed by a worker): not open."""
        return self._taken

    def refuse(self, refused: frozenset[str]) -> None:
        """The choices the study's probe has left out, from now on."""
        self._refused = refused

    def take(self, keys: set[str] | frozenset[str]) -> None:
        """The keys the study holds now (every worker's)."""
        self._taken = frozenset(keys)

    def mark(self, cand: Candidate, verdict: Verdict) -> None:
        """``cand``'s verdict: why this planner will not time it (``Verdict.UNDECIDED``:
        open again)."""
        cand._verdict = verdict

    def __getitem__(self, key: str) -> Candidate:
        return self._candidates[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._candidates)

    def __len__(self) -> int:
        return len(self._candidates)

    def propose(self, wanted: Mapping[str, Any]) -> tuple[Schedule, dict[str, Any]]:
        """``space.propose`` in this pool's space (its refused and named choices)."""
        return propose(wanted, self.seq_len, self.platform, self.rng, self.refused,
                       self.fuse, self.named)

    def add(self, schedule: Schedule, params: dict[str, Any]) -> None:
        """A candidate, or a measured schedule (``params`` empty). A groups draw of the
        space joins only for a layer stack (elsewhere: 42 of 56 compiles at T=32, all over)."""
        key = schedule.key()
        if params and schedule.kind == GroupsSchedule.kind and not self.layer_stack:
            return
        if key not in self._candidates:
            self._candidates[key] = Candidate(schedule, params,
                                              Structure.of(schedule, self.seq_len))

    def proposed(self, wanted: Mapping[str, Any]) -> Candidate:
        """The candidate of ``propose(wanted)``, added."""
        schedule, params = self.propose(wanted)
        self.add(schedule, params)
        return self._candidates[schedule.key()]

    def candidate(self, schedule: Schedule) -> Candidate:
        """The candidate of a schedule that came from elsewhere (the study: a seed, a
        retry of a trial whose worker died, a measured trial), added when there is none."""
        self.add(schedule, {})
        return self._candidates[schedule.key()]

    def grow_around(self, key: str) -> None:
        """A new best's neighbours in the space join (none for one the space did not draw)."""
        params = self._candidates[key].params
        if params:
            for schedule, near in neighbours(params, self.seq_len, self.platform, self.rng,
                                             self.refused, self.fuse, self.named):
                self.add(schedule, near)

    def unrolled(self, key: str) -> list[Candidate]:
        """The candidates of ``key``'s schedule at each other unroll its innermost scan may
        take (the space's ``*_unroll`` choices), added; none for a schedule the space did
        not draw (no params)."""
        params = self._candidates[key].params
        names = {k for k in params if k.endswith("_unroll")}
        if not names:
            return []
        out: list[Candidate] = []
        for param in parameters(params, self.seq_len, self.platform, self.refused, self.fuse,
                                self.named):
            if param.name not in names:
                continue
            for value in param.choices:
                if value == params[param.name]:
                    continue
                schedule, chosen = propose(  # its own stream: the pool's draws stay as they are
                    {**params, param.name: value}, self.seq_len, self.platform,
                    random.Random(0), self.refused, self.fuse, self.named)
                if any(chosen.get(k) != v for k, v in params.items() if k != param.name):
                    continue  # a choice not offered here was drawn anew: not its unroll
                self.add(schedule, chosen)
                found = self._candidates.get(schedule.key())
                if found is not None and schedule.key() != key and all(c is not found for c in out):
                    out.append(found)
        return out

    def open(self) -> list[Candidate]:
        """The candidates still undecided and not in the study, in the pool's order."""
        return [c for k, c in self._candidates.items()
                if c.verdict is Verdict.UNDECIDED and k not in self.taken]

    def reopen_dominated(self) -> None:
        """Those set aside as dominated, not in the study, are open again (a caller that
        must measure a given number)."""
        for key, cand in self._candidates.items():
            if cand.verdict is Verdict.DOMINATED and key not in self.taken:
                self.mark(cand, Verdict.UNDECIDED)
