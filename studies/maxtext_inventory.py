"""MaxText's remat names and presets, read from its own source (no MaxText import).

``autoremat export --format maxtext`` writes MaxText's ``remat_policy: custom`` keys and
names the preset a pick equals. Those names and presets are MaxText's, and they change
between releases; this script reads them from a MaxText wheel (``maxtext-X.whl``) or a
checkout (its root, ``src/maxtext`` or the package folder) by parsing the source with
``ast`` -- nothing is imported or run -- and writes the pinned file autoremat reads
(``autoremat/_schedules/maxtext_names.json``; ``tests/test_maxtext_names.py`` checks
the export against it):

- ``version``: ``maxtext/version.py``'s ``__version__``;
- ``config_keys``: the config fields typed ``RematLocation`` (``configs/types.py``),
  with their defaults, in order; ``base_yml_keys``: the keys of ``configs/base.yml``
  whose value is ``remat`` / ``device`` / ``offload``, in its order;
- ``custom_reads``: the tensors ``remat_policy: custom`` turns into
  ``tensors_on_device`` / ``tensors_to_offload`` (the list in ``MaxTextConfig``'s
  validator), in that order: the only keys the custom policy honours;
- ``presets``: every ``remat_policy`` the decoder's ``get_remat_policy`` builds, as
  ``{"saved": [...], "offloaded": [...]}`` (``full``: nothing saved; ``custom``
  left out: it is the keys);
- ``tags``: every ``checkpoint_name`` tag in the package's source with the files that
  write it; a name built at run time (``"mlp" + dense_name``) is resolved from the
  assignments in its function (``f"wi_{idx}"`` becomes the pattern ``mlpwi_*``) and
  matched against the config keys; a tag passed as a kernel argument
  (``residual_checkpoint_name="context"``: the flash kernels' saved residuals) is
  listed under ``kernel_residual_tags``.

Usage::

    pip download --no-deps maxtext==0.2.5 -d /tmp/mt
    python studies/maxtext_inventory.py /tmp/mt/maxtext-0.2.5-py3-none-any.whl \
        --out autoremat/_schedules/maxtext_names.json
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

LOCATIONS = ("remat", "device", "offload")


def sources(path: Path) -> dict[str, str]:
    """``maxtext/...`` relative path -> text, for every ``.py`` and ``.yml`` of the
    package in a wheel or a checkout."""
    out: dict[str, str] = {}
    if path.is_file() and path.suffix == ".whl":
        with zipfile.ZipFile(path) as whl:
            for name in whl.namelist():
                if name.startswith("maxtext/") and name.endswith((".py", ".yml")):
                    out[name] = whl.read(name).decode("utf-8")
        return out
    for root in (path / "src" / "maxtext", path / "maxtext", path):
        if (root / "configs" / "base.yml").is_file():
            for file in sorted(root.rglob("*")):
                if file.suffix in (".py", ".yml") and file.is_file():
                    rel = "maxtext/" + file.relative_to(root).as_posix()
                    out[rel] = file.read_text(encoding="utf-8")
            return out
    sys.exit(f"path: {path} is neither a MaxText wheel (.whl) nor a checkout holding "
             "configs/base.yml (its root, src/maxtext or the package folder)")


def version(src: dict[str, str]) -> str:
    tree = ast.parse(src["maxtext/version.py"])
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
            return str(ast.literal_eval(node.value))
    sys.exit("maxtext/version.py: no __version__")


def config_keys(types_src: str) -> dict[str, str]:
    """Fields annotated ``RematLocation``: name -> default location."""
    out: dict[str, str] = {}
    for node in ast.walk(ast.parse(types_src)):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(node.annotation, ast.Name)
                and node.annotation.id == "RematLocation"):
            default = ""
            if isinstance(node.value, ast.Call) and node.value.args:
                arg = node.value.args[0]
                if isinstance(arg, ast.Attribute):
                    default = arg.attr.lower()
            out[node.target.id] = default
    return out


def base_yml_keys(base_yml: str) -> list[str]:
    """Top-level keys of base.yml whose value is a remat location, in order."""
    keys = []
    for line in base_yml.splitlines():
        if line[:1].isspace() or ":" not in line or line.startswith("#"):
            continue
        key, value = line.split(":", 1)
        value = value.split("#", 1)[0].strip().strip("'\"")
        if value in LOCATIONS:
            keys.append(key.strip())
    return keys


def custom_reads(types_src: str) -> list[str]:
    """The ``tensors`` list whose entries set ``tensors_on_device`` in ``MaxTextConfig``
    (else the first class that has one)."""
    found: list[tuple[str, list[str]]] = []
    for cls in ast.walk(ast.parse(types_src)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in ast.walk(cls):
            if not isinstance(fn, ast.FunctionDef):
                continue
            sets_device = any(isinstance(n, ast.Attribute) and n.attr == "tensors_on_device"
                              and isinstance(n.ctx, ast.Store) for n in ast.walk(fn))
            if not sets_device:
                continue
            for node in ast.walk(fn):
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
                        and any(isinstance(t, ast.Name) and t.id == "tensors"
                                for t in node.targets)):
                    found.append((cls.name, [ast.literal_eval(e) for e in node.value.elts]))
    if not found:
        sys.exit("configs/types.py: no 'tensors' list setting tensors_on_device")
    return next((names for cls, names in found if cls == "MaxTextConfig"), found[0][1])


def _strings(node: ast.AST) -> list[str] | None:
    """A literal list / tuple of strings, or ``None``."""
    if isinstance(node, (ast.List, ast.Tuple)) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]  # type: ignore[attr-defined]
    return None


def _policy_of(call: ast.Call, helpers: dict[str, ast.FunctionDef]) -> dict[str, list[str]] | None:
    """What one policy call saves and offloads, or ``None`` when it is not a policy by
    names (``custom``: built from the config)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name == "save_only_these_names":
        names = [a.value for a in call.args if isinstance(a, ast.Constant)]
        return {"saved": names, "offloaded": []}
    if name == "save_and_offload_only_these_names":
        kw = {k.arg: _strings(k.value) for k in call.keywords}
        if kw.get("names_which_can_be_saved") is None \
                or kw.get("names_which_can_be_offloaded") is None:
            return None
        return {"saved": kw["names_which_can_be_saved"] or [],
                "offloaded": kw["names_which_can_be_offloaded"] or []}
    if name in helpers:
        return _helper_policy(helpers[name], call)
    return None


