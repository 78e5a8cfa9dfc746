"""The remat schedule: a frozen description of how to checkpoint a scan.

A schedule is data, not code. Each *kind* is one frozen dataclass under the
common base ``Schedule`` and owns its fields, parsing, validation, summary,
cost model, search space and builder; the table of kinds is
``autoremat._schedules.KINDS``. YAML is the file form, for example::

    version: 1
    kind: nested                  # autoremat._schedules.nested.NestedSchedule
    levels:                       # outermost first
      - {length: 100, policy: nothing_saveable}
      - {length: 100, policy: dots_saveable}
    unroll: 1                     # lax.scan unroll of the innermost loop
    meta: {}                      # free-form; the tuner records what it measured

or, for binomial (Revolve) checkpointing (``autoremat._schedules.binomial``)::

    version: 1
    kind: binomial
    snapshots: 16                 # carries stored at once (>= 1)
    unroll: 1                     # lax.scan unroll of the forward sweep

or, for a layer stack, a policy per group of consecutive layers (``kind: groups``,
``autoremat._schedules.groups``).

Any kind may carry ``fuse`` (absent: not a choice, the old behaviour): whether
``remat_scans`` moves the readout and loss after the scan into its step, where the
tuner chose it (``Schedule.fuse``)::

    fuse: false

Any kind may carry ``compiler_options`` (absent when empty): XLA options for the
compile of the whole jitted step (``Schedule.compiler_options``), e.g.::

    compiler_options: {xla_gpu_graph_min_graph_size: 1}

Memory/time trade-off (Chen et al. 2016, arXiv 1604.06174): with ``d`` levels
of lengths ``n_1 .. n_d`` (``T = n_1 * ... * n_d``) and ``nothing_saveable``
on the outer levels, the backward pass stores about ``n_1 + ... + n_d``
carries plus one innermost chunk of residuals -- ``O(d * T^(1/d))`` memory --
for ``d - 1`` extra forward passes. The binomial kind (Griewank & Walther
2000, "Algorithm 799: Revolve") stores ``s`` carries and runs the fewest
forward steps any schedule can with ``s`` carries: ``O(log T)`` memory for
``O(T log T)`` work (``autoremat.bounds``).

This module imports no jax at import time, so the CLI's ``--help`` stays
instant; ``Policy.resolve`` imports it when a policy is actually built. It
names no kind either: ``autoremat._schedules`` imports the kind modules, holds
``KINDS`` and the constructors (``nested``, ``binomial``, ``root``, ``plain``)
and reads and writes the YAML.
"""

from __future__ import annotations

import contextlib
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, ClassVar, Final

import yaml

from autoremat._errors import ScheduleError
from autoremat._schedules.policy import Policy, _show, check_int
from autoremat.bounds import Cost

SCHEDULE_VERSION: Final = 1
KNOWN_VERSIONS: Final = (1,)
#: The transformations of ``autoremat.scan`` the tests check for every kind.
TRANSFORMS: Final = ("grad", "grad_of_grad", "jvp", "linearize", "hessian", "vmap", "jit")
#: The keys every kind has; a kind adds its own (``Schedule.FIELDS``).
#: A scan of at most this many steps is short (a stack of layers, not a recurrence): the
#: search lists its structures (``autoremat._search.planning.short_scans``), tries the presets a
#: user would pick first (``autoremat._search.planning.presets``) and offers the groups kind.
SHORT_SCAN: Final = 128
#: No policies over a problem's own tags (``Schedule.parameters``' default ``named``).
NO_NAMES: Final[Mapping[str, Policy]] = MappingProxyType({})
COMMON_KEYS: Final = ("version", "kind", "unroll", "fuse", "compiler_options", "meta")
#: ``compiler_options`` names: XLA ``DebugOptions`` fields (what ``XLA_FLAGS`` sets,
#: without the leading ``--``).
OPTION_NAME: Final = re.compile(r"xla_[a-z0-9_]+")


