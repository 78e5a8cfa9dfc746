"""The module import graph of ``autoremat`` has no cycle, counting imports inside functions
and ``TYPE_CHECKING`` blocks; the module map lists every module."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "autoremat"


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the ``autoremat`` modules it imports anywhere (top level, functions,
    ``TYPE_CHECKING`` blocks: an annotation that names a module is a dependency too)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                deps.add(node.module)
                deps |= {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {d for d in deps if d in modules and d != name and d != "autoremat"}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first search (each reported once per entry point)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                found.append([*stack[stack.index(dep):], dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_import_graph_is_acyclic() -> None:
    graph = import_graph()
    assert len(graph) > 30 and graph["autoremat._schedules"] >= {"autoremat._schedules.nested",
                                                            "autoremat._schedules.binomial"}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def function_level_imports() -> list[tuple[str, int, str]]:
    """``(module, line, imported module)`` for each import of an ``autoremat`` module
    inside a function (``from autoremat import x`` counts as ``autoremat.x``)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    found = []
    for name, path in sorted(modules.items()):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    subs = [f"{node.module}.{a.name}" for a in node.names]
                    targets = [s for s in subs if s in modules] or [node.module]
                else:
                    continue
                found += [(name, node.lineno, t) for t in targets if t.split(".")[0] == "autoremat"]
    return found


def test_no_function_level_import_of_a_module_import_autoremat_loads() -> None:
    """A function-level import is for what ``import autoremat`` must not load (jax and
    the modules that import it); anything it loads anyway is imported at the top."""
    code = "import autoremat, sys; print(' '.join(m for m in sys.modules if m.startswith('autoremat')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent)
    loaded = set(out.stdout.split())
    assert {"autoremat", "autoremat._schedules", "autoremat._search.tune"} <= loaded
    assert "autoremat._scan.scan" not in loaded  # it imports jax
    assert not any(m.startswith("autoremat._cli") for m in loaded)  # the library face only
    found = function_level_imports()
    assert any(t == "autoremat._scan.scan" for _, _, t in found)  # the finder finds lazy ones
    hoistable = [f"{m}:{line} imports {t}" for m, line, t in found if t in loaded]
    assert hoistable == []


def test_the_module_map_names_every_module() -> None:
    """``autoremat/__init__.py``'s docstring is the map of the pipeline: every package
    is a heading, every module in it a row (or named on its package's row)."""
    import autoremat

    doc = autoremat.__doc__ or ""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) == 2:  # autoremat/<stage>/<module>.py
            stage = rel.parts[0]
            section = doc.split(f"{stage}/", 1)[1].split("\n    _", 1)[0] if f"{stage}/" in doc else ""
            if rel.stem != "__init__" and not re.search(rf"\b{rel.stem}\b", section):
                missing.append(str(rel))
        elif not re.search(rf"\b{rel.stem}\b", doc):
            missing.append(str(rel))
    assert missing == []


#: Where the package's own words live: its modules (docstrings, comments, messages) and
#: the pages a user or contributor reads.
WRITTEN = (*sorted(PACKAGE.rglob("*.py")), *sorted((PACKAGE.parent / "docs").glob("*.md")),
           *sorted((PACKAGE.parent / "examples").glob("*.py")),
           PACKAGE.parent / "README.md", PACKAGE.parent / "CONTRIBUTING.md")
#: ``autoremat.x.y`` (a module, then attributes), ``autoremat/_stage/module.py`` or
#: ``_stage/module.py``; not a file named ``autoremat.yaml``.
DOTTED = re.compile(r"(?<![\w./-])autoremat(?:\.\w+)+(?!\.?\w)")
PATH = re.compile(r"(?<![\w./<>-])(?:autoremat/)?(_[a-z]+/\w+\.py)\b")
FILE_SUFFIXES = {"yaml", "db", "json", "md"}