def _helper_policy(fn: ast.FunctionDef, call: ast.Call) -> dict[str, list[str]] | None:
    """Evaluate a helper like ``minimal_policy(with_context=True)``: a names list, appends
    under flags, a ``save_only_these_names(*names)`` return."""
    defaults = fn.args.defaults
    params = [a.arg for a in fn.args.args][-len(defaults):] if defaults else []
    env: dict[str, object] = {p: ast.literal_eval(d) for p, d in zip(params, defaults, strict=True)}
    env.update({k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg})
    names: list[str] = []

    def run(body: list[ast.stmt]) -> None:
        for st in body:
            if isinstance(st, ast.Assign) and _strings(st.value) is not None:
                names[:] = _strings(st.value) or []
            elif isinstance(st, ast.If) and isinstance(st.test, ast.Name):
                run(st.body if env.get(st.test.id) else st.orelse)
            elif (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
                  and isinstance(st.value.func, ast.Attribute)
                  and st.value.func.attr == "append" and st.value.args
                  and isinstance(st.value.args[0], ast.Constant)):
                names.append(st.value.args[0].value)

    run(fn.body)
    return {"saved": list(names), "offloaded": []}


def _labels(test: ast.expr) -> list[str]:
    """The ``remat_policy`` values an ``if`` test matches (``== "x"``, ``in {...}``)."""
    if isinstance(test, ast.Compare) and len(test.comparators) == 1:
        right = test.comparators[0]
        if isinstance(test.ops[0], ast.Eq) and isinstance(right, ast.Constant):
            return [right.value]
        if isinstance(test.ops[0], ast.In) and isinstance(right, (ast.Set, ast.List, ast.Tuple)):
            return [e.value for e in right.elts if isinstance(e, ast.Constant)]
    return []


