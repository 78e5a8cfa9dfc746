"""The probe's verdicts kept across studies: a small JSON file beside the study storage.

A probe (``autoremat._search.probes.probe``) compiles and runs a short instance of the
problem -- seconds on a TPU each -- and its verdict depends on the device and its
XLA more than on the study. So every verdict is also written to a cache file,
keyed by the environment (platform, device kind, jax and jaxlib versions:
``environment_key``, and the probe's tolerances, ``probe.RULES``), the choice's
label (a combination of choices is one label: ``"offload_carries & offload_dots"``)
and the problem (its name and argument
fingerprint). A later study on the same environment reads it:

* a verdict found on the same problem is reused, whatever it says;
* a compile failure found on any problem (a verdict whose reason starts so,
  ``ProbeVerdict.compile_failed``) is reused for every problem (this XLA refuses that
  placement; the line says on which problem it was found); an offered choice, or one
  whose results differed or whose run failed, is probed again on another problem.

Where: ``probes.json`` in the folder of the SQLite file of the study storage
(``runs/probes.json`` for the default ``sqlite:///runs/autoremat.db``); for other
storages (PostgreSQL) ``runs/probes.json`` under the working folder; for an
in-memory storage none. The variable ``CACHE_ENV`` (AUTOREMAT_PROBE_CACHE) overrides it: a path, or ``off``.
A file that cannot be read or written is no cache (the study still records every
verdict, ``attrs.PROBE``).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from autoremat._atomic import atomic_write_text
from autoremat._search.probes.probe import ProbeVerdict

#: The file's name beside the SQLite file of the storage.
FILE_NAME: Final = "probes.json"
#: Environment variable: the cache file's path, or ``off``.
CACHE_ENV: Final = "AUTOREMAT_PROBE_CACHE"


def cache_path(storage: str | None) -> Path | None:
    """The cache file of a study storage URL (module doc); ``None``: no cache."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return None if env.lower() == "off" else Path(env)
    if storage is None or storage.startswith("sqlite:///"):
        path = (storage or "sqlite:///runs/autoremat.db").removeprefix("sqlite:///")
        if path in ("", ":memory:") or path.startswith("file::memory:"):
            return None
        return Path(path).parent / FILE_NAME
    return Path("runs") / FILE_NAME


def environment_key() -> str:
    """``platform|device kind|jax X|jaxlib Y`` of the default device."""
    import importlib.metadata

    import jax

    device = jax.devices()[0]
    try:
        jaxlib = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - jax needs it
        jaxlib = "?"
    return f"{device.platform}|{device.device_kind}|jax {jax.__version__}|jaxlib {jaxlib}"


@dataclass
class VerdictCache:
    """The verdicts of one environment (``env``) for one problem (``problem``)."""

    path: Path | None
    env: str
    problem: str

    def _read(self) -> dict[str, dict[str, dict[str, str]]]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, label: str) -> str | None:
        """The verdict on ``label``: this problem's, else a compile failure found on
        another problem (saying which); ``None``: probe it."""
        found = self._read().get(self.env, {}).get(label, {})
        if not isinstance(found, dict):
            return None
        mine = found.get(self.problem)
        if isinstance(mine, str):
            return mine
        for problem, verdict in found.items():
            if isinstance(verdict, str) and ProbeVerdict.parse(verdict).compile_failed:
                return f"{verdict} [found on {problem.split('|')[0]}]"
        return None

    def labels(self) -> list[str]:
        """The labels this environment has verdicts on (for any problem)."""
        found = self._read().get(self.env, {})
        return sorted(found) if isinstance(found, dict) else []

    def put(self, label: str, verdict: str) -> None:
        """Record ``verdict`` (best effort: a file that cannot be written is skipped)."""
        if self.path is None:
            return
        data = self._read()
        env = data.setdefault(self.env, {})
        if not isinstance(env, dict):
            env = data[self.env] = {}
        by_problem = env.setdefault(label, {})
        if not isinstance(by_problem, dict):
            by_problem = env[label] = {}
        by_problem[self.problem] = verdict
        with contextlib.suppress(OSError):  # no cache, then: the study still records it
            atomic_write_text(self.path, json.dumps(data, indent=1, sort_keys=True))
