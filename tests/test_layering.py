"""The packages' import layering, read from the source with ``ast`` (docs/architecture.md,
Layout).

From the bottom: ``core`` (errors, compatibility warnings) imports no other package; ``ps`` and
``cache`` (storage and the embedding cache) import neither the server nor the trainer;
``model`` (a trained model's files and forward pass) sits below both the server and the
trainer, which share it; the trainer reaches the server only through its HugeCTR facade
(``trainer/hugectr``); ``clients`` may import anything; ``bench`` is imported by nobody and is otherwise left to
itself. No import cycle between packages, between the sub-packages of a package or between
the files of a package. Every import counts, also one inside a function: an import deferred to dodge a cycle
is still a cycle.  Only imports under ``if TYPE_CHECKING:`` (annotations; they never run) are
left out.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
from import_graph import cycles

ROOT = Path(__file__).resolve().parents[1]
#: package -> folder, as pyproject's package-dir maps them (cache.cuda holds no Python)
FOLDERS = {
    "core": "core",
    "ps": "ps",
    "cache": "cache",
    "model": "model",
    "server": "server",
    "trainer": "trainer",
    "clients": "clients",
}
BENCH = "bench"
#: what each package must not import (besides bench, which nothing imports)
FORBIDDEN = {
    "core": {"ps", "cache", "model", "server", "trainer", "clients"},
    "ps": {"server", "trainer", "clients", "model"},
    "cache": {"server", "trainer", "clients", "model"},
    "model": {"server", "trainer", "clients"},
    "server": {"trainer", "clients"},
    "trainer": {"clients"},
}
#: the only trainer sub-package that may import the server
TRAINER_FACADE = "tierserve.trainer.hugectr"


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(["tierserve", package, *parts])] = path
    for path in (ROOT / BENCH).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path) -> set[tuple[str, int]]:
    """(module imported, line) for every import in the file, resolved to a module of the
    repository (``from pkg import sub`` is ``pkg.sub`` when that is a module)."""
    is_package = path.name == "__init__.py"
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _is_type_checking(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add((target, node.lineno))
    return found


EDGES = {name: _imports(name, path) for name, path in MODULES.items()}


def package_of(module: str) -> str:
    parts = module.split(".")
    return BENCH if parts[0] == BENCH else parts[1]


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def _cycles(nodes: set[str], successors: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node, over ``nodes`` only."""
    return cycles({n: set(successors.get(n, ())) & nodes for n in nodes})


def _explain(component: list[str], grouping) -> list[str]:
    """The imports that make up a cycle among groups, for the failure message."""
    members = set(component)
    return [
        f"{_where(a, line)} imports {b}"
        for a in sorted(EDGES)
        for b, line in sorted(EDGES[a])
        if grouping(a) in members and grouping(b) in members and grouping(a) != grouping(b)
    ]


def test_the_walk_finds_every_package():
    assert {package_of(m) for m in MODULES} == set(FOLDERS) | {BENCH}
    assert len(MODULES) > 200


def test_forbidden_imports():
    offenders = [
        f"{_where(a, line)} imports {b}"
        for a in sorted(EDGES)
        for b, line in sorted(EDGES[a])
        if package_of(b) in FORBIDDEN.get(package_of(a), set())
        or (package_of(b) == BENCH and package_of(a) != BENCH)
    ]
    assert offenders == []


def test_the_trainer_reaches_the_server_only_through_its_hugectr_facade():
    offenders = [
        f"{_where(a, line)} imports {b}"
        for a in sorted(EDGES)
        for b, line in sorted(EDGES[a])
        if package_of(a) == "trainer" and package_of(b) == "server"
        and not (a == TRAINER_FACADE or a.startswith(TRAINER_FACADE + "."))
    ]
    assert offenders == []


def test_no_cycle_between_packages():
    successors = defaultdict(set)
    for a, imported in EDGES.items():
        successors[package_of(a)] |= {package_of(b) for b, _ in imported} - {package_of(a)}
    cycles = _cycles(set(FOLDERS) | {BENCH}, successors)
    assert cycles == [], [_explain(c, package_of) for c in cycles]


def _sub_package(module: str) -> str:
    """``tierserve.trainer.graph.tensors`` -> ``tierserve.trainer.estimator``; a module at
    a package's root is its own group."""
    parts = module.split(".")
    depth = 2 if parts[0] == BENCH else 3
    return ".".join(parts[:depth])


@pytest.mark.parametrize("package", list(FOLDERS))
def test_no_cycle_between_the_files_of_a_package(package):
    nodes = {m for m in MODULES if package_of(m) == package}
    successors = {m: {b for b, _ in EDGES[m]} for m in nodes}
    cycles = _cycles(nodes, successors)
    assert cycles == [], [_explain(c, lambda m: m) for c in cycles]


@pytest.mark.parametrize("package", list(FOLDERS))
def test_no_cycle_between_the_sub_packages_of_a_package(package):
    nodes = {_sub_package(m) for m in MODULES if package_of(m) == package}
    successors = defaultdict(set)
    for a in MODULES:
        if package_of(a) == package:
            successors[_sub_package(a)] |= {_sub_package(b) for b, _ in EDGES[a]}
    cycles = _cycles(nodes, successors)
    assert cycles == [], [_explain(c, _sub_package) for c in cycles]
