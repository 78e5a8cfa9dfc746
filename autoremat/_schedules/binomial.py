"""The binomial kind: Revolve checkpointing, ``O(log T)`` carries, the fewest re-runs.

Griewank & Walther 2000 ("Algorithm 799: Revolve", ACM TOMS 26(1)): with
``s`` carries stored at once, reversing ``T`` steps takes at least
``bounds.min_evaluations(T, s)`` step evaluations, and this kind runs exactly
that many -- ``O(log T)`` memory for ``O(T log T)`` work. The plan is
``autoremat._schedules.revolve``, the builder (a ``jax.custom_vjp``)
``autoremat._schedules.binomial_scan``; this module (pure Python) owns the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from autoremat._errors import ScheduleError
from autoremat._schedules.base import NO_NAMES, Features, Param, Schedule
from autoremat._schedules.platforms import GPU_PLATFORMS
from autoremat._schedules.policy import Policy, _show, check_int
from autoremat.bounds import Cost, max_steps, optimal_cost

#: The two equal implementations of the backward pass (``BinomialSchedule.backward``).
BACKWARDS: Final = ("loops", "static")
#: Data-dependent control decisions (the host reads each back on a GPU) of the static
#: backward per step, as a fraction of the loops backward's: counted from the tables
#: (``tests/test_platform_costs.py``), 1.6-2.3 conditionals against 4.9-8.3 loop tests
#: per step for T = 10^3..10^5, s = 5..40. ``features``' ``bookkeeping`` uses it.
STATIC_CONTROL: Final = 0.25
#: Binomial schedules re-run a step at most this often (about ``r + 1`` times
#: the forward work); fewer snapshots than that are never faster than nested.
MAX_REPETITIONS: Final = 6


@dataclass(frozen=True, kw_only=True)
class BinomialSchedule(Schedule):
    """``kind: binomial`` -- ``snapshots`` carries at Revolve's positions.

    The forward pass is one scan that keeps ``snapshots`` carries at the
    positions of Griewank & Walther's binomial schedule; the backward pass (a
    ``jax.custom_vjp``) restores, re-advances and reverses step by step from
    them, with the fewest step evaluations any schedule storing ``snapshots``
    carries can do (``autoremat.bounds.min_evaluations``). Any ``T`` runs;
    ``snapshots >= T`` stores every carry (per-step remat). ``unroll`` is the
    ``lax.scan`` unroll of the forward sweep.

    Transformations: ``jax.grad``/``vjp`` (also of ``jit``, ``checkpoint``,
    ``vmap``), grad of grad (``jax.grad(jax.grad(f))``, ``jacrev`` of a
    gradient, also of a jitted function: the backward's derivative is that
    of an equal backward with only scans of static length; the outer
    backward then stores residuals for every reversal),
    forward-over-reverse (``jax.hessian``, ``jacfwd(grad)``), ``vmap``,
    ``jit``, and forward mode (``jvp``, ``jacfwd``) when the JVP reaches the
    scan as it is traced -- ``jvp(f)``, ``jit(jvp(f))``, ``vmap(jvp(f))``: it
    runs the plain forward sweep, which stores nothing either. Not:
    ``jax.linearize`` (a ``custom_vjp`` has no forward-mode linear map);
    traced directly, it is a ``ScheduleError`` naming the fix. Forward mode
    applied *after* the scan was traced (``jvp(jit(f))``,
    ``jvp(checkpoint(f))``, ``jvp(vmap(f))``, ``linearize(jit(f))``) cannot be
    told apart at trace time (the scan sees plain jaxpr tracers): JAX's own
    error appears then, "can't apply forward-mode autodiff (jvp) to a
    custom_vjp function". Use a nested schedule for those (or move ``jvp``
    inside the ``jit``).

    Attributes:
      snapshots: how many carries are stored at once (>= 1).
      backward: how the backward pass re-advances from a snapshot; both run
        exactly the tables' step evaluations and give the same gradients.
        ``"loops"`` (the default; absent from the YAML): ``lax.fori_loop``s of
        the length each reversal needs. XLA hoists the step's loop invariants
        (a concatenated kernel, FSDP parameter gathers) and moves collectives
        out of them, but on a GPU the host reads every iteration's loop test
        back (``WhileThunk`` without a known trip count). ``"static"``: no loop
        of dynamic length -- per reversal a ``lax.switch`` over its number of
        ops, each op a switch over fixed-length re-advance scans
        (``revolve.program``): about 1.8 conditionals per step instead of
        7.4-7.7 loop tests (s=11..17, counted from the tables). The
        re-advanced step is compiled once per branch (slower compiles); under
        a mesh no collective runs per time step either, but each copy gathers
        FSDP parameters on its own, once per training step
        (``tests/test_mesh.py``: 12 gathers vs 6). On a CPU it
        ran at 1.11-1.19x ``"loops"`` (T=2*10^4..10^5, s=17); the search
        offers it on a GPU only, where timing decides.
    """

    kind: ClassVar[str] = "binomial"
    FIELDS: ClassVar[Mapping[str, str]] = {"snapshots": "'snapshots: 16'"}
    OPTIONAL: ClassVar[Mapping[str, str]] = {"backward": "'backward: static'"}
    UNSUPPORTED: ClassVar[frozenset[str]] = frozenset({"linearize"})

    snapshots: int
    backward: str = "loops"

    def __post_init__(self) -> None:
        check_int("snapshots", self.snapshots)
        if not isinstance(self.backward, str) or self.backward not in BACKWARDS:
            raise ScheduleError(f"backward: expected one of {', '.join(BACKWARDS)}, got "
                                f"{_show(self.backward)}")
        super().__post_init__()

    @classmethod
    def parse_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        return {"snapshots": data["snapshots"], "backward": data.get("backward", "loops")}

    def fields_data(self) -> dict[str, Any]:
        static = {"backward": self.backward} if self.backward != "loops" else {}
        return {"snapshots": self.snapshots, **static}

    def describe(self) -> str:
        static = " backward=static" if self.backward == "static" else ""
        return f"binomial s={self.snapshots}{static} unroll={self.unroll}{self.options_note()}"

    def explain(self) -> list[str]:
        lines = [f"  binomial (Revolve) checkpointing: {self.snapshots} carries stored at "
                 "once, the fewest step re-runs for that memory (any T runs)"]
        seq_len = self.meta.get("seq_len")
        if isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len >= 1:
            c = self.cost(seq_len)
            lines.append(f"  at T = {seq_len}: {c.evaluations} step evaluations per training "
                         f"step ({c.recompute_factor:.2f}x the forward)")
        lines.append(f"  backward: {self.backward} ("
                     + ("re-advances as loops of the length each needs)" if self.backward == "loops"
                        else "re-advances as fixed-length scans chosen by lax.switch: "
                             "no loop of dynamic length)"))
        lines.append(f"  unroll (forward sweep): {self.unroll}")
        return lines

    def cost(self, seq_len: int) -> Cost:
        """Exact: what the builder executes (the optimum, ``bounds.optimal_cost``)."""
        return optimal_cost(seq_len, self.snapshots)

    def features(self, seq_len: int) -> Features:
        """``evaluations``: exact -- both implementations of the backward re-advance
        the tables' steps (none masked or padded; ``tests/test_binomial.py`` counts);
        ``bookkeeping``: every step (the backward's dynamic restores and indexing,
        and its data-dependent control: with ``backward: static``, ``STATIC_CONTROL``
        of a step); ``terms``: the stored carries and one step's residuals."""
        cost = self.cost(seq_len)
        control = 1.0 if self.backward == "loops" else STATIC_CONTROL
        return Features(evaluations=float(cost.evaluations), bookkeeping=control * seq_len,
                        terms=(float(cost.stored_carries), 1.0, 0.0))

    def timing_length(self, seq_len: int, short: int) -> int:
        """At least ``short`` and ``8 * snapshots`` steps, so the short run recomputes
        too (with ``snapshots >= T`` nothing is); the step evaluations at any
        ``T`` are exact (``cost``), so the time scales with their count."""
        return min(seq_len, max(short, 8 * self.snapshots))

    def run(self, step: Callable[..., Any], init: Any, leaves: list[Any], axes: list[int],
            steps: int, reverse: bool) -> tuple[Any, Any]:
        from autoremat._schedules.binomial_scan import binomial_scan

        return binomial_scan(step, init, leaves, axes, steps, self.snapshots, reverse,
                             self.unroll, self.describe(), static=self.backward == "static")

    @classmethod
    def parameters(cls, seq_len: int, platform: str, chosen: Mapping[str, Any],
                   named: Mapping[str, Policy] = NO_NAMES) -> list[Param]:
        """``snapshots`` in ``snapshot_range(T)``, log-scaled; on a GPU also the
        ``backward`` (elsewhere ``"loops"``, measured faster on a CPU)."""
        low, high = snapshot_range(seq_len)
        snapshots = Param("snapshots", low=low, high=high, log=True)
        return [snapshots, Param("backward", BACKWARDS)] if platform in GPU_PLATFORMS else [snapshots]

    @classmethod
    def from_params(cls, params: Mapping[str, Any], seq_len: int, platform: str,
                    named: Mapping[str, Policy] = NO_NAMES) -> BinomialSchedule:
        backward = params["backward"] if platform in GPU_PLATFORMS else "loops"
        return cls(snapshots=params["snapshots"], backward=backward)

    @classmethod
    def seed_params(cls, seq_len: int, platform: str = "cpu") -> list[dict[str, Any]]:
        """Three repetitions: ``C(s + 3, 3) >= T`` snapshots (none at ``T = 1``);
        none on a GPU (``GPU_PLATFORMS``) or a TPU.

        A seed is always timed. On a CPU, where the plain scan is bound by memory
        traffic, binomial runs near plain and its seed calibrates the model. On a GPU
        a binomial step evaluation costs about twice a nested one's -- its backward
        re-advances are loops of data-dependent length, whose trip test the host
        reads back every iteration -- so binomial runs several times slower than plain
        and its seed would spend a trial learning that. There it stays in the space
        (the smallest schedules are binomial: the planner times one when no
        nested schedule fits the budget) but is not seeded; the cost model's
        GPU prior (``autoremat._search.planning.predict.PRIORS``) ranks it as slow. So on a
        TPU, where binomial also runs several times plain and its seed was never the
        pick; the TPU prior ranks it slow too. Figures: ``docs/tuning.md`` (CPU, GPU),
        ``studies/results/search_tpu.md`` and ``studies/results/tune_time.md`` (TPU)."""
        if seq_len < 2 or platform in GPU_PLATFORMS or platform == "tpu":
            return []
        low, high = snapshot_range(seq_len)
        return [{"snapshots": min(max(_fewest_snapshots(seq_len, 3), low), high)}]

    @classmethod
    def examples(cls) -> Sequence[Schedule]:
        """One snapshot (quadratic work) up to ``s >= T`` (every carry), unrolled."""
        return [cls(snapshots=s) for s in (1, 2, 3, 8, 5)] + [cls(snapshots=9, unroll=4)] + [
            cls(snapshots=s, backward=b) for s, b in ((4, "static"), (7, "loops"), (96, "loops"),
                                                      (16, "static"), (1, "static"),
                                                      (1, "loops"), (6, "loops"),
                                                      (32, "loops"), (3, "static"))]


def snapshot_range(seq_len: int) -> tuple[int, int]:
    """The ``snapshots`` worth trying at this ``T`` (low, high).

    From the fewest that keep every step within ``MAX_REPETITIONS`` re-runs
    up to ``4 sqrt(T)`` (past that it is per-step remat with extra bookkeeping).
    """
    high = max(1, min(seq_len, 4 * math.isqrt(seq_len)))
    return min(_fewest_snapshots(seq_len, MAX_REPETITIONS), high), high


def _fewest_snapshots(seq_len: int, reps: int) -> int:
    """The fewest snapshots reversing ``seq_len`` steps with ``reps`` repetitions."""
    s = 1
    while max_steps(s, reps) < seq_len:
        s += 1
    return s
