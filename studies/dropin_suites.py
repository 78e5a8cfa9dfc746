"""Drop-in proof: run Flax's and JAX's own scan tests against autoremat.

The test files are public code and are not part of this repository: check out
the Flax and JAX releases matching the installed versions and pass the two
checkout roots (directories holding ``tests/``)::

    git --git-dir=FLAX.git archive v0.12.8 tests | tar -x -C /tmp/flax
    git --git-dir=JAX.git archive jax-v0.10.2 tests | tar -x -C /tmp/jax
    python studies/dropin_suites.py --flax /tmp/flax --jax /tmp/jax

Each suite runs once per kind in its own ``pytest`` subprocess (one at a
time; they are CPU-heavy) with the original's name swapped for autoremat's:

* ``nnx_scan``: ``tests/nnx/transforms_test.py -k TestScan``, ``nnx.scan`` ->
  ``autoremat.nnx.scan``;
* ``linen_scan``: ``tests/linen/linen_transforms_test.py -k scan``,
  ``nn.scan`` -> ``autoremat.linen.scan``;
* ``nnx_rnn`` / ``linen_rnn``: Flax's recurrent suites, ``nnx.RNN`` ->
  ``autoremat.nnx.RNN`` and ``nn.RNN`` -> ``autoremat.linen.RNN``;
* ``lax_scan``: JAX's ``tests/lax_control_flow_test.py -k scan``,
  ``lax.scan`` -> ``autoremat.scan`` (``jax.lax.scan`` is replaced before the
  test module is imported, since its parameter lists capture it; calls made
  by autoremat's or JAX's own code still reach the original).

Kinds: ``original`` (nothing swapped: the baseline), ``nested``
(``autoremat.nested([4, 3])``) and ``binomial`` (``autoremat.binomial(3)``).
The script prints every failing test with its error's first line, the
counts per suite and kind, and the failures grouped by error; ``--markdown``
writes that as a table.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("original", "nested", "binomial")


@dataclass(frozen=True)
class Suite:
    """One original test file, where it lives, its ``-k`` selection and what is swapped."""

    name: str
    root: str  # "flax" or "jax": the checkout holding the file
    path: str
    select: str
    swapped: str  # for the table


SUITES = (
    Suite("nnx_scan", "flax", "tests/nnx/transforms_test.py", "TestScan",
          "nnx.scan -> autoremat.nnx.scan"),
    Suite("linen_scan", "flax", "tests/linen/linen_transforms_test.py", "scan",
          "nn.scan -> autoremat.linen.scan"),
    Suite("nnx_rnn", "flax", "tests/nnx/nn/recurrent_test.py", "",
          "nnx.RNN -> autoremat.nnx.RNN"),
    Suite("linen_rnn", "flax", "tests/linen/linen_recurrent_test.py", "",
          "nn.RNN -> autoremat.linen.RNN"),
    Suite("lax_scan", "jax", "tests/lax_control_flow_test.py", "scan",
          "lax.scan -> autoremat.scan"),
)


# -- inside the pytest subprocess ----------------------------------------------
def _schedule(kind: str) -> Any:
    import autoremat

    if kind == "nested":
        return autoremat.nested([4, 3])
    return autoremat.binomial(3)


class _Proxy:
    """A module with some attributes replaced; everything else is the module's."""

    def __init__(self, module: Any, **swapped: Any) -> None:
        self._module, self._swapped = module, swapped

    def __getattr__(self, name: str) -> Any:
        if name in self._swapped:
            return self._swapped[name]
        return getattr(self._module, name)


def _swaps(suite: str, kind: str) -> dict[str, Any]:
    """``{global name in the test module: replacement}`` for a Flax suite."""
    import functools

    import flax.linen as nn
    from flax import nnx

    import autoremat
    import autoremat.linen
    import autoremat.nnx

    schedule = _schedule(kind)
    if suite == "nnx_scan":
        return {"nnx": _Proxy(nnx, scan=functools.partial(autoremat.nnx.scan, schedule=schedule))}
    if suite == "linen_scan":
        return {"nn": _Proxy(nn, scan=functools.partial(autoremat.linen.scan, schedule=schedule))}
    if suite == "nnx_rnn":
        class RNN(autoremat.nnx.RNN):
            def __init__(self, cell: Any, **kwargs: Any) -> None:
                kwargs.setdefault("schedule", schedule)
                super().__init__(cell, **kwargs)

        return {"nnx": _Proxy(nnx, RNN=RNN)}
    if suite == "linen_rnn":
        rnn = type("RNN", (autoremat.linen.RNN,), {
            "__annotations__": {"schedule": "Any"}, "schedule": schedule,
            "__module__": autoremat.linen.RNN.__module__})
        return {"nn": _Proxy(nn, RNN=rnn)}
    return {}


def _swap_lax_scan(kind: str) -> None:
    """Replace ``jax.lax.scan`` for callers outside JAX and autoremat."""
    import functools

    import jax

    import autoremat

    original = jax.lax.scan
    schedule = _schedule(kind)

    @functools.wraps(original)
    def scan(*args: Any, **kwargs: Any) -> Any:
        frame = sys._getframe(1)
        while frame is not None:
            module = frame.f_globals.get("__name__", "")
            if not module.startswith(("jax.", "jax", "functools", "contextlib")):
                break
            frame = frame.f_back  # type: ignore[assignment]
        if frame is None or module.startswith("autoremat"):
            return original(*args, **kwargs)
        return autoremat.scan(*args, schedule=schedule, **kwargs)

    jax.lax.scan = scan