def missing_names(text: str) -> list[str]:
    """The ``autoremat`` modules, attributes and module files ``text`` names that do not
    exist (imported to check: a name must resolve as written)."""
    import importlib

    missing = []
    for m in DOTTED.finditer(text):
        parts = m.group(0).split(".")
        if parts[-1] in FILE_SUFFIXES:
            continue
        i = len(parts)  # the longest prefix that is a module file
        while i > 1 and not (PACKAGE.parent.joinpath(*parts[:i]).with_suffix(".py").exists()
                             or PACKAGE.parent.joinpath(*parts[:i], "__init__.py").exists()):
            i -= 1
        obj = importlib.import_module(".".join(parts[:i]))
        for j, attr in enumerate(parts[i:], i):
            if not hasattr(obj, attr):
                missing.append(".".join(parts[:j + 1]))
                break
            obj = getattr(obj, attr)
    missing += [m.group(0) for m in PATH.finditer(text) if not (PACKAGE / m.group(1)).exists()]
    return missing


def test_every_autoremat_name_written_exists() -> None:
    """Docstrings, comments, docs/, README and CONTRIBUTING name only modules and
    attributes that exist (a module that moved leaves no stale name behind)."""
    found = [f"{path.relative_to(PACKAGE.parent)}: {name}" for path in WRITTEN
             for name in missing_names(path.read_text())]
    assert found == []


def test_the_name_check_finds_a_moved_module() -> None:
    text = ("``autoremat._scan.scan`` and ``autoremat.nested`` (`_scan/fuse.py`) "
            "exist; ``autoremat._schedules.fuse_rules``, ``autoremat.scan_axes`` and "
            "``_search/sampler.py`` do not; a file ``autoremat.yaml`` is no module.")
    assert missing_names(text) == ["autoremat._schedules.fuse_rules", "autoremat.scan_axes",
                                   "_search/sampler.py"]


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def test_each_stage_names_its_modules() -> None:
    """A stage package's docstring says what each of its modules is: a module added to a
    stage is named there (as in the module map)."""
    missing = [f"{stage.name}: {path.stem}" for stage in sorted(PACKAGE.glob("_*/"))
               if (stage / "__init__.py").exists()
               for path in sorted(stage.glob("*.py")) if path.stem != "__init__"
               and not re.search(rf"\b{path.stem}\b", _docstring(stage / "__init__.py"))]
    assert missing == []


#: Names a docstring may spell in capitals that are not autoremat's (XLA's status).
OUTSIDE_CONSTANTS = {"RESOURCE_EXHAUSTED"}


def test_every_constant_a_docstring_cites_is_defined() -> None:
    """A ``CONSTANT`` cited in a module's docstring is defined in the package (a module
    doc once cited ``METHODS``, which nothing defined)."""
    defined: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, ast.AnnAssign) else [])
            defined |= {t.id for t in targets if isinstance(t, ast.Name)}
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
    cited = [f"{path.relative_to(PACKAGE)}: {m.group(1)}" for path in sorted(PACKAGE.rglob("*.py"))
             for m in re.finditer(r"``([A-Z][A-Z0-9_]{2,})``", _docstring(path))
             if m.group(1) not in defined | OUTSIDE_CONSTANTS]
    assert cited == []


def test_jax_private_names_are_read_in_one_module() -> None:
    """Only ``autoremat/_jax.py`` imports JAX's private ``jax._src``."""
    importers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "jax._src" or n.startswith("jax._src.") for n in names):
                importers.append(path.relative_to(PACKAGE))
                break
    assert [str(p) for p in importers] == ["_jax.py"]


STAGES = ("_schedules", "_scan", "_flax", "_measure", "_models", "_search", "_cli")


def test_a_stage_imports_only_the_stages_before_it() -> None:
    """The pipeline reads one way: schedule -> builder (scan, flax) -> measure -> the
    built-in models -> search; the command's parts last."""
    backward = []
    for module, deps in import_graph().items():
        parts = module.split(".")
        if len(parts) < 2 or parts[1] not in STAGES:
            continue
        for dep in deps:
            d = dep.split(".")
            if len(d) > 1 and d[1] in STAGES and STAGES.index(d[1]) > STAGES.index(parts[1]):
                backward.append(f"{module} imports {dep}")
    assert backward == []
