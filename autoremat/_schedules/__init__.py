"""The registry of schedule kinds, their constructors, and the YAML form of any schedule.

The base ``Schedule`` (``autoremat._schedules.base``) knows no kind; beside it,
``policy`` (checkpoint policies), ``lengths`` (chunk lengths), ``platforms`` and
``safe_yaml``; each kind is a module
with its builder (``nested``/``nested_scan``, its search space ``nested_space``;
``groups``, built on ``nested_scan``; ``binomial``/``binomial_scan``/
``binomial_backward`` over ``revolve``'s tables); ``frameworks`` writes a schedule as
MaxText's and Flax's one remat policy per layer, where it is one, with MaxText's names
and presets from ``maxtext_names`` (pinned from its source). This module
imports every kind module, registers each class in ``KINDS`` (``kind:`` name
-> class), and dispatches on it: ``from_data`` (a YAML mapping -> the kind's
object), ``parse_schedule`` / ``read_schedule`` / ``dump_schedule`` /
``save_schedule``. The constructors ``nested``, ``binomial``, ``groups``, ``root`` and
``plain`` (``autoremat.nested`` ...) are here too; as attributes of this package,
``nested`` and ``binomial`` are these functions, not the kind modules of those
names (import from those as ``from autoremat._schedules.nested import ...``).
Adding a kind is one module (a frozen ``Schedule`` subclass, see
``CONTRIBUTING.md``) and one ``register`` line here; everything that differs
by kind -- parsing and validation, ``describe`` / ``explain``, the cost
(``bounds.cost``) and the tuner's cost-model features, the search space, the
builder and the tests' gradient matrix -- is a method of that class.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from autoremat._atomic import atomic_write_text
from autoremat._errors import ScheduleError, one_line
from autoremat._schedules.base import (
    COMMON_KEYS,
    KNOWN_VERSIONS,
    SCHEDULE_VERSION,
    Schedule,
    check_options,
)
from autoremat._schedules.binomial import BinomialSchedule
from autoremat._schedules.groups import GroupsSchedule
from autoremat._schedules.lengths import root_lengths
from autoremat._schedules.nested import NestedSchedule
from autoremat._schedules.policy import NO_REMAT, Policy, _show, mapping_of
from autoremat._schedules.safe_yaml import load_yaml_text, read_bytes

#: A mapping without ``kind:`` is of this kind (files written before kinds existed).
DEFAULT_KIND: Final = "nested"
#: ``kind:`` name -> its ``Schedule`` subclass, in registration order (the search's order).
KINDS: Final[dict[str, type[Schedule]]] = {}


def register(kind: type[Schedule]) -> type[Schedule]:
    """Add a kind to ``KINDS`` (the search's seeds and space take kinds in registration order)."""
    if kind.kind in KINDS and KINDS[kind.kind] is not kind:
        raise ValueError(f"kind: {kind.kind!r} is already registered ({KINDS[kind.kind].__name__})")
    KINDS[kind.kind] = kind
    return kind


register(NestedSchedule)
register(BinomialSchedule)
register(GroupsSchedule)


def nested(
    lengths: Sequence[int],
    policies: str | Policy | Sequence[str | Policy | Mapping[str, Any]] = "nothing_saveable",
    *,
    unroll: int = 1,
    meta: Mapping[str, Any] | None = None,
) -> NestedSchedule:
    """Nested levels of the given lengths, with one policy or one per level.

    >>> nested([100, 100]).describe()
    '100x100 nothing/nothing unroll=1'
    """
    return NestedSchedule.build(lengths, policies, unroll=unroll, meta=meta)


def groups(groups: Sequence[tuple[int, str | Policy | Mapping[str, Any]]], *, unroll: int = 1,
           meta: Mapping[str, Any] | None = None) -> GroupsSchedule:
    """Consecutive groups of steps, each step under its group's policy (the groups
    kind's docstring): ``[(length, policy), ...]``, first steps first.

    >>> groups([(8, "dots_with_no_batch_dims_saveable"), (4, "nothing_saveable")]).describe()
    'groups 8 dots_with_no_batch_dims + 4 nothing unroll=1'
    """
    return GroupsSchedule.build(groups, unroll=unroll, meta=meta)


def binomial(snapshots: int, *, backward: str = "loops", unroll: int = 1,
             meta: Mapping[str, Any] | None = None) -> BinomialSchedule:
    """Binomial (Revolve) checkpointing with ``snapshots`` stored carries
    (``backward``: ``"loops"`` or ``"static"``, the binomial kind's docstring).

    >>> binomial(16).describe()
    'binomial s=16 unroll=1'
    """
    return BinomialSchedule(snapshots=snapshots, backward=backward, unroll=unroll,
                            meta=dict(meta or {}))


def root(
    seq_len: int,
    depth: int,
    policies: str | Policy | Sequence[str | Policy] = "nothing_saveable",
    *,
    unroll: int = 1,
    meta: Mapping[str, Any] | None = None,
) -> NestedSchedule:
    """``depth`` levels, each about ``seq_len ** (1 / depth)`` long (``root_lengths``).

    The classic sqrt(T) (``depth=2``) and cube-root (``depth=3``) schedules
    of Chen et al. 2016: ``O(depth * T^(1/depth))`` stored carries.

    >>> root(10_000, 2).describe()
    '100x100 nothing/nothing unroll=1'
    """
    return nested(root_lengths(seq_len, depth), policies, unroll=unroll, meta=meta)


def plain(length: int) -> NestedSchedule:
    """The reference: one plain ``lax.scan`` with no remat (linear memory)."""
    return nested([length], NO_REMAT)


def top_keys() -> tuple[str, ...]:
    """Every top-level key of a schedule file, of any kind."""
    own = (f for k in KINDS.values() for f in (*k.FIELDS, *k.OPTIONAL))
    return (*COMMON_KEYS[:2], *own, *COMMON_KEYS[2:])


def from_data(data: Any) -> Schedule:
    """Check a mapping's shape (as loaded from YAML) and build its kind.

    The keys, ``version`` and ``kind`` are checked here; every value is
    validated by the kind's constructor (``parse_fields`` adds the path).
    """
    keys = top_keys()
    data = mapping_of(data, keys, f"a mapping with keys {', '.join(keys)}")
    if "version" not in data:
        raise ScheduleError(f"version: missing; add 'version: {SCHEDULE_VERSION}'")
    version = data["version"]
    if isinstance(version, bool) or version not in KNOWN_VERSIONS:
        raise ScheduleError(f"version: unknown version {_show(version)}; known versions: "
                            f"{', '.join(map(str, KNOWN_VERSIONS))}")
    name = data.get("kind", DEFAULT_KIND)
    kind = KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ScheduleError(f"kind: unknown kind {_show(name)}; valid: {', '.join(KINDS)}")
    for key in data:
        if key not in COMMON_KEYS and key not in kind.FIELDS and key not in kind.OPTIONAL:
            owner = next(k.kind for k in KINDS.values() if key in (*k.FIELDS, *k.OPTIONAL))
            raise ScheduleError(
                f"{key}: a {kind.kind} schedule has no {key} (a {owner} schedule has); "
                f"remove it or set kind: {owner}")
    for key, example in kind.FIELDS.items():
        if key not in data:
            raise ScheduleError(f"{key}: missing; a {kind.kind} schedule needs e.g. {example}")
    meta = data.get("meta")
    return kind(**kind.parse_fields(data), unroll=data.get("unroll", 1),
                meta={} if meta is None else meta,
                compiler_options=check_options(data.get("compiler_options")),
                fuse=data.get("fuse"))




def parse_schedule(text: str | bytes, source: str = "<string>") -> Schedule:
    """Parse the YAML text of a schedule; every failure is a ``ScheduleError``."""
    data = load_yaml_text(text, source)
    try:
        return from_data(data)
    except RecursionError:
        raise ScheduleError(f"{source}: nested too deeply") from None
    except ScheduleError as e:
        raise ScheduleError(f"{source}: {one_line(str(e))}") from None


def read_schedule(path: str | os.PathLike[str]) -> Schedule:
    """Load a schedule from a YAML file (safe loader, no aliases).

    Raises:
      ScheduleError: the file is missing, unreadable, not YAML, or not a valid
        schedule; the message names the file, the field and the fix.
    """
    return parse_schedule(read_bytes(path, "schedule file"), str(path))


def dump_schedule(schedule: Schedule) -> str:
    """The YAML text of a schedule."""
    return yaml.safe_dump(schedule.to_data(), sort_keys=False, default_flow_style=None)


def save_schedule(schedule: Schedule, path: str | os.PathLike[str]) -> Path:
    """Write a schedule as YAML atomically (temp file in the same folder + rename)."""
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule: expected an autoremat.Schedule, got {type(schedule).__name__}")
    return atomic_write_text(path, dump_schedule(schedule))