def presets(decoder_src: str) -> dict[str, dict[str, list[str]]]:
    """Label -> what it saves and offloads, from ``get_remat_policy``'s if/elif chain."""
    tree = ast.parse(decoder_src)
    helpers = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
    fn = helpers.get("get_remat_policy")
    if fn is None:
        sys.exit("no get_remat_policy in the decoder")
    out: dict[str, dict[str, list[str]]] = {}

    def branch(node: ast.If) -> None:
        labels = _labels(node.test)
        if labels:
            policy: dict[str, list[str]] | None = None
            for st in ast.walk(ast.Module(body=node.body, type_ignores=[])):
                if isinstance(st, ast.Call):
                    policy = policy or _policy_of(st, helpers)
            for label in labels:
                if policy is not None:
                    out[label] = policy
        for st in node.orelse:
            if isinstance(st, ast.If):
                branch(st)
            elif isinstance(st, ast.Assert):  # the final else: 'full', no policy
                out.update({lb: {"saved": [], "offloaded": []} for lb in _labels(st.test)})

    for node in ast.walk(fn):
        if isinstance(node, ast.If) and _labels(node.test):
            branch(node)
            break
    return out


def _values(expr: ast.expr, fn: ast.AST | None) -> list[str]:
    """The strings ``expr`` may be (a glob where an f-string has a hole)."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return [expr.value]
    if isinstance(expr, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "*" for v in expr.values)]
    if isinstance(expr, ast.IfExp):
        return _values(expr.body, fn) + _values(expr.orelse, fn)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return [a + b for a in _values(expr.left, fn) for b in _values(expr.right, fn)]
    if isinstance(expr, ast.Name) and fn is not None:
        return [v for node in ast.walk(fn) if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == expr.id for t in node.targets)
                for v in _values(node.value, None)]
    return []


def _functions(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None]]:
    """Every node with its innermost enclosing function."""
    def visit(node: ast.AST, fn: ast.AST | None) -> Iterator[tuple[ast.AST, ast.AST | None]]:
        yield node, fn
        inner = node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner)
    yield from visit(tree, None)


def tags(src: dict[str, str], keys: list[str]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """``checkpoint_name`` tags -> files, and the kernels' residual tags -> files."""
    found: dict[str, set[str]] = {}
    residual: dict[str, set[str]] = {}
    for rel, text in src.items():
        if not rel.endswith(".py"):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node, fn in _functions(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "checkpoint_name":
                arg = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "name"), None)
                for value in _values(arg, fn) if arg is not None else []:
                    matched = fnmatch.filter(keys, value) if "*" in value else [value]
                    for tag in matched:
                        found.setdefault(tag, set()).add(rel)
            for k in node.keywords:
                if (k.arg and k.arg.endswith("checkpoint_name") and k.arg != "name"
                        and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)):
                    residual.setdefault(k.value.value, set()).add(rel)
    return ({t: sorted(f) for t, f in sorted(found.items())},
            {t: sorted(f) for t, f in sorted(residual.items())})


def inventory(path: Path) -> dict[str, object]:
    src = sources(path)
    types_src = src["maxtext/configs/types.py"]
    keys = config_keys(types_src)
    decoder = next((src[p] for p in ("maxtext/layers/nnx_decoders.py",
                                     "maxtext/layers/decoders.py")
                    if p in src and "def get_remat_policy" in src[p]), None)
    if decoder is None:
        sys.exit("no layers/nnx_decoders.py or layers/decoders.py with get_remat_policy")
    tagged, residual = tags(src, list(keys))
    return {
        "source": "maxtext " + version(src) + " (studies/maxtext_inventory.py)",
        "version": version(src),
        "config_keys": keys,
        "base_yml_keys": base_yml_keys(src["maxtext/configs/base.yml"]),
        "custom_reads": custom_reads(types_src),
        "presets": presets(decoder),
        "tags": tagged,
        "kernel_residual_tags": residual,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a MaxText wheel (.whl) or checkout")
    parser.add_argument("--out", type=Path, help="the JSON file to write (default: print)")
    args = parser.parse_args()
    text = json.dumps(inventory(args.path), indent=1) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
