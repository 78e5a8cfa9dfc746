"""The last study ``autoremat tune`` ran from a folder: ``runs/last_study.json``.

``tune`` records ``{"storage", "study_name"}`` there once its study is open; ``pareto`` and
``export`` default to it, and ``autoremat.last_study()`` opens it from Python.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Final

from autoremat._atomic import atomic_write_text
from autoremat._errors import TuneError
from autoremat._search.study import load_study

if TYPE_CHECKING:
    import optuna

#: Relative to the folder the command runs in.
LAST_STUDY_FILE: Final = Path("runs") / "last_study.json"


def remember_study(storage: str, study_name: str, folder: str | Path = ".") -> None:
    """Record ``study_name`` in ``storage`` as ``folder``'s last study (atomic)."""
    path = Path(folder) / LAST_STUDY_FILE
    path.parent.mkdir(exist_ok=True)
    atomic_write_text(path, json.dumps({"storage": storage, "study_name": study_name}))


def last_study_ref(folder: str | Path = ".") -> tuple[str, str] | None:
    """``(storage, study_name)`` of ``folder``'s last study; ``None`` when none is recorded
    (or the record is unreadable)."""
    try:
        data = json.loads((Path(folder) / LAST_STUDY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and {"storage", "study_name"} <= data.keys():
        return str(data["storage"]), str(data["study_name"])
    return None


def last_study(folder: str | Path = ".") -> optuna.Study:
    """The study the last ``autoremat tune`` run from ``folder`` measured (its
    ``runs/last_study.json``), as ``pareto`` and ``export`` open it by default.

    Raises:
      TuneError: no tune recorded one there, or its storage or study cannot be opened.
    """
    ref = last_study_ref(folder)
    if ref is None:
        raise TuneError(f"study_name: no {Path(folder) / LAST_STUDY_FILE} from an earlier "
                        "'autoremat tune' in this folder; open a study with "
                        "autoremat.load_study(name, storage)")
    storage, name = ref
    return load_study(name, storage)
