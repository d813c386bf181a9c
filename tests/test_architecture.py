"""The package structure, checked: imports between privaudit's modules run one way.

Every module of the installed packages is found through pyproject.toml's ``package-dir``
mapping (``privaudit.attacks`` lives in ``attacks/``, …) and its imports are read from the
source with :mod:`ast` — module-level, function-level and the annotation-only imports under
``if TYPE_CHECKING:`` alike (a type a module names is a dependency too). The checks:

- no import cycle between modules;
- each layer imports only the layers :data:`MAY_IMPORT` allows it (vocabulary ← setup ←
  per-example gradients ← defenses/attacks ← plugins ← engine ← scoring ← experiments ←
  API ← CLI), and those allowances themselves run one way (no two layers import each
  other);
- attacks see only the vocabulary (``privaudit.core``), never a defense or the engine;
- a function-level import is only for a heavy optional dependency (:data:`DEFERRED`), never a
  way around a cycle;
- no module reaches into another module's underscore members.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# layer -> the layers its modules may import (itself included)
MAY_IMPORT: dict[str, set[str]] = {
    "core": {"core"},
    "scenario": {"core", "scenario"},
    "grads": {"core", "grads"},
    "attacks": {"core", "attacks"},
    "defenses": {"core", "scenario", "grads", "defenses"},
    # eval: the membership-attack registry (privaudit.eval.membership_attacks)
    "plugins": {"core", "scenario", "attacks", "defenses", "eval", "plugins"},
    "sim": {"core", "scenario", "grads", "defenses", "plugins", "sim"},
    "eval": {"core", "eval"},  # pure scoring: metrics, bounds, figures, membership scores
    "experiments": {"core", "scenario", "grads", "defenses", "sim", "eval", "experiments"},
    "api": {
        "core",
        "scenario",
        "grads",
        "attacks",
        "defenses",
        "sim",
        "eval",
        "experiments",
        "api",
    },
    "cli": {
        "core",
        "scenario",
        "attacks",
        "defenses",
        "plugins",
        "sim",
        "eval",
        "experiments",
        "api",
        "cli",
    },
}

# third-party modules a function may import late, and why: each is heavy to import (or
# loads weights, or starts a launcher) and only some commands need it
DEFERRED = {
    "lpips": "the LPIPS metric builds AlexNet from its weights",
    "opacus": "centralised DP-SGD reference and the PRV accountant",
    "matplotlib": "figures only",
    "torchvision": "dataset loaders, only for datasets other than the photos",
    "skimage.data": "the photos dataset",
    "skimage.io": "the photos dataset",
    "skimage.color": "the photos dataset",
    "skimage.util": "the photos dataset",
    "skimage.transform": "the photos dataset",
    "torch.distributed.elastic": "the torch.distributed launcher, only for --backend",
    "torch.distributed.launcher": "the torch.distributed launcher, only for --backend",
    "torch": "argument checks (core.limits) run before torch is loaded; only a CUDA device "
    "needs it",
    "nbformat": "notebooks",
    "nbclient": "notebooks",
    "ray": "optional executor for multi-cell studies",
}
# the CLI loads a command's machinery (torch, the engine) only when that command runs, so
# --help and a bad argument answer at once: its function-level imports of project modules
# are deferrals too, never a way around a cycle (the cycle check sees them)
LAZY_LAYERS = {"cli"}


def deferred(module: str) -> bool:
    return any(module == d or module.startswith(d + ".") for d in DEFERRED)


def package_dirs() -> dict[str, Path]:
    """pyproject.toml's ``[tool.setuptools] package-dir``: package → folder."""
    text = (ROOT / "pyproject.toml").read_text()
    line = re.search(r"^package-dir\s*=\s*\{(.*)\}", text, re.M)
    assert line, "pyproject.toml has no package-dir mapping"
    pairs = re.findall(r'"([\w.]+)"\s*=\s*"([\w./]+)"', line.group(1))
    return {pkg: ROOT / folder for pkg, folder in pairs}