class _Plugin:
    """Swaps the names and records each test's outcome and error line."""

    def __init__(self, suite: str, kind: str) -> None:
        self.suite, self.kind = suite, kind
        self.results: dict[str, dict[str, str]] = {}

    def pytest_configure(self, config: Any) -> None:
        if self.suite == "lax_scan" and self.kind != "original":
            _swap_lax_scan(self.kind)

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        if self.kind == "original" or self.suite == "lax_scan":
            return
        swaps = _swaps(self.suite, self.kind)
        for module in {id(i.module): i.module for i in items if hasattr(i, "module")}.values():
            for name, value in swaps.items():
                if hasattr(module, name):
                    setattr(module, name, value)

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when != "call" and report.passed:
            return
        name = report.nodeid.split("::", 1)[-1]
        outcome = "skipped" if report.skipped else "passed" if report.passed else "failed"
        if name in self.results and self.results[name]["outcome"] == "failed":
            return
        crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
        message = crash.message if crash is not None and outcome == "failed" else ""
        self.results[name] = {"outcome": outcome, "error": message.splitlines()[0][:300]
                              if message else ""}


def _run_one(suite_name: str, kind: str, root: str, select: str, out: str) -> int:
    import pytest

    suite = next(s for s in SUITES if s.name == suite_name)
    plugin = _Plugin(suite_name, kind)
    args = [os.path.join(root, suite.path), "-q", "-p", "no:cacheprovider", "-rN",
            "--rootdir", root, "-c", os.devnull, "-W", "ignore"]
    if select:
        args += ["-k", select]
    rc = pytest.main(args, plugins=[plugin])
    Path(out).write_text(json.dumps(plugin.results, indent=1))
    return int(rc)


# -- the driver -----------------------------------------------------------------
def _classify(error: str) -> str:
    """The class of a failure: its first line with numbers, shapes and names blurred."""
    text = re.sub(r"\d+", "N", error)
    text = re.sub(r"'[^']*'", "'…'", text)
    return text[:140]


def run_suite(suite: Suite, kind: str, roots: dict[str, str], select: str,
              timeout: int) -> dict[str, dict[str, str]]:
    root = roots[suite.root]
    if not Path(root, suite.path).is_file():
        raise SystemExit(f"--{suite.root}: {Path(root, suite.path)} not found")
    selection = " and ".join(f"({s})" for s in (suite.select, select) if s)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, __file__, "_one", suite.name, kind, root, selection, out]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"<suite>": {"outcome": "failed", "error": f"timed out after {timeout} s"}}
        if not Path(out).exists():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            return {"<suite>": {"outcome": "failed", "error": " | ".join(tail)}}
        return json.loads(Path(out).read_text())


def report(results: dict[tuple[str, str], dict[str, dict[str, str]]]) -> str:
    lines = ["| suite | swapped | kind | passed | failed | skipped |",
             "|---|---|---|---|---|---|"]
    groups: list[str] = []
    for (suite_name, kind), tests in results.items():
        suite = next(s for s in SUITES if s.name == suite_name)
        count = collections.Counter(t["outcome"] for t in tests.values())
        lines.append(f"| `{suite.path}` `-k {suite.select or '(all)'}` | `{suite.swapped}` "
                     f"| {kind} | {count['passed']} | {count['failed']} | {count['skipped']} |")
        classes: dict[str, list[str]] = collections.defaultdict(list)
        for name, t in tests.items():
            if t["outcome"] == "failed":
                classes[_classify(t["error"])].append(name)
        if classes:
            groups.append(f"\n**{suite_name} / {kind}**: failures by error\n")
            for cls, names in sorted(classes.items(), key=lambda kv: -len(kv[1])):
                shown = ", ".join(f"`{n}`" for n in sorted(names)[:6])
                more = f" (+{len(names) - 6} more)" if len(names) > 6 else ""
                groups.append(f"- {len(names)} × `{cls}`: {shown}{more}")
    return "\n".join(lines + groups) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_one":
        return _run_one(*argv[1:6])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flax", help="a Flax checkout root (holding tests/) of the "
                                       "installed release")
    parser.add_argument("--jax", help="a JAX checkout root (holding tests/) of the "
                                      "installed release")
    parser.add_argument("--suite", action="append", choices=[s.name for s in SUITES],
                        help="run only these suites (repeatable; default: all with a root)")
    parser.add_argument("--kind", action="append", choices=KINDS,
                        help="run only these kinds (repeatable; default: nested, binomial)")
    parser.add_argument("-k", default="", help="a further pytest -k selection")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per suite run")
    parser.add_argument("--json", help="write all outcomes to this JSON file")
    parser.add_argument("--markdown", help="write the results table to this file")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print every test's outcome, not only failures")
    args = parser.parse_args(argv)
    roots = {k: v for k, v in (("flax", args.flax), ("jax", args.jax)) if v}
    if not roots:
        parser.error("give --flax and/or --jax (checkout roots holding tests/)")
    suites = [s for s in SUITES if s.root in roots and (not args.suite or s.name in args.suite)]
    kinds = args.kind or ["nested", "binomial"]
    results: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
    for suite in suites:
        for kind in kinds:
            tests = run_suite(suite, kind, roots, args.k, args.timeout)
            results[(suite.name, kind)] = tests
            for name, t in sorted(tests.items()):
                if args.verbose or t["outcome"] == "failed":
                    print(f"{suite.name:10} {kind:8} {t['outcome'].upper():7} {name}  {t['error']}")
            count = collections.Counter(t["outcome"] for t in tests.values())
            print(f"== {suite.name} / {kind}: {count['passed']} passed, {count['failed']} failed, "
                  f"{count['skipped']} skipped", flush=True)
    table = report(results)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {f"{s}/{k}": v for (s, k), v in results.items()}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
