"""The release's version and its CHANGELOG agree, and the CHANGELOG keeps Keep a Changelog's
form: ``## [X.Y.Z] - YYYY-MM-DD`` sections, newest first, each with at most one heading of
each kind (Added, Changed, Deprecated, Removed, Fixed, Security)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$")


def _sections() -> list[tuple[str, list[str]]]:
    """``(heading, lines)`` of each ``## `` section."""
    out: list[tuple[str, list[str]]] = []
    for line in (ROOT / "CHANGELOG.md").read_text().splitlines():
        if line.startswith("## "):
            out.append((line, []))
        elif out:
            out[-1][1].append(line)
    return out


def test_the_newest_release_is_the_packages_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    releases = [m for h, _ in _sections() if (m := RELEASE.match(h))]
    assert releases and releases[0].group(1) == version
    dates = [m.group(2) for m in releases]
    assert dates == sorted(dates, reverse=True)


def test_each_release_has_one_heading_of_each_kind_and_entries_under_it() -> None:
    for heading, lines in _sections():
        assert RELEASE.match(heading) or heading == "## [Unreleased]", heading
        kinds = [line[4:] for line in lines if line.startswith("### ")]
        assert all(k in KINDS for k in kinds), (heading, kinds)
        assert len(kinds) == len(set(kinds)), (heading, kinds)
        for kind in kinds:
            start = lines.index(f"### {kind}")
            entries = [ln for ln in lines[start + 1:] if not ln.startswith("### ")]
            assert any(ln.startswith("- ") for ln in entries[:3]), (heading, kind)