@dataclass(frozen=True)
class Features:
    """What the tuner's cost model (``autoremat._search.planning.predict``) reads of one schedule at one
    ``T``; each kind computes its own (``Schedule.features``).

    Attributes:
      evaluations: step evaluations of one forward + backward pass
        (``Schedule.cost``), counting ``partial`` ones.
      partial: of those, re-runs that skip the matmuls (their outputs are
        saved, e.g. under a ``dots`` policy): only the elementwise part re-runs.
      boundaries: checkpoint boundaries crossed, forward and backward (each
        stacks a carry and enters a remat region).
      bookkeeping: steps with dynamic restores or indexing (per-step overhead
        a plain scan does not have).
      terms: the peak stored, as (carries, steps of full residuals, steps of
        partial residuals): ``MemoryModel`` fits bytes on these.
    """

    evaluations: float
    partial: float = 0.0
    boundaries: float = 0.0
    bookkeeping: float = 0.0
    terms: tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Check:
    """A choice of a kind's search space that a study must check on the user's own
    problem before offering it (``Schedule.checks``; ``autoremat._search.probes.probe``).

    Attributes:
      schedule: a schedule that uses the choice, at the probe's length.
      offloads: the choice is meant to move residuals to host memory; the probe
        also checks that the lowered step places something there (on a CPU jax
        lowers the move to nothing, so the choice would only duplicate another).
    """

    schedule: Schedule
    offloads: bool = False


@dataclass(frozen=True)
class Param:
    """One parameter of the search space (``Schedule.parameters``): a choice among
    ``choices`` or, with none, an integer in ``low..high``.

    Attributes:
      name: its key in a candidate's params (a kind's names do not clash with another
        kind's, nor with the space's own: ``kind``, ``fuse``, ``compiler``).
      choices: the values to choose from, in order; empty: an integer.
      low, high: the integer's range, both included.
      log: the integer spans orders of magnitude: a random one is log-uniform.
      ordered: the choices are ordered (e.g. the nested depth): a neighbour
        (``space.neighbours``) takes the one before or after, not any other.
    """

    name: str
    choices: tuple[Any, ...] = ()
    low: int = 0
    high: int = 0
    log: bool = False
    ordered: bool = False


