"""A checkpoint's code version: the digest of the source a cell's computation uses (its algorithm, the engine it imports), so that a checkpoint resumes after an unrelated change and is refused after a related one; and the execution path (device, batched or looped) it was written on."""

from __future__ import annotations

import functools
import hashlib
import inspect
import platform
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pflbench.simulator.federation import Federation


@functools.cache
def _source_digest(files: tuple[tuple[str, str], ...]) -> str:
    digest = hashlib.sha256()
    for name, path in files:
        digest.update(name.encode() + b"\0" + Path(path).read_bytes() + b"\0")
    return digest.hexdigest()


# Folders of pflbench/ whose files are not part of the code version unless the algorithm's classes live there.
UNVERSIONED = ("reports", "partitions")


# Where a cell's computation starts: the round loop and the cell groups' runner (with the algorithm's own
# classes); the code version follows their imports (`source_files`).
ENTRY_MODULES = ("pflbench.simulator.rounds", "pflbench.simulator.groups")


# Part of the version though no entry module imports it (their own imports not followed): this module, whose
# resume restores the state a resumed cell computes from.
ALWAYS_VERSIONED = ("pflbench.storage.checkpoint",)


# Left out though imported: how a cell runs, never what it computes. What execution.py decides that changes a
# run's float rounding is in the checkpoint's header (`execution_path`), and compared on resume.
NOT_VERSIONED = ("pflbench.simulator.execution",)


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _modules(package: str) -> dict[str, Path]:
    """pflbench's modules by name (the UNVERSIONED folders left out)."""
    folder = Path(package)
    return {
        _module_name(p, folder): p.resolve()
        for p in folder.rglob("*.py")
        if p.relative_to(folder).parts[0] not in UNVERSIONED
    }


# ast.parse under one lock: the cells of a group run in threads (pflbench.simulator.groups), each reading its
# code version, and CPython 3.11's AST constructor counts its recursion depth in interpreter-wide state: two
# parses at once failed a group's cell with "SystemError: AST constructor recursion depth mismatch" (Python
# 3.11.7; CPython gh-106905).
PARSE_LOCK = threading.Lock()


@functools.cache
def _imported(path: Path, package: str) -> frozenset[str]:
    """The pflbench modules that the file at `path` imports anywhere in it (at the top, inside functions,
    under TYPE_CHECKING), each with its parent packages (their __init__ runs first). `package`: the
    package relative imports start from ("" outside pflbench)."""
    import ast

    source = path.read_bytes()
    with PARSE_LOCK:
        tree = ast.parse(source, str(path))
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            named.add(module)
            named.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    found: set[str] = set()
    for module in named:
        parts = module.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(found)


def _closure(package: Path, roots: list[str], outside: list[Path]) -> set[str]:
    """The pflbench modules reachable by imports from `roots` (module names) and from the files `outside`
    the package (plugins); NOT_VERSIONED not followed."""
    modules = _modules(str(package))

    def follow(path: Path, name: str) -> set[str]:
        base = name if path.name == "__init__.py" else name.rpartition(".")[0]
        return {m for m in _imported(path, base) if m in modules and m not in NOT_VERSIONED}

    todo = [r for r in roots if r in modules and r not in NOT_VERSIONED]
    for path in outside:
        todo += follow(path, "")
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += follow(modules[module], module) - seen
    return seen


def source_files(algorithm_cls: type) -> dict[str, Path]:
    """The source files that compute a cell of `algorithm_cls`, by a name that does not depend on where the
    checkout lives ("pflbench/simulator/rounds.py", "algorithms/fedavg.py", a plugin's file name): a checkpoint
    written on one node resumes on another whose checkout is elsewhere.

    Which files: the modules the round loop, the cell groups' runner and the algorithm's classes import,
    followed through every import in them (lazy ones too: a static reading of the source, wider than what
    one run imports), plus ALWAYS_VERSIONED, less NOT_VERSIONED and the UNVERSIONED folders; the algorithm's
    classes' own files wherever they live. So a change to the run machinery that never touches a cell's
    numbers (the runner, the store, the CLI, reports, publishing) keeps a checkpoint resumable; a change to
    anything the computation imports retires it. The built-in algorithms (pflbench/algorithms/) are named
    "algorithms/<file>", as when that folder was at the repository's top level."""

    package = Path(__file__).resolve().parents[1]
    own = set()
    for cls in inspect.getmro(algorithm_cls):
        try:
            own.add(Path(inspect.getfile(cls)).resolve())
        except TypeError:  # builtins
            pass
    own = {p for p in own if p.suffix == ".py"}
    roots = [*ENTRY_MODULES, *(_module_name(p, package) for p in own if p.is_relative_to(package))]
    modules = _closure(package, roots, [p for p in own if not p.is_relative_to(package)]) | set(ALWAYS_VERSIONED)
    paths = {path for name, path in _modules(str(package)).items() if name in modules} | own
    roots_by_name = {"algorithms": package / "algorithms", "pflbench": package}  # the first that holds a file names it
    named = {}
    for path in paths:
        root = next(
            (
                f"{name}/{path.relative_to(folder).as_posix()}"
                for name, folder in roots_by_name.items()
                if path.is_relative_to(folder)
            ),
            None,
        )
        named[root or path.name] = path
    return named


def code_version(algorithm_cls: type) -> str:
    """A hash of the source that computes a cell (`source_files`: what the round loop, the cell groups'
    runner and the algorithm's classes import; names and contents, not where the checkout is) and of the
    torch / numpy / Python versions."""
    import numpy as np
    import torch

    digest = _source_digest(tuple(sorted((name, str(path)) for name, path in source_files(algorithm_cls).items())))
    return f"{digest[:16]}-torch{torch.__version__}-numpy{np.__version__}-py{platform.python_version()}"


def execution_path(fed: Federation) -> dict[str, Any]:
    """The execution settings that change a run's float rounding (not part of the cell's hash). The static
    (captured) step is named on CUDA only: on a CPU it is the eager step bit for bit (tests/test_static_step.py);
    on CUDA the resume ignores it once the GPU check's `graphs` verdict has found it bit-identical to the eager
    step (`same_path`), so setting that verdict keeps carried checkpoints resumable, either way."""
    path = {
        "device": fed.device.type,
        "batched": bool(fed.batched),
        "compiled": bool(fed.compiled),
        "channels_last": bool(fed.channels_last),
        "client_threads": int(fed.client_threads),
    }
    if getattr(fed, "static_step", False) and fed.device.type == "cuda":
        path["static_step"] = True
    return path


def same_path(written: Any, running: dict[str, Any]) -> bool:
    """Whether a checkpoint written on execution path `written` resumes on `running` bit for bit: equal, the
    static step aside where `pflbench.simulator.execution.CUDA_GRAPHS_VERIFIED` says it computes what the eager one does."""
    from pflbench.simulator import execution

    if not isinstance(written, dict):
        return False
    if execution.CUDA_GRAPHS_VERIFIED:
        written, running = ({k: v for k, v in p.items() if k != "static_step"} for p in (written, running))
    return written == running