@functools.cache
def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the project: dotted name → (file, is a package's __init__)."""
    dirs = package_dirs()
    out: dict[str, tuple[Path, bool]] = {}
    for pkg, folder in dirs.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            is_pkg = rel[-1] == "__init__"
            parts = rel[:-1] if is_pkg else rel
            name = ".".join([pkg, *parts])
            # a folder mapped to a package of its own belongs to that package, not this one
            owner = max((p for p in dirs if name == p or name.startswith(p + ".")), key=len)
            if owner == pkg:
                out[name] = (path, is_pkg)
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    return parts[1] if parts[1] in MAY_IMPORT else "root"


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports(path: Path, name: str, is_pkg: bool) -> list[tuple[str, list[str], bool, int]]:
    """(module imported, names taken from it, inside a function, line) for each import."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[str, list[str], bool, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            if isinstance(child, ast.Import):
                for a in child.names:
                    out.append((a.name, [], in_function, child.lineno))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - (child.level - 1)] if child.level > 1 else base
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                out.append((mod, [a.name for a in child.names], in_function, child.lineno))
            visit(child, nested)

    visit(tree, False)
    return out


@functools.cache
def graph() -> tuple[dict[str, set[str]], list[str], list[str]]:
    """Module → project modules it imports; function-level imports of other things; the
    underscore names taken from another module."""
    mods = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    late: list[str] = []
    private: list[str] = []
    for name, (path, is_pkg) in mods.items():
        edges[name]
        for mod, names, in_function, line in imports(path, name, is_pkg):
            where = f"{path.relative_to(ROOT)}:{line}"
            if not mod.startswith("privaudit"):
                if in_function and not deferred(mod):
                    late.append(f"{where} imports {mod} inside a function")
                continue
            if in_function and layer(name) not in LAZY_LAYERS:
                late.append(f"{where} imports {mod} inside a function")
            targets = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in mods]
            if len(targets) < len(names) or not names:
                targets.append(mod)
            for n in names:
                if n.startswith("_") and not n.startswith("__") and mod != name:
                    private.append(f"{where} takes {mod}.{n}")
            edges[name].update(t for t in targets if t in mods and t != name)
    return edges, late, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def test_every_module_is_in_a_layer():
    stray = [m for m in modules() if m != "privaudit" and layer(m) == "root"]
    assert not stray, f"modules outside every layer: {stray}"


def test_no_import_cycle_between_modules():
    assert cycles(graph()[0]) == []


def test_imports_run_one_way_between_layers():
    edges = graph()[0]
    upward = [
        f"{m} ({layer(m)}) imports {t} ({layer(t)})"
        for m, ts in sorted(edges.items())
        for t in sorted(ts)
        if m != "privaudit" and layer(t) not in MAY_IMPORT[layer(m)]
    ]
    assert upward == []


def test_the_root_package_imports_nothing():
    assert graph()[0]["privaudit"] == set()


def test_function_level_imports_only_defer_heavy_dependencies():
    assert graph()[1] == []


def test_no_module_takes_another_modules_underscore_members():
    assert graph()[2] == []


def test_the_checks_catch_what_they_look_for(tmp_path):
    """The walk itself: a cycle, a function-level import and an upward edge are found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n    from privaudit.sim.run import Run\n"
        "def f():\n    from privaudit.api import pipeline\n"
    )
    found = imports(src, "privaudit.core.m", False)
    assert ("privaudit.core", ["sibling"], False, 2) in found
    assert ("privaudit.api", ["pipeline"], True, 6) in found
    assert ("privaudit.sim.run", ["Run"], False, 4) in found  # annotation-only: counted
    assert "sim" not in MAY_IMPORT["core"] and "defenses" not in MAY_IMPORT["attacks"]


def test_layers_depend_one_way():
    """No two layers may import each other, directly or through others: the allowances,
    self-imports aside, form no cycle."""
    allowed = {a: {b for b in bs if b != a} for a, bs in MAY_IMPORT.items()}
    assert cycles(allowed) == []


def _defined(tree: ast.AST) -> set[str]:
    """The names a module defines or assigns: functions, classes, variables, attributes."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
    return own


def underscore_reaches() -> list[str]:
    """``x._name`` in one module where ``_name`` is a private member another project module
    defines (and this one does not): a reach into that module's internals."""
    mods = modules()
    trees = {name: ast.parse(path.read_text()) for name, (path, _) in mods.items()}
    own = {name: _defined(tree) for name, tree in trees.items()}
    private = defaultdict(set)
    for name, names in own.items():
        for n in names:
            if n.startswith("_") and not n.startswith("__"):
                private[n].add(name)
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and node.attr not in own[name]
            ):
                where = f"{mods[name][0].relative_to(ROOT)}:{node.lineno}"
                found.append(f"{where} reaches .{node.attr} of {sorted(private[node.attr])}")
    return found


def test_no_module_reaches_into_private_attributes():
    assert underscore_reaches() == []


def test_tests_benchmarks_and_examples_use_public_names_only():
    """Outside the packages too: nothing imports a private name from privaudit."""
    found = []
    for folder in ("tests", "benchmarks", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("privaudit"):
                    found += [
                        f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name}"
                        for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")
                    ]
    assert found == []


def test_no_function_in_the_package_is_over_100_lines():
    """Every function and method of the packages (benchmarks and tests aside) fits in 100
    lines, ``def`` to the end of its body, decorators excluded: a longer one does several
    jobs, to be split into helpers that each have a name."""
    long = []
    for path, _ in modules().values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > 100:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "functions over 100 lines:\n" + "\n".join(sorted(long))
