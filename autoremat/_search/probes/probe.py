"""Before a study offers a risky choice, check it on a small instance of the user's problem.

Some choices of the search space depend on the device and its XLA, not only on
the schedule: offload policies (``offload_dot_with_no_batch_dims``) failed to
compile in every trial on an H200 (jax 0.11.2, "INTERNAL: ... Expected
instruction to have shape equal to ..."), and XLA:GPU gave silently wrong
gradients for offloaded scan residuals until openxla/xla 46308. A kind names
such choices (``Schedule.checks``: label -> a schedule using it); before the
search, ``probe`` runs each on a small instance of the problem: its own
(``Problem.small``), else the problem cut to ``PROBE_LENGTH`` steps
(``Problem.at_length``), else the problem itself:

1. compile it (a failure leaves the choice out, with XLA's first line);
2. for a choice that offloads, check that the lowered step places something in
   host memory (``autoremat._jax.HOST_PLACEMENT_CALL``): on a CPU jax lowers the
   move to nothing, so the policy compiles but only repeats
   ``dots_with_no_batch_dims_saveable`` -- left out as such;
3. run it and the plain scan once (remat of each step where the plain scan
   fails: a problem too large to keep every step's residuals) and compare every
   output of the step (the loss and what the gradients updated) within rtol ``RTOL`` (atol
   ``ATOL_FRACTION`` of the output's largest magnitude: float32 sums over ``T``
   steps reassociate), both at ``"highest"`` matmul precision (a TPU's default float32
   matmul agrees to about 3 digits); a mismatch or a run failure leaves it out.

Offload is probed per placement (``nested_space.OFFLOAD_POLICIES``: each step, the
innermost level, an outer level's chunk-boundary carries by name), each on its
own, so a placement this XLA refuses leaves out only that one; a combination of
placements (each passed alone on a TPU, together they failed to compile) is probed
as one more choice when the planner proposes it (``guard``).

The trade-off: a probe costs one compile and two short runs per choice (a few
seconds, more for a big model: ``studies/results/tune_time.md``; once per platform and
jax version)
and sees the problem at a short length; a failure that only appears at full length
still reaches a trial -- which then fails without using up one of ``n_trials``
(``autoremat._search.tune``; a combination that fails so is left out from then on).

A study probes lazily (``autoremat._search.probes.guard``): a choice when the
planner first proposes a schedule using it, and each combination of choices it
proposes. A verdict is a ``ProbeVerdict`` (offered or not, why, and where it came from:
a probe, the cache, a trial); it is recorded in the study as one line (user attr
``attrs.PROBE``: label -> ``"offered: ..."`` or ``"left out: ..."``; a resumed study or
another worker reads them back) and cached beside the storage
(``autoremat._search.probes.cache``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from autoremat._errors import one_line
from autoremat._measure.failure import COMPILE, words
from autoremat._measure.problem import Problem
from autoremat._schedules import KINDS, nested, plain
from autoremat._schedules.base import NO_NAMES, Check, Schedule
from autoremat._search import space

#: The probe's sequence length (when the problem has ``at_length``): long enough for
#: two levels of 8, short enough to compile in about a second.
PROBE_LENGTH: Final = 64
#: Outputs must match the plain scan's within this relative tolerance (CONTRIBUTING).
RTOL: Final = 1e-5
#: atol as a fraction of an output's largest magnitude. On a TPU at ``highest``
#: precision an offloaded 8x8 schedule's Adam state differed from the plain scan's by
#: 1.8e-8 where the largest value was 1e-3 (1.8e-5 of it: float32 sums reassociated,
#: ``studies/results/search_tpu.md``), and on the big model (hidden 1024, batch 128) by
#: 1.09e-7 (1.1e-4 of it, ``studies/results/tune_time.md``): Adam's first update divides
#: each gradient by its own magnitude, so a gradient near zero magnifies its rounding. A
#: miscompiled offload is off by the size of the values, far past 1e-3 (the tests check
#: exactness, not this).
ATOL_FRACTION: Final = 1e-3
#: The probe's rules, part of a cached verdict's key (``cache``): a verdict found
#: under other tolerances is not reused.
RULES: Final = f"rtol {RTOL}, atol {ATOL_FRACTION} of the largest value"
OFFERED: Final = "offered"
LEFT_OUT: Final = "left out"
#: How the reason of a verdict starts when the step failed to compile (the probe's, or a
#: trial's: ``measure``'s reason): this XLA refuses the choice, on any problem.
COMPILE_FAILURE: Final = words(COMPILE)


class Source(enum.Enum):
    """Where a verdict came from."""

    PROBE = "probe"  # a probe ran it
    CACHE = "cache"  # the cache beside the storage (``cache``)
    TRIAL = "trial"  # a trial failed to compile it (``guard``; no other failure of a trial)


#: What a verdict's stored line ends with, by where it came from.
_SUFFIX: Final = {Source.PROBE: "", Source.CACHE: " (cached)",
                  Source.TRIAL: " (in a trial, not the probe)"}


@dataclass(frozen=True)
class ProbeVerdict:
    """A choice's verdict: offered or left out, why, and where it came from. Stored as one
    line (``text``: ``"offered: ..."`` or ``"left out: ..."``, in the study's ``attrs.PROBE``
    and the cache) and read back from it (``parse``)."""

    offered: bool
    why: str
    source: Source = Source.PROBE

    @property
    def compile_failed(self) -> bool:
        """Left out because its step failed to compile: the probe's (its reason starts with
        ``COMPILE_FAILURE``) or a trial's (``Source.TRIAL``: only a compile failure in a
        trial leaves a choice out). A verdict that holds for every problem (``cache``)."""
        return not self.offered and (self.source is Source.TRIAL
                                     or self.why.startswith(COMPILE_FAILURE))

    def text(self) -> str:
        """The stored line."""
        return f"{OFFERED if self.offered else LEFT_OUT}: {self.why}{_SUFFIX[self.source]}"

    @classmethod
    def parse(cls, text: str) -> ProbeVerdict:
        """A stored line read back (``text``'s inverse; any line a study holds)."""
        offered = not text.startswith(LEFT_OUT)
        why = text.removeprefix(OFFERED if offered else LEFT_OUT).removeprefix(": ")
        for source in (Source.CACHE, Source.TRIAL):
            if why.endswith(_SUFFIX[source]):
                return cls(offered, why.removesuffix(_SUFFIX[source]), source)
        return cls(offered, why)

    @classmethod
    def cached(cls, text: str) -> ProbeVerdict:
        """A line the cache holds, as read from it (whatever it came from before)."""
        found = cls.parse(text)
        return cls(found.offered, found.why + _SUFFIX[found.source], Source.CACHE)

    def stored(self) -> ProbeVerdict:
        """This verdict as the cache keeps it: not marked as read from it."""
        return self if self.source is not Source.CACHE else ProbeVerdict(self.offered, self.why)


def checks(seq_len: int, platform: str, named: space.Named = NO_NAMES) -> dict[str, Check]:
    """Every kind's ``Schedule.checks`` at ``seq_len`` on ``platform`` (with the problem's
    ``named`` policies), and the space's own (``space.checks``: the ``compiler`` choices
    on a GPU)."""
    out: dict[str, Check] = {}
    for kind in KINDS.values():
        out.update(kind.checks(seq_len, platform, named))
    out.update(space.checks(seq_len, platform))
    return out


def small(problem: Problem, length: int = PROBE_LENGTH) -> Problem:
    """``problem.small()`` when it has one; else ``problem.at_length(length)`` when it is
    longer and has one; else (or when that refuses: ``ProblemError``, or fails)
    ``problem`` itself."""
    try:
        if problem.small is not None:
            return problem.small()
        if problem.at_length is not None and problem.seq_len > length:
            return problem.at_length(length)
    except Exception:  # ProblemError, or worse: a probe at full size is slower, not wrong
        pass
    return problem


def probe(problem: Problem, platform: str, *, length: int = PROBE_LENGTH,
          choices: Mapping[str, Check] | None = None,
          named: space.Named = NO_NAMES) -> dict[str, ProbeVerdict]:
    """Check each choice on ``problem`` cut to ``length`` steps (module doc): label -> its
    verdict. ``choices``: default ``checks(...)`` of that length on ``platform``; empty:
    nothing is compiled."""
    if choices is None and not checks(min(problem.seq_len, length), platform, named):
        return {}  # nothing to check: the problem is not even cut
    target = small(problem, length)
    if choices is None:
        choices = checks(target.seq_len, platform, named)
    if not choices:
        return {}
    import jax

    with jax.default_matmul_precision("highest"):  # TPU's default agrees to ~3 digits
        return _probe_all(target, choices)


def _probe_all(target: Problem, choices: Mapping[str, Check]) -> dict[str, ProbeVerdict]:
    """Each choice's verdict, against the plain scan run once (``probe``)."""
    try:
        outputs = reference(target)
    except Exception as e:  # neither runs: nothing to compare with
        why = f"no reference ran at T={target.seq_len}: {one_line(e)}"
        return {label: ProbeVerdict(False, why) for label in choices}
    return {label: verdict(target, check, outputs) for label, check in choices.items()}


def reference(problem: Problem) -> list[Any]:
    """The plain scan's outputs; where it fails (a problem too large to keep every
    step's residuals), those of remat of each step, which any fitting problem runs."""
    try:
        return _run(problem, plain(problem.seq_len), False)[1]
    except Exception:
        return _run(problem, nested([problem.seq_len]), False)[1]


def verdict(problem: Problem, check: Check, reference: list[Any]) -> ProbeVerdict:
    """``check`` compiled and run on ``problem``, its outputs against the plain scan's
    (``reference``, the outputs of ``reference(problem)``): the module doc's steps 1-3."""
    where = f"{check.schedule.describe()} at T={problem.seq_len}"
    try:
        placed, got = _run(problem, check.schedule, check.offloads)
    except _CompileFailed as e:
        return ProbeVerdict(False, f"{COMPILE_FAILURE} ({where}): {e}")
    except Exception as e:
        return ProbeVerdict(False, f"run failed ({where}): {one_line(e)}")
    if check.offloads and not placed:
        return ProbeVerdict(False, "offloads nothing on this device (the compiled step places "
                            "nothing in host memory; it would repeat "
                            "dots_with_no_batch_dims_saveable)")
    worst = _mismatch(got, reference)
    if worst:
        return ProbeVerdict(False, f"loss or gradients differ from the plain scan ({where}): "
                            f"{worst}")
    return ProbeVerdict(True, f"compiles, loss and gradients match the plain scan ({where})")


class _CompileFailed(Exception):
    """Building or compiling the probe's step failed (the message: one line)."""


def _run(problem: Problem, schedule: Schedule, offloads: bool) -> tuple[bool, list[Any]]:
    """Compile and run ``schedule``'s step once: (the lowered step places something in
    host memory, the step's output leaves as numpy arrays)."""
    import jax
    import numpy as np

    try:
        step, args = problem.build(schedule)
        lowered = jax.jit(step).lower(*args)
        options: dict[str, Any] = dict(schedule.compiler_options)
        executable = lowered.compile(compiler_options=options or None)
    except Exception as e:
        raise _CompileFailed(one_line(e)) from None
    placed = False
    if offloads:
        from autoremat._jax import HOST_PLACEMENT_CALL

        placed = HOST_PLACEMENT_CALL in lowered.as_text()
    out = jax.block_until_ready(executable(*args))
    return placed, [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(out)]


def _mismatch(got: list[Any], want: list[Any]) -> str:
    """The first output leaf outside tolerance, described; ``""`` when all match."""
    import numpy as np

    if len(got) != len(want):
        return f"{len(got)} outputs, the plain scan has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape:
            return f"output {i}: shape {g.shape}, the plain scan's {w.shape}"
        if not np.issubdtype(w.dtype, np.inexact):
            if not np.array_equal(g, w):
                return f"output {i} differs"
            continue
        scale = float(np.max(np.abs(w))) if w.size and np.isfinite(w).all() else 0.0
        if not np.allclose(g, w, rtol=RTOL, atol=ATOL_FRACTION * scale, equal_nan=False):
            err = float(np.max(np.abs(g - w))) if np.isfinite(g).all() else float("nan")
            return f"output {i}: max abs difference {err:.3g} (largest value {scale:.3g})"
    return ""


def refused(outcome: Mapping[str, ProbeVerdict]) -> frozenset[str]:
    """The labels an outcome leaves out of the space."""
    return frozenset(k for k, v in outcome.items() if not v.offered)


def lines(outcome: Mapping[str, str]) -> list[str]:
    """One line per choice probed, from the study's stored lines (``attrs.PROBE``):
    ``"probe: offload_dots: left out: ..."``."""
    return [f"probe: {label}: {what}" for label, what in outcome.items()]
