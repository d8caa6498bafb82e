"""Architecture rules of the code base, checked on the source with :mod:`ast`.

* No function longer than :data:`MAX_BODY_LINES` lines (its docstring not counted): a long
  function is written as a short recipe of named steps.
* No import of a project module inside a function (a function-local import hides an import
  circle); the one exception is the command line's lazy import of the torch harness, which
  needs the optional ``torch``. Third-party packages imported inside a function stand only in
  :data:`LOCAL_THIRD_PARTY` (heavy or optional ones kept off the planning path).
* No private name (``_name``) of one project module used by another: a name another module
  needs is public (in its module's ``__all__``, with a docstring), or the code moves.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Top-level packages of the project (those that exist are checked).
PACKAGES = ("perfmodel", "search", "harness", "cli", "validation", "emit", "realtime", "plots",
            "sweep")

#: Modules of the project, as the first part of an import's dotted name.
PROJECT_MODULES = frozenset((*PACKAGES, "hardware_specs"))

#: The torch harness's modules that import torch at their top: imported lazily, as torch is an
#: optional dependency.
TORCH_HARNESS = frozenset({"harness.worker", "harness.measure", "harness.model"})

#: Longest function body [lines], docstring excluded.
MAX_BODY_LINES = 80


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES if (ROOT / pkg).is_dir()
                  for p in (ROOT / pkg).rglob("*.py"))


def _functions(tree: ast.AST):
    """Every function and method of a module, nested ones included, with its qualified name."""
    def walk(node: ast.AST, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body from its first statement to the end of its last, the
    docstring excluded."""
    body = fn.body
    if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        body = body[1:]
    if not body:
        return 0
    return body[-1].end_lineno - body[0].lineno + 1


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _rel(path: Path) -> str:
    return (path.relative_to(ROOT) if path.is_relative_to(ROOT) else path).as_posix()


def long_functions() -> list[str]:
    """``path::function (N lines)`` for every function over :data:`MAX_BODY_LINES`."""
    out = []
    for path in _sources():
        for name, fn in _functions(_parse(path)):
            n = body_lines(fn)
            if n > MAX_BODY_LINES:
                out.append(f"{_rel(path)}:{fn.lineno}::{name} ({n} lines)")
    return out


def _is_cli(path: Path) -> bool:
    """A command-line module: in the ``cli`` package, or a ``cli*.py`` module."""
    rel = path.relative_to(ROOT)
    return rel.parts[0] == "cli" or rel.name.startswith("cli")


def _imported_modules(node: ast.Import | ast.ImportFrom, path: Path) -> list[str]:
    """The dotted module names an import statement reads (relative ones made absolute)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:  # relative: within the project by definition
        pkg = path.relative_to(ROOT).with_suffix("").parts[:-node.level]
        return [".".join((*pkg, node.module)) if node.module else ".".join(pkg)]
    return [node.module or ""]


def local_project_imports() -> list[str]:
    """``path:line in function: module`` for every import of a project module written inside
    a function, except the command line's lazy imports of ``harness``."""
    out = []
    for path in _sources():
        for name, fn in _functions(_parse(path)):
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                for mod in _imported_modules(node, path):
                    top = mod.split(".")[0]
                    if top not in PROJECT_MODULES:
                        continue  # torch and other third-party packages
                    if top == "harness" and _is_cli(path):
                        continue  # the lazy import of the torch harness
                    if mod in TORCH_HARNESS:
                        continue  # modules that import torch at their top
                    out.append(f"{_rel(path)}:{node.lineno} in {name}: {mod}")
    return sorted(set(out))


def test_body_lines_excludes_the_docstring():
    tree = ast.parse('def f():\n    """doc\n    more"""\n    a = 1\n    return a\n')
    (_, fn), = _functions(tree)
    assert body_lines(fn) == 2


def test_local_imports_are_found_in_methods_and_nested_functions():
    tree = ast.parse("class A:\n    def m(self):\n        def g():\n"
                     "            from perfmodel import step\n        return g\n")
    names = [n for n, _ in _functions(tree)]
    assert names == ["A.m", "A.m.g"]


