"""The remat schedule: a frozen description of how to checkpoint a scan.

A schedule is data, not code: it names, outermost level first, how long each
level of a nested scan is and which ``jax.checkpoint_policies`` member decides
what that level keeps for the backward pass. ``autoremat.scan`` consumes it;
the tuner produces it; YAML is its file form::

    version: 1
    kind: nested
    levels:                       # outermost first
      - {length: 100, policy: nothing_saveable}
      - {length: 100, policy: dots_saveable}
    unroll: 1                     # lax.scan unroll of the innermost loop
    meta: {}                      # free-form; the tuner records what it measured

or, for binomial (Revolve) checkpointing::

    version: 1
    kind: binomial
    snapshots: 16                 # carries stored at once (>= 1)
    unroll: 1                     # lax.scan unroll of the forward sweep

Memory/time trade-off (Chen et al. 2016, arXiv 1604.06174): with ``d`` levels
of lengths ``n_1 .. n_d`` (``T = n_1 * ... * n_d``) and ``nothing_saveable``
on the outer levels, the backward pass stores about ``n_1 + ... + n_d``
carries plus one innermost chunk of residuals -- ``O(d * T^(1/d))`` memory --
for ``d - 1`` extra forward passes. The binomial kind (Griewank & Walther
2000, "Algorithm 799: Revolve") stores ``s`` carries and runs the fewest
forward steps any schedule can with ``s`` carries: ``O(log T)`` memory for
``O(T log T)`` work (``autoremat.bounds``).

This module imports no jax at import time, so the CLI's ``--help`` stays
instant; ``Policy.resolve`` imports it when a policy is actually built.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import yaml

from autoremat._atomic import atomic_write_text
from autoremat._errors import ScheduleError as ScheduleError

SCHEDULE_VERSION: Final = 1
KNOWN_VERSIONS: Final = (1,)
KINDS: Final = ("nested", "binomial")

#: Zero-argument members of ``jax.checkpoint_policies`` (the last two are
#: aliases that JAX keeps for old code).
ZERO_ARG_POLICIES: Final = (
    "nothing_saveable",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "everything_saveable",
    "checkpoint_dots",
    "checkpoint_dots_with_no_batch_dims",
)
#: Factory members of ``jax.checkpoint_policies``, written in YAML as a
#: one-key mapping. A list is passed positionally, a mapping as keywords.
FACTORY_POLICIES: Final = (
    "save_only_these_names",
    "save_any_names_but_these",
    "save_anything_except_these_names",
    "save_and_offload_only_these_names",
    "offload_dot_with_no_batch_dims",
)
#: ``none`` wraps nothing in ``jax.checkpoint``: that level stores every
#: residual, exactly like a plain ``lax.scan``.
NO_REMAT: Final = "none"
ALL_POLICY_NAMES: Final = (NO_REMAT, *ZERO_ARG_POLICIES, *FACTORY_POLICIES)

#: A schedule is a few KB even with its meta; PyYAML (pure Python) reads about
#: 40 KB/s of dense flow YAML, so a bigger file is refused before parsing.
_MAX_FILE_BYTES: Final = 1 << 16
#: Limits of a valid schedule: a level's length and ``unroll`` are ``lax.scan``
#: lengths (int32); more than 64 levels of length >= 2 tile more than 2^64 steps.
MAX_LENGTH: Final = 2**31 - 1
MAX_LEVELS: Final = 64
_TOP_KEYS: Final = ("version", "kind", "levels", "snapshots", "unroll", "meta")
_LEVEL_KEYS: Final = ("length", "policy")


@dataclass(frozen=True)
class Policy:
    """A ``jax.checkpoint_policies`` member by name, with factory arguments.

    Attributes:
      name: ``"none"`` (no ``jax.checkpoint``), a zero-argument policy such as
        ``"nothing_saveable"``, or a factory such as ``"save_only_these_names"``.
      args: positional arguments of a factory (names, as strings).
      kwargs: keyword arguments of a factory, as sorted ``(key, value)`` pairs;
        list values are stored as tuples.
    """

    name: str
    args: tuple[str, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.name not in ALL_POLICY_NAMES:
            raise ScheduleError(
                f"policy: unknown policy {self.name!r}; valid: "
                f"{', '.join(ALL_POLICY_NAMES)}"
            )
        if self.name in FACTORY_POLICIES:
            if not self.args and not self.kwargs:
                raise ScheduleError(
                    f"policy: {self.name} needs arguments, e.g. "
                    f"{{{self.name}: [gates]}}"
                )
        elif self.args or self.kwargs:
            raise ScheduleError(
                f"policy: {self.name} takes no arguments; write it as a plain "
                f"string (policy: {self.name})"
            )

    def resolve(self) -> Callable[..., Any] | None:
        """The JAX policy callable, or ``None`` for ``"none"`` (no remat)."""
        if self.name == NO_REMAT:
            return None
        import jax

        member = getattr(jax.checkpoint_policies, self.name, None)
        if member is None:
            raise ScheduleError(
                f"policy: {self.name!r} is not in this jax's "
                f"jax.checkpoint_policies (jax {jax.__version__})"
            )
        if self.name in FACTORY_POLICIES:
            kwargs = {k: list(v) if isinstance(v, tuple) else v for k, v in self.kwargs}
            try:
                return member(*self.args, **kwargs)
            except TypeError as e:
                raise ScheduleError(f"policy: bad arguments for {self.name}: {e}") from None
        return member

    @property
    def short(self) -> str:
        """A short label: ``nothing_saveable`` -> ``nothing``."""
        return self.name.removesuffix("_saveable")

    def to_data(self) -> str | dict[str, Any]:
        if self.name not in FACTORY_POLICIES:
            return self.name
        if self.kwargs:
            return {self.name: {k: list(v) if isinstance(v, tuple) else v for k, v in self.kwargs}}
        return {self.name: list(self.args)}

    @classmethod
    def from_data(cls, data: Any, where: str = "policy") -> Policy:
        if isinstance(data, Policy):
            return data
        if data is None:
            return cls(NO_REMAT)
        if isinstance(data, str):
            try:
                return cls(data)
            except ScheduleError as e:
                raise ScheduleError(f"{where}: {str(e).removeprefix('policy: ')}") from None
        if isinstance(data, Mapping) and len(data) == 1:
            ((name, value),) = data.items()
            if name not in FACTORY_POLICIES:
                raise ScheduleError(
                    f"{where}: {name!r} is not a policy factory; factories: "
                    f"{', '.join(FACTORY_POLICIES)} (zero-argument policies are "
                    "plain strings)"
                )
            if isinstance(value, str):
                value = [value]
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return cls(name, args=tuple(value))
            if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
                kwargs = []
                for k, v in sorted(value.items()):
                    if isinstance(v, list) and all(isinstance(s, str) for s in v):
                        v = tuple(v)
                    elif not isinstance(v, str):
                        raise ScheduleError(
                            f"{where}.{name}.{k}: expected a string or a list of "
                            f"strings, got {_show(v)}"
                        )
                    kwargs.append((k, v))
                return cls(name, kwargs=tuple(kwargs))
            raise ScheduleError(
                f"{where}.{name}: expected a list of names or a mapping of keyword "
                f"arguments, got {_show(value)}"
            )
        raise ScheduleError(
            f"{where}: expected a policy name such as 'nothing_saveable' or a "
            f"one-key mapping such as {{save_only_these_names: [gates]}}, got "
            f"{_show(data)}; valid names: {', '.join(ALL_POLICY_NAMES)}"
        )


@dataclass(frozen=True)
class Level:
    """One level of a nested scan: ``length`` iterations, each checkpointed."""

    length: int
    policy: Policy = Policy("nothing_saveable")

    def __post_init__(self) -> None:
        if isinstance(self.length, bool) or not isinstance(self.length, int):
            raise ScheduleError(
                f"length: expected a positive integer, got {_show(self.length)}"
            )
        if self.length < 1:
            raise ScheduleError(f"length: must be >= 1, got {self.length}")
        if self.length > MAX_LENGTH:
            raise ScheduleError(f"length: must be <= {MAX_LENGTH}, got {_show(self.length)}")
        if not isinstance(self.policy, Policy):
            object.__setattr__(self, "policy", Policy.from_data(self.policy))


@dataclass(frozen=True)
class Schedule:
    """How to rematerialize a scan: nested levels, or binomial checkpointing.

    Semantics (the one place they are defined; ``autoremat.scan`` follows it).

    ``kind: nested``:

    * Level ``i`` is a ``lax.scan`` whose body -- the whole scan of level
      ``i + 1``, or the user's step at the innermost level -- is wrapped in
      ``jax.checkpoint(policy=levels[i].policy)``. ``policy: none`` leaves the
      body unwrapped. A one-level schedule is a plain scan, optionally with
      per-step remat.
    * ``unroll`` is the ``lax.scan`` unroll of the innermost level.
    * Any sequence length ``T`` runs. The inner lengths are fixed chunk sizes;
      the outermost count is derived from ``T``. When ``T`` is not a multiple
      of the chunk, the rest is run as a mixed-radix remainder: with chunk
      sizes ``c_i = n_{i+1} * ... * n_d``, ``T`` is split into
      ``q_1 c_1 + q_2 c_2 + ... + q_d`` (``q_i < n_i`` for ``i > 1``); each
      part is a scan of ``q_i`` chunks at level ``i`` with the same inner
      levels. Memory stays that of the schedule plus at most ``d`` short scans.
      ``T`` smaller than a chunk simply skips the outer levels.

    ``kind: binomial``: the forward pass is one scan that keeps ``snapshots``
    carries at the positions of Griewank & Walther's binomial schedule
    (Revolve); the backward pass (a ``jax.custom_vjp``) restores, re-advances
    and reverses step by step from them, with the fewest step evaluations any
    schedule storing ``snapshots`` carries can do
    (``autoremat.bounds.min_evaluations``). Any ``T`` runs; ``snapshots >=
    T`` stores every carry (per-step remat). First-order reverse mode only:
    ``jax.grad``/``jax.vjp`` work; ``jax.jvp`` and grad-of-grad do not.

    Attributes:
      levels: nested: the levels, outermost first (1 to any depth); binomial:
        empty.
      unroll: ``lax.scan`` unroll of the innermost loop (nested) or of the
        forward sweep (binomial), >= 1.
      kind: ``"nested"`` or ``"binomial"``.
      meta: free-form YAML-safe data: what the schedule was tuned for and what
        was measured. Not used to run the scan.
      snapshots: binomial only: how many carries are stored at once (>= 1).
    """

    levels: tuple[Level, ...] = ()
    unroll: int = 1
    kind: str = "nested"
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)
    snapshots: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ScheduleError(
                f"kind: unknown kind {_show(self.kind)}; valid: {', '.join(KINDS)}"
            )
        levels = tuple(self.levels)
        if self.kind == "binomial":
            _check_snapshots(self.snapshots)
            if levels:
                raise ScheduleError("levels: a binomial schedule has no levels; remove them")
        elif self.snapshots is not None:
            raise ScheduleError(
                "snapshots: only a binomial schedule has snapshots; remove it or set kind: binomial"
            )
        elif not levels:
            raise ScheduleError("levels: needs at least one level, e.g. [{length: 100}]")
        if len(levels) > MAX_LEVELS:
            raise ScheduleError(f"levels: at most {MAX_LEVELS} levels, got {len(levels)}")
        if not all(isinstance(lv, Level) for lv in levels):
            raise ScheduleError("levels: every entry must be an autoremat.Level")
        object.__setattr__(self, "levels", levels)
        _check_unroll(self.unroll)
        if not isinstance(self.meta, Mapping):
            raise ScheduleError(f"meta: expected a mapping, got {_show(self.meta)}")

    @classmethod
    def nested(
        cls,
        lengths: tuple[int, ...] | list[int],
        policies: str | Policy | Sequence[str | Policy] = "nothing_saveable",
        *,
        unroll: int = 1,
        meta: Mapping[str, Any] | None = None,
    ) -> Schedule:
        """Build a nested schedule from lengths and one policy or one per level.

        >>> Schedule.nested([100, 100]).describe()
        '100x100 nothing/nothing unroll=1'
        """
        lengths = tuple(lengths)
        if isinstance(policies, (str, Policy)):
            policies = (policies,) * len(lengths)
        policies = tuple(policies)
        if len(policies) != len(lengths):
            raise ScheduleError(
                f"policies: got {len(policies)} policies for {len(lengths)} levels"
            )
        levels = tuple(
            Level(n, Policy.from_data(p, f"levels[{i}].policy"))
            for i, (n, p) in enumerate(zip(lengths, policies, strict=True))
        )
        return cls(levels=levels, unroll=unroll, meta=dict(meta or {}))

    @classmethod
    def binomial(
        cls, snapshots: int, *, unroll: int = 1, meta: Mapping[str, Any] | None = None
    ) -> Schedule:
        """Binomial (Revolve) checkpointing with ``snapshots`` stored carries.

        >>> Schedule.binomial(16).describe()
        'binomial s=16 unroll=1'
        """
        return cls(kind="binomial", snapshots=snapshots, unroll=unroll, meta=dict(meta or {}))

    @classmethod
    def root(
        cls,
        seq_len: int,
        depth: int,
        policies: str | Policy | Sequence[str | Policy] = "nothing_saveable",
        *,
        unroll: int = 1,
        meta: Mapping[str, Any] | None = None,
    ) -> Schedule:
        """``depth`` levels, each about ``seq_len ** (1 / depth)`` long (``root_lengths``).

        The classic sqrt(T) (``depth=2``) and cube-root (``depth=3``) schedules
        of Chen et al. 2016: ``O(depth * T^(1/depth))`` stored carries.

        >>> Schedule.root(10_000, 2).describe()
        '100x100 nothing/nothing unroll=1'
        """
        return cls.nested(root_lengths(seq_len, depth), policies, unroll=unroll, meta=meta)

    @classmethod
    def plain(cls, length: int) -> Schedule:
        """The reference: one plain ``lax.scan`` with no remat (linear memory)."""
        return cls.nested([length], NO_REMAT)

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(lv.length for lv in self.levels)

    @property
    def depth(self) -> int:
        return len(self.levels)

    @property
    def tuned_length(self) -> int:
        """The sequence length the levels tile exactly (their product)."""
        return math.prod(self.lengths)

    def with_meta(self, **meta: Any) -> Schedule:
        """A copy with ``meta`` updated by the given keys."""
        return replace(self, meta={**self.meta, **meta})

    def describe(self) -> str:
        """One line, e.g. ``40x50x50 nothing/nothing/dots unroll=2``."""
        if self.kind == "binomial":
            return f"binomial s={self.snapshots} unroll={self.unroll}"
        lengths = "x".join(str(n) for n in self.lengths)
        policies = "/".join(_policy_label(lv.policy) for lv in self.levels)
        return f"{lengths} {policies} unroll={self.unroll}"

    def key(self) -> str:
        """A canonical string of what affects execution (not ``meta``)."""
        data = self.to_data()
        data.pop("meta", None)
        return yaml.safe_dump(data, sort_keys=True, default_flow_style=True).strip()

    def to_data(self) -> dict[str, Any]:
        """The YAML-safe mapping form (see the module docstring)."""
        data: dict[str, Any] = {"version": SCHEDULE_VERSION, "kind": self.kind}
        if self.kind == "binomial":
            data["snapshots"] = self.snapshots
        else:
            data["levels"] = [
                {"length": lv.length, "policy": lv.policy.to_data()} for lv in self.levels
            ]
        data["unroll"] = self.unroll
        if self.meta:
            data["meta"] = _plain(self.meta)
        return data

    @classmethod
    def from_data(cls, data: Any) -> Schedule:
        """Validate a mapping (as loaded from YAML) and build the schedule."""
        if not isinstance(data, Mapping):
            raise ScheduleError(
                f"schedule: expected a mapping with keys {', '.join(_TOP_KEYS)}, got "
                f"{_show(data)}"
            )
        unknown = [k for k in data if k not in _TOP_KEYS]
        if unknown:
            raise ScheduleError(
                f"{_show(unknown[0])}: unknown key; valid keys: {', '.join(_TOP_KEYS)}"
            )
        if "version" not in data:
            raise ScheduleError(f"version: missing; add 'version: {SCHEDULE_VERSION}'")
        version = data["version"]
        if isinstance(version, bool) or version not in KNOWN_VERSIONS:
            raise ScheduleError(
                f"version: unknown version {_show(version)}; known versions: "
                f"{', '.join(map(str, KNOWN_VERSIONS))}"
            )
        kind = data.get("kind", "nested")
        if kind not in KINDS:
            raise ScheduleError(f"kind: unknown kind {_show(kind)}; valid: {', '.join(KINDS)}")
        unroll = data.get("unroll", 1)
        _check_unroll(unroll)
        meta = data.get("meta")
        meta = {} if meta is None else meta
        if not isinstance(meta, Mapping):
            raise ScheduleError(f"meta: expected a mapping, got {_show(meta)}")
        if kind == "binomial":
            if "levels" in data:
                raise ScheduleError("levels: a binomial schedule has no levels; remove them")
            if "snapshots" not in data:
                raise ScheduleError("snapshots: missing; a binomial schedule needs e.g. 'snapshots: 16'")
            return cls(kind=kind, snapshots=data["snapshots"], unroll=unroll, meta=dict(meta))
        if "snapshots" in data:
            raise ScheduleError(
                "snapshots: only a binomial schedule has snapshots; remove it or set kind: binomial"
            )
        if "levels" not in data:
            raise ScheduleError("levels: missing; e.g. levels: [{length: 100, policy: nothing_saveable}]")
        raw_levels = data["levels"]
        if not isinstance(raw_levels, list) or not raw_levels:
            raise ScheduleError(
                f"levels: expected a non-empty list of {{length, policy}} mappings, got "
                f"{_show(raw_levels)}"
            )
        if len(raw_levels) > MAX_LEVELS:
            raise ScheduleError(f"levels: at most {MAX_LEVELS} levels, got {len(raw_levels)}")
        levels = []
        for i, raw in enumerate(raw_levels):
            where = f"levels[{i}]"
            if not isinstance(raw, Mapping):
                raise ScheduleError(
                    f"{where}: expected a mapping like {{length: 100, policy: "
                    f"nothing_saveable}}, got {_show(raw)}"
                )
            bad = [k for k in raw if k not in _LEVEL_KEYS]
            if bad:
                raise ScheduleError(
                    f"{where}.{bad[0]}: unknown key; valid keys: {', '.join(_LEVEL_KEYS)}"
                )
            if "length" not in raw:
                raise ScheduleError(f"{where}.length: missing; give a positive integer")
            length = raw["length"]
            if isinstance(length, bool) or not isinstance(length, int):
                raise ScheduleError(
                    f"{where}.length: expected a positive integer, got {_show(length)}"
                )
            if length < 1:
                raise ScheduleError(f"{where}.length: must be >= 1, got {_show(length)}")
            if length > MAX_LENGTH:
                raise ScheduleError(f"{where}.length: must be <= {MAX_LENGTH}, got {_show(length)}")
            policy = Policy.from_data(raw.get("policy", "nothing_saveable"), f"{where}.policy")
            levels.append(Level(length, policy))
        return cls(levels=tuple(levels), unroll=unroll, kind=kind, meta=dict(meta))


def _check_snapshots(snapshots: Any) -> None:
    if isinstance(snapshots, bool) or not isinstance(snapshots, int) or snapshots < 1:
        raise ScheduleError(
            f"snapshots: expected an integer >= 1 for kind binomial, got {_show(snapshots)}"
        )
    if snapshots > MAX_LENGTH:
        raise ScheduleError(f"snapshots: must be <= {MAX_LENGTH}, got {_show(snapshots)}")


def pieces(steps: int, lengths: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Split ``steps`` into ``(start, chunk_count, level)`` parts, mixed radix.

    Level ``k`` chunks hold ``prod(lengths[k+1:])`` steps; the innermost level's
    chunk is one step, so every ``steps`` is covered exactly.
    """
    out, start = [], 0
    for level in range(len(lengths)):
        chunk = math.prod(lengths[level + 1:])
        count = (steps - start) // chunk
        if count:
            out.append((start, count, level))
            start += count * chunk
    assert start == steps
    return out


