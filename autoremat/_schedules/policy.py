"""The vocabulary of a schedule's fields: checkpoint policies by name, levels, ints.

``Policy`` names a ``jax.checkpoint_policies`` member (imported only when a
policy is resolved, so this module stays jax-free); ``Level`` is one level of
a nested scan. ``check_int`` is the one integer check every kind's fields use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from autoremat._errors import ScheduleError, did_you_mean

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
#: The factories whose arguments are ``jax.ad_checkpoint.checkpoint_name`` tags
#: (``Policy.names``): a schedule naming a tag the step lacks is refused when it
#: is traced (``autoremat._scan.checkpoint_names``).
NAME_POLICIES: Final = (
    "save_only_these_names",
    "save_any_names_but_these",
    "save_anything_except_these_names",
    "save_and_offload_only_these_names",
)
#: What a name policy does with the tags it names, for ``autoremat show``.
_NAMES_MEAN: Final = {
    "save_only_these_names": "keeps only the tagged {names}; recomputes all else",
    "save_any_names_but_these": "keeps every tagged value but {names}; recomputes the rest",
    "save_anything_except_these_names": "keeps everything but the tagged {names}",
}
#: ``none`` wraps nothing in ``jax.checkpoint``: that level stores every
#: residual, exactly like a plain ``lax.scan``.
NO_REMAT: Final = "none"
#: How printed text (``Schedule.describe``) names it: not one word from ``nothing``.
NO_REMAT_LABEL: Final = "no-remat"
#: The name the nested builder gives the carry entering each chunk of a level whose
#: policy names it (``jax.ad_checkpoint.checkpoint_name``): the chunk-boundary carries.
CARRY_NAME: Final = "autoremat_carry"
ALL_POLICY_NAMES: Final = (NO_REMAT, *ZERO_ARG_POLICIES, *FACTORY_POLICIES)
#: Where an offloading policy moves what it offloads: from the device to pinned host
#: memory (its keyword arguments, sorted as ``Policy.kwargs`` keeps them).
OFFLOAD_TO_HOST: Final = (("offload_dst", "pinned_host"), ("offload_src", "device"))

#: Limits of a valid schedule: a level's length and ``unroll`` are ``lax.scan``
#: lengths (int32).
MAX_LENGTH: Final = 2**31 - 1


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
                f"{', '.join(ALL_POLICY_NAMES)}{did_you_mean(self.name, ALL_POLICY_NAMES)}"
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
    def names(self) -> tuple[str, ...]:
        """The ``checkpoint_name`` tags this policy refers to, in order (empty but for
        ``NAME_POLICIES``): its list, or its ``names_*`` keyword arguments."""
        if self.name not in NAME_POLICIES:
            return ()
        found = list(self.args)
        for key, value in self.kwargs:
            if key.startswith("names"):
                found.extend(value if isinstance(value, tuple) else (value,))
        return tuple(dict.fromkeys(found))

    def explain_names(self) -> str | None:
        """What a name policy keeps, recomputes or offloads, in words (``None``: not one)."""
        if self.name not in NAME_POLICIES:
            return None
        if self.name == "save_and_offload_only_these_names":
            kw = dict(self.kwargs)
            saved = ", ".join(_as_names(kw.get("names_which_can_be_saved", ()))) or "nothing"
            moved = ", ".join(_as_names(kw.get("names_which_can_be_offloaded", ()))) or "nothing"
            where = kw.get("offload_dst", "pinned_host")
            return f"keeps the tagged {saved} on the device, offloads {moved} to {where}; " \
                   "recomputes all else"
        return _NAMES_MEAN[self.name].format(names=", ".join(self.names) or "nothing")

    @property
    def offloads(self) -> bool:
        """The policy moves residuals to host memory (a study probes it first)."""
        return self.name.startswith(("offload", "save_and_offload"))

    @property
    def short(self) -> str:
        """A short label for printed text: ``nothing_saveable`` -> ``nothing`` (full remat);
        ``none`` -> ``no-remat``, so the two are not one word apart (the YAML and ``key()``
        keep ``none``)."""
        return NO_REMAT_LABEL if self.name == NO_REMAT else self.name.removesuffix("_saveable")

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
                    f"plain strings){did_you_mean(str(name), FACTORY_POLICIES)}"
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
        check_int("length", self.length)
        if not isinstance(self.policy, Policy):
            object.__setattr__(self, "policy", Policy.from_data(self.policy))


def check_levels(field: str, value: Any, most: int) -> tuple[Level, ...]:
    """``value`` as the ``Level``s a schedule's field holds (1 to ``most``: a nested
    schedule's levels, a groups schedule's groups).

    Raises:
      ScheduleError: naming ``field``: not a non-empty list, too many, or an entry that is
        not a ``Level``.
    """
    if not isinstance(value, (list, tuple)) or not value:
        raise ScheduleError(f"{field}: expected a non-empty list of {{length, policy}} "
                            f"mappings, got {_show(value)}")
    if len(value) > most:
        raise ScheduleError(f"{field}: at most {most} {field}, got {len(value)}")
    if not all(isinstance(lv, Level) for lv in value):
        raise ScheduleError(f"{field}: every entry must be an autoremat.Level")
    return tuple(value)


def mapping_of(data: Any, keys: Sequence[str], expected: str,
               where: str = "") -> Mapping[str, Any]:
    """``data`` (as YAML gave it) as a mapping holding only ``keys``.

    Raises:
      ScheduleError: not a mapping (``where: expected <expected>, got ...``; ``where`` is
        ``schedule`` at the top level), or its first unknown key, by its path, with the
        valid ones.
    """
    if not isinstance(data, Mapping):
        raise ScheduleError(f"{where or 'schedule'}: expected {expected}, got {_show(data)}")
    unknown = [k for k in data if k not in keys]
    if unknown:
        name = f"{where}.{unknown[0]}" if where else _show(unknown[0])
        raise ScheduleError(f"{name}: unknown key; valid keys: {', '.join(keys)}")
    return data


def offload_names(names: Sequence[str]) -> Policy:
    """``save_and_offload_only_these_names`` moving the tagged ``names`` to host memory and
    keeping none of them on the device."""
    return Policy("save_and_offload_only_these_names", kwargs=(
        ("names_which_can_be_offloaded", tuple(names)), ("names_which_can_be_saved", ()),
        *OFFLOAD_TO_HOST))


def _as_names(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def check_int(name: str, value: Any, low: int = 1, high: int = MAX_LENGTH) -> None:
    """``value`` is an int (not a bool) in ``[low, high]``, else a ``ScheduleError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(f"{name}: expected an integer >= {low}, got {_show(value)}")
    if value < low:
        raise ScheduleError(f"{name}: must be >= {low}, got {value}")
    if value > high:
        raise ScheduleError(f"{name}: must be <= {high}, got {_show(value)}")


def _show(value: Any) -> str:
    text = repr(value)
    kind = type(value).__name__
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({kind})"
