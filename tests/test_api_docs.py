"""Every public name is documented: docs/api.md lists each name of ``autoremat.__all__``
(a name added to ``__all__`` without a line there fails here), and names nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import autoremat

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_every_public_name_has_a_line_in_the_api_page() -> None:
    listed = re.findall(r"^\| `autoremat\.(\w+)` \|", API_PAGE.read_text(), re.M)
    missing = sorted(set(autoremat.__all__) - set(listed))
    assert missing == [], f"docs/api.md has no line for autoremat.{', autoremat.'.join(missing)}"
    assert sorted(set(listed) - set(autoremat.__all__)) == []  # nothing private or gone
    assert len(listed) == len(set(listed))  # each once


def test_each_line_says_what_it_is_and_links_a_page() -> None:
    for line in API_PAGE.read_text().splitlines():
        if line.startswith("| `autoremat."):
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert len(cells) == 3 and cells[1], line
            assert re.search(r"\]\([a-z_]+\.md(#[a-z0-9-]+)?\)", cells[2]), line


def test_the_version_is_the_installed_distributions() -> None:
    from importlib.metadata import version

    assert autoremat.__version__ == version("autoremat")