def divisors(n: int) -> list[int]:
    """All divisors of ``n``, ascending."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


#: A length is snapped to a divisor of what it must tile when one is this close.
SNAP_TOLERANCE: Final = 0.25


def snap(length: int, remaining: int) -> int:
    """The divisor of ``remaining`` nearest ``length`` if within 25%, else ``length``."""
    best = min(divisors(remaining), key=lambda k: (abs(k - length), k))
    return best if abs(best - length) <= SNAP_TOLERANCE * length else length


def root_lengths(seq_len: int, depth: int) -> tuple[int, ...]:
    """``depth`` level lengths, outermost first, each near ``seq_len ** (1 / depth)``.

    Inner lengths are snapped to divisors (``snap``) so most ``T`` are tiled
    exactly; the outermost is ``ceil(T / prod(inner))`` (the builder runs any
    remainder). Every level is at least 2 long when ``2 ** depth <= T``.

    >>> root_lengths(10_000, 2), root_lengths(1_000, 3)
    ((100, 100), (10, 10, 10))
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ScheduleError(f"depth: expected an integer >= 1, got {_show(depth)}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ScheduleError(f"seq_len: expected an integer >= 1, got {_show(seq_len)}")
    remaining, inner = seq_len, []  # innermost first
    for i in range(depth - 1):
        target = round(remaining ** (1 / (depth - i)))
        length = max(2, snap(target, remaining))
        inner.append(length)
        remaining = math.ceil(remaining / length)
    return (remaining, *reversed(inner))


def _check_unroll(unroll: Any) -> None:
    if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 1:
        raise ScheduleError(f"unroll: expected an integer >= 1, got {_show(unroll)}")
    if unroll > MAX_LENGTH:
        raise ScheduleError(f"unroll: must be <= {MAX_LENGTH}, got {_show(unroll)}")


def _policy_label(policy: Policy) -> str:
    if policy.name in FACTORY_POLICIES:
        names = ",".join(policy.args) or ",".join(k for k, _ in policy.kwargs)
        return f"{policy.name}({names})"
    return policy.short


def _plain(value: Any) -> Any:
    """Convert tuples and mappings to plain lists/dicts for YAML."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _show(value: Any) -> str:
    text = repr(value)
    kind = type(value).__name__
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({kind})"


class _SafeLoaderNoAliases(yaml.SafeLoader):
    """The safe loader, refusing anchors/aliases (no 'billion laughs')."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            raise ScheduleError("YAML aliases (*name) are not allowed")
        return super().compose_node(parent, index)


def load_yaml_text(text: str | bytes, source: str = "<string>") -> Any:
    """One YAML document, read safely; every failure is a one-line ``ScheduleError``.

    The safe loader (plain data only), no anchors/aliases, at most
    ``_MAX_FILE_BYTES``, UTF-8 only; a tag whose value cannot be read
    (``!!int abc``, a date such as ``2020-02-30``) is an error too.
    """
    if isinstance(text, bytes):
        if len(text) > _MAX_FILE_BYTES:
            raise ScheduleError(f"{source}: larger than {_MAX_FILE_BYTES} bytes")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ScheduleError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if len(text) > _MAX_FILE_BYTES:
        raise ScheduleError(f"{source}: larger than {_MAX_FILE_BYTES} bytes")
    if _flow_depth(text) > _MAX_FLOW_DEPTH:
        # PyYAML's scanner is quadratic in open flow collections ("[[[[..."):
        # refuse before it spends seconds on them.
        raise ScheduleError(f"{source}: YAML nested too deeply (over {_MAX_FLOW_DEPTH} "
                            "levels of [ ] / { })")
    try:
        return yaml.load(text, Loader=_SafeLoaderNoAliases)
    except ScheduleError as e:
        raise ScheduleError(f"{source}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
        raise ScheduleError(f"{source}: not valid YAML{where}: {_line(problem)}") from None
    except RecursionError:
        raise ScheduleError(f"{source}: YAML nested too deeply") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as e:
        # PyYAML's constructors raise these for a tagged or implicit value they
        # cannot convert (!!int abc, !!bool maybe, 2020-02-30, a 5000-digit int).
        raise ScheduleError(
            f"{source}: not valid YAML: a value cannot be read ({type(e).__name__}: "
            f"{_line(str(e))})") from None


_MAX_FLOW_DEPTH: Final = 100
_BRACKETS: Final = re.compile(r"[\[\]{}]")


def _flow_depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` (an upper bound: quotes are not parsed)."""
    depth = deepest = 0
    for m in _BRACKETS.finditer(text):
        if m.group() in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > _MAX_FLOW_DEPTH:
                    break
        elif depth:
            depth -= 1
    return deepest


def read_yaml_file(path: str | os.PathLike[str], what: str = "schedule file") -> Any:
    """``load_yaml_text`` of a file (at most ``_MAX_FILE_BYTES`` are read)."""
    return load_yaml_text(_read_bytes(path, what), str(path))


def parse_schedule(text: str | bytes, source: str = "<string>") -> Schedule:
    """Parse the YAML text of a schedule; every failure is a ``ScheduleError``."""
    data = load_yaml_text(text, source)
    try:
        return Schedule.from_data(data)
    except RecursionError:
        raise ScheduleError(f"{source}: nested too deeply") from None
    except ScheduleError as e:
        raise ScheduleError(f"{source}: {_line(str(e))}") from None


def _line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_schedule(path: str | os.PathLike[str]) -> Schedule:
    """Load a schedule from a YAML file (safe loader, no aliases).

    Raises:
      ScheduleError: the file is missing, unreadable, not YAML, or not a valid
        schedule; the message names the file, the field and the fix.
    """
    return parse_schedule(_read_bytes(path, "schedule file"), str(path))


def _read_bytes(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        with Path(path).open("rb") as fh:
            return fh.read(_MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ScheduleError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    except ValueError as e:  # e.g. a NUL byte in the path
        raise ScheduleError(f"{path!r}: cannot read {what} ({e})") from None


def dump_schedule(schedule: Schedule) -> str:
    """The YAML text of a schedule."""
    return yaml.safe_dump(schedule.to_data(), sort_keys=False, default_flow_style=None)


def save_schedule(schedule: Schedule, path: str | os.PathLike[str]) -> Path:
    """Write a schedule as YAML atomically (temp file in the same folder + rename)."""
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule: expected an autoremat.Schedule, got {type(schedule).__name__}")
    return atomic_write_text(path, dump_schedule(schedule))
