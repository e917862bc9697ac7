"""No import cycles among pflbench's own modules: every import counts, those inside functions and those
for type checking only included, so the package reads bottom-up (a module never needs one that needs it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pflbench"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path], types: bool = True) -> set[str]:
    """The own modules `name` imports anywhere in its source (a package's import of its own submodules
    counts as an edge too); without `types`, not those under `if TYPE_CHECKING:`."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    if not types:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []

    def add(target: str) -> None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                full = f"{prefix}.{alias.name}"
                add(full if full in modules else prefix)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_pflbench_imports_no_module_that_imports_it_back():
    modules = _modules()
    assert {
        "pflbench.algorithm",
        "pflbench.loader.retired",
        "pflbench.simulator.groups",
        "pflbench.simulator.rendezvous",
    } <= set(modules)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "pflbench.algorithm" in graph["pflbench.fedavg"]  # imports are found, lazy ones included
    assert "pflbench.algorithm" in graph["pflbench.loader.plugins"]
    assert _cycles(graph) == []


# The method API (GUIDE, "Contracts"): what a plugin subclasses, the engine interface it calls, and the types
# it names (the cell's configuration, the registry, the checkpoint's capture, pflbench.api_types). Its
# modules import only each other. The custom-step kit (pflbench.kit.steps, pflbench.kit.representation,
# pflbench.kit.feature_training) is the documented second layer: it builds on the API and the engine, and the
# API never imports it.
METHOD_API = {
    "pflbench.algorithm",
    "pflbench.algorithm_state",
    "pflbench.api_types",
    "pflbench.capabilities",
    "pflbench.card",
    "pflbench.config",
    "pflbench.engine",
    "pflbench.fedavg",
    "pflbench.payload",
    "pflbench.registry",
    "pflbench.round_context",
    "pflbench.serving",
    "pflbench.streams",
}
# The one name it takes from outside, in annotations only: the engine's model layout (`Engine.model`).
TYPE_ONLY = [("pflbench.engine", "pflbench.simulator.client_model")]


def _outside(modules: dict[str, Path], api: set[str], types: bool) -> list[tuple[str, str]]:
    return sorted(
        (name, target) for name in api for target in _imports(name, modules[name], modules, types) if target not in api
    )


def test_the_method_api_imports_only_itself():
    modules = _modules()
    assert set(modules) >= METHOD_API
    assert _outside(modules, METHOD_API, types=False) == []  # at run time: nothing outside the API
    assert _outside(modules, METHOD_API, types=True) == TYPE_ONLY
    # the check sees a crossing: without api_types, fedavg's State and weighted_mean come from outside
    assert ("pflbench.fedavg", "pflbench.api_types") in _outside(modules, METHOD_API - {"pflbench.api_types"}, False)


def test_the_method_apis_types_are_importable_from_where_they_were():
    from pflbench import api_types
    from pflbench.simulator import rounds
    from pflbench.simulator import training

    for name in ("State", "SGD", "Objective", "Diverged", "cross_entropy", "weighted_mean"):
        assert getattr(training, name) is getattr(api_types, name)
    assert rounds.CellResult is api_types.CellResult


def _levels(graph: dict[str, set[str]]) -> list[str]:
    """The longest import chain (every import counts, those for type checking included), its first module first."""
    memo: dict[str, list[str]] = {}

    def chain(name: str) -> list[str]:
        if name not in memo:
            below = [chain(target) for target in sorted(graph[name])]
            memo[name] = [name, *max(below, key=len, default=[])]
        return memo[name]

    return max((chain(name) for name in sorted(graph)), key=len)


def test_the_package_reads_in_at_most_16_import_levels():
    """docs/explanation/house.md: a module reached from the command line through at most 16 levels of imports."""
    assert _levels({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}) == ["a", "b", "c"]
    modules = _modules()
    longest = _levels({name: _imports(name, path, modules) for name, path in modules.items()})
    assert len(longest) <= 16, " -> ".join(longest)


def test_no_module_imports_a_private_name_from_another():
    """A name with a leading underscore stays in its module: what a second module needs is public
    (the split of the runner and of the spec into folders had left 14 such crossings)."""
    modules = _modules()
    crossings = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pflbench"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        crossings.append(f"{name}: from {node.module} import {alias.name}")
    assert crossings == []