def test_no_function_over_80_lines():
    long = long_functions()
    assert not long, (f"{len(long)} function(s) over {MAX_BODY_LINES} lines (docstring "
                      "excluded): compose them of named steps\n" + "\n".join(long))


def test_no_function_local_project_imports():
    local = local_project_imports()
    assert not local, (f"{len(local)} import(s) of project modules inside functions: import "
                       "at module top (an import circle is fixed by moving code, not hidden)\n"
                       + "\n".join(local))


def _is_project_module(dotted: str) -> bool:
    """Whether a dotted name is a module or package of the project (not a name inside one)."""
    if dotted.split(".")[0] not in PROJECT_MODULES:
        return False
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_aliases(tree: ast.Module, path: Path) -> dict[str, str]:
    """Local name -> project module, for every import binding a project module to a name."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _is_project_module(a.name):
                    aliases[a.asname or a.name.split(".")[0]] = a.asname and a.name or \
                        a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            mod = _imported_modules(node, path)[0]
            for a in node.names:
                if _is_project_module(f"{mod}.{a.name}"):
                    aliases[a.asname or a.name] = f"{mod}.{a.name}"
    return aliases


def cross_module_private_uses(paths: list[Path] | None = None) -> list[str]:
    """``path:line: module._name`` for every private name of a project module that another
    module imports (``from m import _x``) or reads (``m._x``)."""
    out = []
    for path in _sources() if paths is None else paths:
        tree = _parse(path)
        aliases = _module_aliases(tree, path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = _imported_modules(node, path)[0]
                if mod.split(".")[0] in PROJECT_MODULES:
                    out += [f"{_rel(path)}:{node.lineno}: {mod}.{a.name}" for a in node.names
                            if _private(a.name)]
            elif (isinstance(node, ast.Attribute) and _private(node.attr)
                  and isinstance(node.value, ast.Name) and node.value.id in aliases):
                out.append(f"{_rel(path)}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return sorted(set(out))


def test_cross_module_private_uses_are_found(tmp_path):
    src = tmp_path / "probe.py"
    text = ("from perfmodel.spec.specs import load_gpu, _hidden\n"
            "from perfmodel.spec import specs\nimport perfmodel.core.units as u\n"
            "x = specs._other + u._third + load_gpu._not_a_module\n")
    found = sorted(line.split(": ", 1)[1] for line in _uses_in(src, text))
    assert found == ["perfmodel.core.units._third", "perfmodel.spec.specs._hidden",
                     "perfmodel.spec.specs._other"]


def _uses_in(path: Path, text: str) -> list[str]:
    path.write_text(text, encoding="utf-8")
    return cross_module_private_uses([path])


def test_no_private_names_used_across_modules():
    uses = cross_module_private_uses()
    assert not uses, (f"{len(uses)} private name(s) of one module used by another: make the "
                      "name public (in __all__, with a docstring) or move the code\n"
                      + "\n".join(uses))


#: The only function-local imports of third-party packages, by file: each keeps a heavy or
#: optional package off the planning path (``import cli.main`` loads none of them).
LOCAL_THIRD_PARTY = {
    ("perfmodel/core/frames.py", "pandas"),  # DataFrames on request
    ("perfmodel/hardware/gemm_tiles.py", "scipy"),  # fitting a user's GEMM table
    ("perfmodel/hardware/simplex.py", "scipy"),  # triangulating a user's calibration points
    ("validation/validate_moe.py", "rich"),
    ("cli/verify.py", "torch"),
}


def local_third_party_imports() -> set[tuple[str, str]]:
    """(file, top-level package) of every third-party import written inside a function,
    outside the torch harness."""
    out = set()
    for path in _sources():
        if _rel(path).startswith("harness/"):
            continue
        for _name, fn in _functions(_parse(path)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    for mod in _imported_modules(node, path):
                        top = mod.split(".")[0]
                        if top not in PROJECT_MODULES and top != "__future__":
                            out.add((_rel(path), top))
    return out


def test_function_local_third_party_imports_stay_where_they_are_allowed():
    found = local_third_party_imports()
    assert found == LOCAL_THIRD_PARTY, (
        f"outside the allowed places: {sorted(found - LOCAL_THIRD_PARTY)}; "
        f"allowed but gone (drop them): {sorted(LOCAL_THIRD_PARTY - found)}")