@dataclass(frozen=True, kw_only=True)
class Schedule(ABC):
    """How to rematerialize a scan; one subclass per kind (nested, binomial, groups).

    Build one with ``autoremat.nested`` / ``binomial`` / ``groups`` / ``root`` /
    ``plain``, or read its YAML file with ``autoremat.load_schedule``. Each
    kind's docstring defines its semantics (the one place they are defined;
    ``autoremat.scan`` follows it); every kind gives the loss and gradients
    of a plain ``lax.scan`` and differs only in memory and time.

    Attributes:
      kind: the kind's name, the ``kind:`` of its YAML (a class attribute).
      unroll: ``lax.scan`` unroll of the innermost loop, >= 1.
      meta: free-form YAML-safe data: what the schedule was tuned for and what
        was measured. Not used to run the scan.
      compiler_options: XLA options (``DebugOptions`` field -> bool, int, float or
        string) for compiling the whole jitted training step, not the scan: a scan
        cannot pass them, so ``autoremat.scan`` ignores them. The tuner's
        measurements compile with them (``lower(...).compile(compiler_options=...)``);
        compile your step the same way: ``jax.jit(step,
        compiler_options=dict(schedule.compiler_options))``. Part of ``key()``;
        empty by default. An unknown name or a bad value fails at that compile
        (XLA: "No such compile option"); options of another backend (``xla_gpu_*``
        on a CPU) are accepted and ignored there (jax 0.10.2, tested).
      fuse: ``True``/``False`` where fusing the readout and loss into the scanned
        step was a choice the tuner made (``remat_scans`` and the problems made from
        a loss apply it unless told otherwise); ``None`` (the default, absent from
        the YAML): not a choice. Fused needs less memory (no ``(T, B, H)`` stack);
        unfused was faster on a TPU at the same memory. Part of ``key()``.
    """

    kind: ClassVar[str]
    #: The kind's own top-level keys (all required), each with an example.
    FIELDS: ClassVar[Mapping[str, str]]
    #: The kind's own keys that may be left out (absent: the default), with an example.
    OPTIONAL: ClassVar[Mapping[str, str]] = {}
    #: JAX transformations of ``autoremat.scan`` this kind cannot do, out of
    #: ``TRANSFORMS``; each raises a clear error instead (tests check both).
    UNSUPPORTED: ClassVar[frozenset[str]] = frozenset()

    unroll: int = 1
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)
    compiler_options: Mapping[str, bool | int | float | str] = field(default_factory=dict,
                                                                     hash=False)
    fuse: bool | None = None

    def __post_init__(self) -> None:
        check_int("unroll", self.unroll)
        if self.fuse is not None and not isinstance(self.fuse, bool):
            raise ScheduleError(f"fuse: expected true or false (or leave it out: not a "
                                f"choice), got {_show(self.fuse)}")
        if not isinstance(self.meta, Mapping):
            raise ScheduleError(f"meta: expected a mapping, got {_show(self.meta)}")
        object.__setattr__(self, "compiler_options", check_options(self.compiler_options))

    # -- what each kind defines --------------------------------------------------
    @classmethod
    @abstractmethod
    def parse_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor's keyword arguments from the kind's own YAML keys."""

    @abstractmethod
    def fields_data(self) -> dict[str, Any]:
        """The kind's own YAML keys (the inverse of ``parse_fields``)."""

    @abstractmethod
    def describe(self) -> str:
        """One line, e.g. ``40x50x50 nothing/nothing/dots unroll=2``."""

    @abstractmethod
    def explain(self) -> list[str]:
        """Indented lines for ``autoremat show``: what the schedule does."""

    @abstractmethod
    def cost(self, seq_len: int) -> Cost:
        """Step evaluations and peak stored carries at ``T = seq_len`` (``bounds.cost``)."""

    @abstractmethod
    def features(self, seq_len: int) -> Features:
        """What the tuner's cost model reads of this schedule at ``T = seq_len``."""

    @abstractmethod
    def run(self, step: Callable[..., Any], init: Any, leaves: list[Any], axes: list[int],
            steps: int, reverse: bool) -> tuple[Any, Any]:
        """Scan ``steps >= 1`` steps of ``step(carry, x_leaves)``, outputs on axis 0.

        ``leaves[i]`` is scanned along ``axes[i]``. Imports jax (the builder).
        """

    @classmethod
    @abstractmethod
    def parameters(cls, seq_len: int, platform: str, chosen: Mapping[str, Any],
                   named: Mapping[str, Policy] = NO_NAMES) -> list[Param]:
        """This kind's parameters of the tuner's search space at
        ``T = seq_len`` on ``platform``, in the order they are chosen, as far as the
        values ``chosen`` so far fix them: a parameter whose range depends on an
        earlier one's value is listed once that value is chosen. ``named``: policies
        over the problem's own ``checkpoint_name`` tags (label -> policy), for a kind
        whose levels take policies to offer beside its fixed ones."""

    @classmethod
    def tied_moves(cls, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Params of this kind two or more parameters away from ``params`` that the search
        should try near a good schedule (``space.neighbours``, whose other moves change
        one parameter): where parameters pay off only together. This default: none."""
        return []

    @classmethod
    def searched(cls, seq_len: int) -> bool:
        """Whether the search offers this kind at ``T = seq_len`` (this default: always)."""
        return True

    @classmethod
    @abstractmethod
    def from_params(cls, params: Mapping[str, Any], seq_len: int, platform: str,
                    named: Mapping[str, Policy] = NO_NAMES) -> Schedule:
        """The schedule of a value for each of ``parameters`` (a candidate's params)."""

    @classmethod
    @abstractmethod
    def seed_params(cls, seq_len: int, platform: str = "cpu") -> list[dict[str, Any]]:
        """The params of this kind's obvious candidates (without ``kind``) on
        ``platform`` (``"cpu"``, ``"gpu"``/``"cuda"``/``"rocm"``, ``"tpu"``): the seeds
        are always timed, so a kind that costs much more on a platform seeds less there."""

    @classmethod
    @abstractmethod
    def examples(cls) -> Sequence[Schedule]:
        """Schedules exercising each option of the kind (the tests' matrix runs them)."""

    @classmethod
    def checks(cls, seq_len: int, platform: str,
               named: Mapping[str, Policy] = NO_NAMES) -> Mapping[str, Check]:
        """Choices of ``parameters`` on ``platform`` that a study checks before offering
        them: choice label (a value of one of ``parameters``' ``choices``) -> a
        ``Check`` of a schedule using it at ``seq_len``. A study probes each on a
        small instance of its problem and leaves out of its space every one that
        fails to compile or changes the loss or gradients. This default has none: every choice is offered."""
        return {}

    def policies(self) -> list[tuple[str, Policy]]:
        """Each checkpoint policy the schedule applies, with the field it is in (e.g.
        ``levels[1].policy``); a policy naming ``checkpoint_name`` tags is checked
        against the traced step. This default has none."""
        return []

    def timing_length(self, seq_len: int, short: int) -> int:
        """The length to time this schedule at so that its step time at ``seq_len``
        can be predicted from it: at least ``short``,
        and long enough to hold every part of the schedule's structure (whole
        inner chunks, enough steps per snapshot). This default keeps ``seq_len``:
        a kind that does not override it is timed at full length."""
        return seq_len

    # -- shared ----------------------------------------------------------------
    def with_meta(self, **meta: Any) -> Schedule:
        """A copy with ``meta`` updated by the given keys."""
        return replace(self, meta={**self.meta, **meta})

    def with_options(self, **options: bool | int | float | str) -> Schedule:
        """A copy whose ``compiler_options`` are exactly ``options``."""
        return replace(self, compiler_options=options)

    def with_fuse(self, fuse: bool | None) -> Schedule:
        """A copy whose ``fuse`` choice is ``fuse``."""
        return replace(self, fuse=fuse)

    def options_note(self) -> str:
        """``""``, or `` fused``/`` unfused`` (``fuse``) and `` xla{name=value,...}``
        (the options, briefly), for ``describe``."""
        note = "" if self.fuse is None else (" fused" if self.fuse else " unfused")
        if not self.compiler_options:
            return note
        shown = ",".join(f"{k.removeprefix('xla_')}={v}" for k, v in self.compiler_options.items())
        return f"{note} xla{{{shown}}}"

    def key(self) -> str:
        """A canonical string of what affects execution (not ``meta``). Made once per
        schedule (a YAML dump: the planner asks for keys thousands of times a search, 4 s
        of a TPU tune's main thread before it was kept)."""
        key = self.__dict__.get("_key")
        if key is None:
            data = self.to_data()
            data.pop("meta", None)
            key = yaml.safe_dump(data, sort_keys=True, default_flow_style=True).strip()
            object.__setattr__(self, "_key", key)  # not a field: eq, hash, replace ignore it
        return key

    def to_data(self) -> dict[str, Any]:
        """The YAML-safe mapping form (see the module docstring)."""
        data = {"version": SCHEDULE_VERSION, "kind": self.kind, **self.fields_data(),
                "unroll": self.unroll}
        if self.fuse is not None:
            data["fuse"] = self.fuse
        if self.compiler_options:
            data["compiler_options"] = dict(self.compiler_options)
        if self.meta:
            data["meta"] = _plain(self.meta)
        return data


def check_options(value: Any) -> dict[str, bool | int | float | str]:
    """``compiler_options`` checked: a mapping of XLA option names (``OPTION_NAME``)
    to YAML scalars, returned as a dict sorted by name; else a ``ScheduleError``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ScheduleError(f"compiler_options: expected a mapping of XLA option names to "
                            f"values, e.g. {{xla_gpu_graph_min_graph_size: 1}}, got {_show(value)}")
    out: dict[str, bool | int | float | str] = {}
    for name in sorted(value, key=str):
        v = value[name]
        if not isinstance(name, str) or not OPTION_NAME.fullmatch(name):
            raise ScheduleError(f"compiler_options: {_show(name)} is not an XLA option name: "
                                "expected lower case 'xla_...' (an XLA_FLAGS flag without '--')")
        if not isinstance(v, (bool, int, float, str)):
            raise ScheduleError(f"compiler_options.{name}: expected a bool, number or string, "
                                f"got {_show(v)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ScheduleError(f"compiler_options.{name}: expected a finite number, got {v}")
        out[name] = v
    return out


@contextlib.contextmanager
def at(path: str) -> Iterator[None]:
    """Prefix ``path.`` to the field of a ``ScheduleError`` raised inside."""
    try:
        yield
    except ScheduleError as e:
        raise ScheduleError(f"{path}.{e}") from None


def _plain(value: Any) -> Any:
    """Convert tuples and mappings to plain lists/dicts for YAML."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
