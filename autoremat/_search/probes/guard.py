"""Probe a risky choice when the planner first proposes it, and every combination it uses.

``autoremat._search.probes.probe`` checks a risky choice (an offload placement, a GPU
compiler option: ``probe.checks``) on a short instance of the problem. A study no
longer probes them all before its search (three offload probes took a fifth of a big
model's tune: ``studies/results/tune_time.md``): a ``ProbeGuard`` holds the verdicts, and the
planner asks it (``Planner.probed``) before it compiles a candidate:

* a candidate that uses no risky choice is let through at once;
* each risky choice it uses is probed -- the first time only -- as
  ``probe.checks`` builds it, on its own;
* a candidate that uses two or more (``offload_carries`` at an outer level with
  ``offload_dots`` at the innermost: each passed alone on a TPU, their
  combination failed to compile) has that combination probed too, on the
  candidate's own structure at the probe's length (``space.propose`` of its
  parameters). A combination is a set of choices; only where it is stored (the study's
  ``attrs.PROBE``, the cache) is it one label, the choices joined by `` & ``
  (``"offload_carries & offload_dots"``: ``combination``, read back by ``choices_of``);
* a candidate that offloads at an ``unroll`` above 1 counts that as one more choice
  (``"unroll>1"``), probed only within a combination of two or more choices (a probe of
  a big model's choice takes seconds), but left out like one when a trial
  fails to compile: at T=10^4 on a TPU ``offload_dot_with_no_batch_dims`` failed to
  compile at unroll 2, 4 and 8 alike ("The async-start expects the shape of operand 0 to
  match ...", the unrolled stack's shape) though it had passed its probe at unroll 1
  (``studies/results/tune_time.md``); the trial is lost once, then that choice unrolled
  never again on that platform.

A choice or combination left out is never compiled and never proposed again in
the study: the planner asks ``allows`` before a compile and drops what is left out
(``refused``, ``refused_combinations``), and tells ``failed_in_trial`` what it measured. A
combination that compiled at the probe's length but fails to compile in a trial
is recorded as left out too (``compile_failed``).

Every verdict is recorded in the study (user attr ``attrs.PROBE``, read back
by other workers and resumed studies, shown by ``autoremat pareto``) and in a
cache file beside the storage (``autoremat._search.probes.cache``), so a verdict
costs nothing twice on the same platform, device kind and jax/jaxlib.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from autoremat._errors import one_line
from autoremat._measure.failure import COMPILE
from autoremat._measure.measurement import ERROR, Measurement
from autoremat._measure.problem import Problem
from autoremat._schedules.base import NO_NAMES, Check
from autoremat._schedules.policy import Policy
from autoremat._search import space
from autoremat._search.attrs import PROBE
from autoremat._search.probes import probe as probe_module
from autoremat._search.probes.cache import VerdictCache
from autoremat._search.probes.probe import ProbeVerdict, Source
from autoremat._search.reports import ProbeChecked

if TYPE_CHECKING:
    import optuna

    from autoremat._search.storage import StudyLock

#: Joins the labels of a combination of choices.
JOIN: Final = " & "  # a label may hold "+" (``names``: "offload(a,b,+3)")
#: The label of an offloading candidate's unroll above 1, a choice of its own (module doc).
UNROLLED: Final = "unroll>1"


#: A choice, or a combination of choices, as the guard keys its verdicts.
Choices = frozenset[str]


def combination(labels: Choices) -> str:
    """The stored label of a set of choices: sorted, joined by `` & ``."""
    return JOIN.join(sorted(labels))


def choices_of(label: str) -> Choices:
    """The set of choices of a stored label (``combination``'s inverse)."""
    return frozenset(label.split(JOIN))


class ProbeGuard:
    """The verdicts of one study's probes, probing on demand (module doc)."""

    def __init__(self, problem: Problem, platform: str, study: optuna.Study, lock: StudyLock,
                 cache: VerdictCache | None = None,
                 on_note: Callable[[ProbeChecked], None] | None = None,
                 named: Mapping[str, Policy] = NO_NAMES) -> None:
        self.problem, self.platform, self.study, self.lock = problem, platform, study, lock
        self.cache, self.on_note, self.named = cache, on_note, named
        singles = probe_module.checks(problem.seq_len, platform, named)
        self.labels = frozenset(singles)
        self.offloading = frozenset(k for k, c in singles.items() if c.offloads)
        self.verdicts: dict[Choices, ProbeVerdict] = {}
        self.probed: list[Choices] = []  # probed by this guard (not read back)
        self._target: Problem | None = None
        self._reference: list[Any] | None = None
        self._no_reference = ""
        self._read_study()
        known = [] if cache is None else [  # the cache's verdicts on these choices: at once
            choices_of(k) for k in cache.labels() if choices_of(k) <= self.labels]
        for choices in known:
            cached = None if choices in self.verdicts else self._cached(choices)
            if cached is not None:
                self._record(choices, cached)

    # -- what is known -----------------------------------------------------------------
    @property
    def refused(self) -> frozenset[str]:
        """The single choices left out (the planner's proposals skip them)."""
        return frozenset(label for k, v in self.verdicts.items() if not v.offered
                         and len(k) == 1 for label in k)

    @property
    def refused_combinations(self) -> frozenset[Choices]:
        return frozenset(k for k, v in self.verdicts.items() if not v.offered and len(k) > 1)

    def lines(self) -> dict[str, str]:
        """The verdicts as stored: label -> one line (``ProbeVerdict.text``)."""
        return {combination(k): v.text() for k, v in self.verdicts.items()}

    def used(self, params: Mapping[str, Any]) -> frozenset[str]:
        """The risky choices a candidate's parameters use; where one offloads, its unroll
        above 1 too (``"unroll>1"``, module doc)."""
        used = frozenset(v for v in params.values() if isinstance(v, str) and v in self.labels)
        unroll = max((v for k, v in params.items() if k.endswith("_unroll")
                      and isinstance(v, int)), default=1)
        if unroll > 1 and used & self.offloading:
            used |= {UNROLLED}
        return used

    # -- the planner's question --------------------------------------------------------
    def allows(self, params: Mapping[str, Any]) -> bool:
        """Every risky choice in ``params`` and their combination passed its probe
        (probed now where none has)."""
        used = self.used(params)
        if not used:
            return True
        if any(combo <= used for combo in self.refused_combinations):
            return False
        choices = used - {UNROLLED}
        for label in sorted(choices):
            if not self._verdict(frozenset({label}),
                                 functools.partial(self._single, label)).offered:
                return False
        if len(choices) < 2:
            return True
        return self._verdict(used, lambda: self._combined(params, used)).offered

    def failed_in_trial(self, params: Mapping[str, Any], m: Measurement | None) -> None:
        """``compile_failed`` where ``m`` (a candidate's sizing, or its trial's measurement)
        failed to compile -- at full length, or for its short run (``failed_at``) -- and not
        for want of memory."""
        if m is not None and m.status == ERROR and m.failed_at == COMPILE and not m.out_of_memory:
            self.compile_failed(params, m.reason)

    def compile_failed(self, params: Mapping[str, Any], reason: str) -> None:
        """A candidate failed to compile in a trial (at full length, or its short run): a
        combination it uses is left out from now on (a single choice stays: the failure
        may be the schedule's)."""
        used = self.used(params)
        if len(used) >= 2:
            self._record(used, ProbeVerdict(False, reason, Source.TRIAL), put=True)

    # -- verdicts ----------------------------------------------------------------------
    def _verdict(self, choices: Choices, make: Callable[[], Check | None]) -> ProbeVerdict:
        if choices not in self.verdicts:
            self._read_study()  # another worker may have probed it meanwhile
        if choices not in self.verdicts:
            cached = self._cached(choices)
            if cached is not None:
                self._record(choices, cached)
            else:
                check = make()
                verdict = (self._probe(check) if check is not None else ProbeVerdict(
                    True, "not probed (no instance of it at the probe's length)"))
                self.probed.append(choices)
                self._record(choices, verdict, put=check is not None)
        return self.verdicts[choices]

    def _cached(self, choices: Choices) -> ProbeVerdict | None:
        got = None if self.cache is None else self.cache.get(combination(choices))
        return None if got is None else ProbeVerdict.cached(got)

    def _record(self, choices: Choices, verdict: ProbeVerdict, *, put: bool = False) -> None:
        """The verdict in the study (its first worker's wins), the cache (``put``) and a
        note; stored as one line under its label (``combination``)."""
        label = combination(choices)
        self.verdicts[choices] = verdict
        with self.lock:
            recorded = dict(self.study.user_attrs.get(PROBE) or {})
            if label not in recorded:
                recorded[label] = verdict.text()
                self.study.set_user_attr(PROBE, recorded)
            else:  # the first worker's wins
                self.verdicts[choices] = ProbeVerdict.parse(str(recorded[label]))
        if put and self.cache is not None:
            self.cache.put(label, self.verdicts[choices].stored().text())
        if self.on_note is not None:
            self.on_note(ProbeChecked(label, self.verdicts[choices]))

    def _read_study(self) -> None:
        recorded = self.study.user_attrs.get(PROBE)
        if isinstance(recorded, Mapping):
            for k, v in recorded.items():
                self.verdicts.setdefault(choices_of(str(k)), ProbeVerdict.parse(str(v)))

    # -- probing -----------------------------------------------------------------------
    def target(self) -> Problem:
        """The probe's instance of the problem (``probe.small``), made once."""
        if self._target is None:
            self._target = probe_module.small(self.problem)
        return self._target

    def _single(self, label: str) -> Check | None:
        return probe_module.checks(self.target().seq_len, self.platform, self.named).get(label)

    def _combined(self, params: Mapping[str, Any], used: frozenset[str]) -> Check | None:
        """The candidate's structure at the probe's length, holding the same choices."""
        n = self.target().seq_len
        try:
            schedule, got = space.propose(dict(params), n, self.platform, random.Random(0),
                                          fuse=self.problem.fuse_choice, named=self.named)
        except Exception:  # a structure that has no instance this short
            return None
        if self.used(got) != used:
            return None
        singles = probe_module.checks(n, self.platform, self.named)
        return Check(schedule, offloads=any(singles[lb].offloads for lb in used
                                            if lb in singles))

    def _probe(self, check: Check) -> ProbeVerdict:
        import jax

        target = self.target()
        with jax.default_matmul_precision("highest"):  # as probe.probe
            if self._reference is None and not self._no_reference:
                try:
                    self._reference = probe_module.reference(target)
                except Exception as e:
                    self._no_reference = (f"no reference ran at T={target.seq_len}: "
                                          f"{one_line(e)}")
            if self._reference is None:
                return ProbeVerdict(False, self._no_reference)
            return probe_module.verdict(target, check, self._reference)

