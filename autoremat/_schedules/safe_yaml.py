"""Reading YAML safely: one document, plain data, bounded size and depth.

Every failure is a one-line ``ScheduleError`` naming the source. Used for
schedule files (``autoremat._schedules.base``) and the CLI's study files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Final

import yaml

from autoremat._errors import ScheduleError, one_line

#: A schedule is a few KB even with its meta; PyYAML (pure Python) reads about
#: 40 KB/s of dense flow YAML, so a bigger file is refused before parsing.
_MAX_FILE_BYTES: Final = 1 << 16
_MAX_FLOW_DEPTH: Final = 100
_BRACKETS: Final = re.compile(r"[\[\]{}]")


class _SafeLoaderNoAliases(yaml.SafeLoader):
    """The safe loader, refusing anchors/aliases (no 'billion laughs')."""

    def compose_node(self, parent: Any, index: Any) -> Any:
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
        raise ScheduleError(f"{source}: not valid YAML{where}: {one_line(problem)}") from None
    except RecursionError:
        raise ScheduleError(f"{source}: YAML nested too deeply") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as e:
        # PyYAML's constructors raise these for a tagged or implicit value they
        # cannot convert (!!int abc, !!bool maybe, 2020-02-30, a 5000-digit int).
        raise ScheduleError(
            f"{source}: not valid YAML: a value cannot be read ({type(e).__name__}: "
            f"{one_line(str(e))})") from None


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
    return load_yaml_text(read_bytes(path, what), str(path))


def read_bytes(path: str | os.PathLike[str], what: str) -> bytes:
    """The first ``_MAX_FILE_BYTES + 1`` bytes of a file; a ``ScheduleError`` if unreadable."""
    try:
        with Path(path).open("rb") as fh:
            return fh.read(_MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ScheduleError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    except ValueError as e:  # e.g. a NUL byte in the path
        raise ScheduleError(f"{path!r}: cannot read {what} ({e})") from None
