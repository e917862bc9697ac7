"""Plugins: a user's own algorithms, models, datasets and partition schemes, from their own code.

A plugin is Python code that registers entries with the same decorators as the built-ins
(`@ALGORITHMS.register("mine")`, `@PARTITIONS.register(...)`, `@DATASETS.register(...)`,
`@MODELS.register(...)`). Three ways to name one, all loading into the same registries before a spec
is validated:

- a spec's `plugins:` list: `.py` paths (relative to the spec file) or module names;
- `--plugin FILE_OR_MODULE` (repeatable) on `pflbench run | sweep | report | list`;
- the entry-point group `pflbench.loader.plugins` of an installed package (loaded in every process that loads
  the built-ins): `[project.entry-points."pflbench.loader.plugins"] mine = "mypkg.methods"` (a module,
  registering on import) or `"mypkg.methods:register"` (a function, called once).

A `.py` path is one self-contained file (it may import installed packages), imported as the module
`pflbench_plugin_<stem>`; a module name is imported as Python would (installed, or on PYTHONPATH).

Identity (no stale results): a plugin's id is its file name (`my_method.py`) or its module name, and its
source hash is the sha256 of the file, or of every `.py` file of the top-level package a module or entry
point belongs to (so a change anywhere in that package counts). A cell whose algorithm, dataset,
partition scheme or model comes from a plugin records `plugin_hashes: {id: hash}` in its configuration,
and the cell id is the hash of that configuration: editing the plugin gives its cells new ids, so they
run again and never reuse the old code's results. Cells of built-ins record nothing (their ids are
unchanged).

Ray workers: the driver ships each used plugin's source (`PluginSource`, files included) with the cell;
a worker (`activate`) imports an installed module when its hash is the driver's, else loads the
shipped files, so a cluster node needs no copy of the user's file.

Errors, each one message naming what was wrong, before any work: a path that does not exist or is not a
`.py` file, a module that cannot be found, a plugin that raises while importing (its exception and line),
a name that a built-in or another plugin already registered, two different files with the same name.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import sys
import tempfile
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Iterable

from pflbench.registry import NameClashError, adapt_with, fill_with, loading

if TYPE_CHECKING:
    from pflbench.config import CellConfig

ENTRY_POINT_GROUP = "pflbench.loader.plugins"
# The built-ins: importing each registers its algorithms, datasets, models or partition schemes.
BUILTIN_PACKAGES = ("pflbench.algorithms", "pflbench.data", "pflbench.simulator.models", "pflbench.partitions")
FILE_MODULE_PREFIX = "pflbench_plugin_"


class PluginError(ValueError):
    """A plugin that cannot be loaded: missing, not importable, failing, or clashing."""


@dataclass(frozen=True)
class PluginSource:
    """What identifies a plugin and lets another process load exactly the same code."""

    id: str  # how cells name it: "my_method.py" (a file) or "mypkg.methods" (a module)
    kind: str  # "file" | "module" | "entry point"
    module: str  # the module it is imported as
    sha256: str  # of its source (see the module docstring)
    location: str  # the file, or the top-level package's folder, it was read from
    files: tuple[tuple[str, bytes], ...] = ()  # (path relative to the import root, content), for workers
    call: str = ""  # entry points "module:function": the function to call after importing


@dataclass
class Loaded:
    source: PluginSource
    entries: list[tuple[str, str]] = field(default_factory=list)  # (registry kind, name) it registered


_LOADED: dict[str, Loaded] = {}  # plugin id -> what is loaded in this process
_BUILTINS_LOADED = False
_BUILTINS_LOADING = False


# ---- the registries ----------------------------------------------------------------------------


def registries() -> dict[str, Any]:
    """Every registry a plugin may add to, by the cell field that names its entries."""
    from pflbench.algorithm import ALGORITHMS
    from pflbench.data.sources import DATASETS
    from pflbench.simulator.models import MODELS
    from pflbench.data.partitioning import PARTITIONS

    return {"algorithm": ALGORITHMS, "dataset": DATASETS, "partition": PARTITIONS, "model": MODELS}


def load_builtins() -> None:
    """Register the built-in algorithms, partition schemes, datasets and models, then the installed
    packages' plugins (entry points). Idempotent, and run by every registry before it is read
    (`registry.fill_with`), so that a plugin's name is always checked against every built-in."""
    global _BUILTINS_LOADED, _BUILTINS_LOADING
    if _BUILTINS_LOADED or _BUILTINS_LOADING:  # done, or under way (a built-in reading a registry)
        return
    _BUILTINS_LOADING = True
    try:
        for package in BUILTIN_PACKAGES:  # loaded by name, as a plugin is: importing registers
            importlib.import_module(package)
        _BUILTINS_LOADED = True
    finally:
        _BUILTINS_LOADING = False
    load_entry_points()


fill_with(load_builtins)


def _refuse_old_forms(cls: Any, card: Any, capabilities: Any) -> Any:
    """An algorithm's class as it registers: itself, or OldFormError where it uses a retired form of the
    method API (`pflbench.loader.retired.check`). Imported when the first algorithm registers: the check builds
    on the algorithms' module, which must not import it."""
    from pflbench.loader import retired

    return retired.check(cls, card, capabilities)


adapt_with("algorithm", _refuse_old_forms)


def _snapshot() -> dict[str, set[str]]:
    return {kind: set(registry.names()) for kind, registry in registries().items()}


def _forget(plugin_id: str) -> None:
    for registry in registries().values():
        registry.forget(plugin_id)
    _LOADED.pop(plugin_id, None)


def _registered(plugin_id: str, source: PluginSource, before: dict[str, set[str]]) -> Loaded:
    after = _snapshot()
    entries = [(kind, name) for kind in after for name in sorted(after[kind] - before[kind])]
    loaded = Loaded(source, entries)
    _LOADED[plugin_id] = loaded
    return loaded


def _failure(what: str, error: BaseException, origin: str | None = None) -> PluginError:
    """`plugin X failed to import: NameError: name 'y' is not defined (my_method.py, line 12)`."""
    if isinstance(error, (NameClashError, PluginError)):
        return PluginError(f"{what}: {error}")
    if isinstance(error, SyntaxError) and error.filename:  # where the parser stopped, in the user's file,
        # not the frame that compiled it (pflbench's loader)
        code = f": {error.text.strip()[:200]}" if error.text and error.text.strip() else ""
        return PluginError(
            f"{what} failed to import: {type(error).__name__}: {error.msg} "
            f"({Path(error.filename).name}, line {error.lineno}{code})"
        )
    frames = traceback.extract_tb(error.__traceback__)
    mine = [f for f in frames if origin and f.filename == origin] or frames[-1:]
    where = f" ({Path(mine[-1].filename).name}, line {mine[-1].lineno})" if mine else ""
    detail = str(error).strip().splitlines()[0][:500] if str(error).strip() else ""
    return PluginError(f"{what} failed to import: {type(error).__name__}{': ' + detail if detail else ''}{where}")


# ---- hashing -------------------------------------------------------------------------------------


def digest(files: Iterable[tuple[str, bytes]]) -> str:
    """sha256 over (relative path, content) pairs in path order."""
    h = hashlib.sha256()
    for rel, content in sorted(files):
        h.update(rel.encode() + b"\0" + hashlib.sha256(content).digest())
    return h.hexdigest()


def file_digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def _package_files(module_name: str) -> tuple[str, tuple[tuple[str, bytes], ...]]:
    """The folder (or file) of `module_name`'s top-level package and its `.py` files, relative to the
    folder they are imported from."""
    top = module_name.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        if spec is not None and spec.submodule_search_locations:  # a namespace package: its folders
            roots = [Path(p) for p in spec.submodule_search_locations]
        else:
            raise PluginError(f"plugin module {module_name!r}: no source file found for {top!r}")
    elif spec.submodule_search_locations:
        roots = [Path(spec.origin).parent]
    else:
        origin = Path(spec.origin)
        return str(origin), ((origin.name, origin.read_bytes()),)
    files = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" not in path.parts:
                files.append((str(path.relative_to(root.parent)), path.read_bytes()))
    return str(roots[0]), tuple(files)


# ---- loading ------------------------------------------------------------------------------------


def load(entries: Iterable[str], base_dir: str | Path | None = None) -> list[PluginSource]:
    """Load plugins named by paths (`.py`, relative to `base_dir`, default the working directory) or
    module names; those already loaded with the same source are not loaded again. PluginError (one
    message) on the first that cannot be loaded; what it registered before failing is removed."""
    load_builtins()
    return [load_one(entry, base_dir) for entry in entries]


def is_path(entry: str) -> bool:
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def load_one(entry: str, base_dir: str | Path | None = None) -> PluginSource:
    if not isinstance(entry, str) or not entry.strip():
        raise PluginError(f"plugin {entry!r}: expected a .py file's path or a module name")
    entry = entry.strip()
    return _load_file(entry, base_dir) if is_path(entry) else _load_module(entry)


def _load_file(entry: str, base_dir: str | Path | None) -> PluginSource:
    path = Path(entry).expanduser()
    if not path.is_absolute():
        path = Path(base_dir or Path.cwd()) / path
    path = path.resolve()
    if not path.is_file():
        relative = (
            f" (relative to {Path(base_dir or Path.cwd()).resolve()})"
            if not Path(entry).expanduser().is_absolute()
            else ""
        )
        raise PluginError(
            f"plugin {entry!r}: no such file {str(path)!r}{relative}; give the path of a .py file "
            f"(relative to the spec file in a spec's plugins:, to the working directory with --plugin) "
            f"or an importable module name"
        )
    if path.suffix != ".py":
        raise PluginError(f"plugin {entry!r}: {str(path)!r} is not a .py file; give a Python file or a module name")
    content = path.read_bytes()
    source = PluginSource(
        id=path.name,
        kind="file",
        module=FILE_MODULE_PREFIX + _identifier(path.stem),
        sha256=file_digest(content),
        location=str(path),
        files=((path.name, content),),
    )
    return _activate_file(source)


def _identifier(stem: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in stem)


def _activate_file(source: PluginSource) -> PluginSource:
    """Execute a file plugin's shipped content as its module (the driver: the file it just read)."""
    known = _LOADED.get(source.id)
    if known is not None:
        if known.source.sha256 == source.sha256 and known.source.location == source.location:
            return known.source
        if (
            known.source.location != source.location
            and Path(known.source.location).is_file()
            and Path(source.location).is_file()
        ):
            raise PluginError(
                f"two plugin files named {source.id!r}: {known.source.location} and "
                f"{source.location}; cells name a plugin by its file name, so rename one"
            )
        _forget(source.id)  # the same file, changed (or shipped from elsewhere): load the new code
    before = _snapshot()
    module = types.ModuleType(source.module)
    module.__file__ = source.location
    sys.modules[source.module] = module
    try:
        with loading(source.id):
            exec(compile(dict(source.files)[source.id], source.location, "exec"), module.__dict__)  # noqa: S102
    except BaseException as error:  # noqa: BLE001 (a plugin may raise anything, SystemExit included)
        sys.modules.pop(source.module, None)
        _forget(source.id)
        raise _failure(f"plugin {source.location}", error, source.location) from None
    _registered(source.id, source, before)
    return source


def _load_module(name: str, kind: str = "module", call: str = "") -> PluginSource:
    known = _LOADED.get(name)
    if known is not None:
        return known.source
    if importlib.util.find_spec(name.split(".")[0]) is None:
        raise PluginError(
            f"plugin {name!r}: no module named {name.split('.')[0]!r} is installed or on "
            f"PYTHONPATH; give a .py file's path (ending in .py) or an importable module name"
        )
    before = _snapshot()
    try:
        with loading(name):
            module = importlib.import_module(name)
            if call:
                getattr(module, call)()
    except BaseException as error:  # noqa: BLE001
        _forget(name)
        raise _failure(
            f"plugin {name!r}" if kind == "module" else f"plugin {name!r} (entry point of group {ENTRY_POINT_GROUP})",
            error,
            getattr(sys.modules.get(name), "__file__", None),
        ) from None
    location, files = _package_files(name)
    source = PluginSource(
        id=name, kind=kind, module=name, sha256=digest(files), location=location, files=files, call=call
    )
    _registered(name, source, before)
    return source


def load_entry_points() -> list[PluginSource]:
    """The `pflbench.loader.plugins` entry points of installed packages (each loaded once per process)."""
    from importlib.metadata import entry_points

    loaded = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        module, _, call = point.value.partition(":")
        loaded.append(_load_module(module.strip(), kind="entry point", call=call.strip()))
    return loaded


# ---- cells ---------------------------------------------------------------------------------------


def plugin_hashes(cell: CellConfig) -> dict[str, str]:
    """{plugin id: source hash} of the plugins providing the cell's algorithm, dataset, partition
    scheme or models; {} for a cell of built-ins only."""
    from pflbench.simulator.models import group_names

    load_builtins()
    regs = registries()
    used = {
        regs["algorithm"].origin(cell.algorithm),
        regs["dataset"].origin(cell.dataset),
        regs["partition"].origin(cell.partition),
        *(regs["model"].origin(name) for name in group_names(cell.model)),
    }
    return {pid: _LOADED[pid].source.sha256 for pid in sorted(p for p in used if p is not None)}


def sources_for(cells: Iterable[CellConfig]) -> tuple[PluginSource, ...]:
    """The loaded plugins the cells use (what a Ray worker must load to run them)."""
    wanted = {pid for cell in cells for pid in getattr(cell, "plugin_hashes", {})}
    return tuple(_LOADED[pid].source for pid in sorted(wanted) if pid in _LOADED)


def activate(sources: Iterable[PluginSource], cell: CellConfig | None = None) -> None:
    """Make `sources` loaded in this process (a Ray worker, or the driver where they are already),
    then check that `cell`'s plugins are loaded with the hashes it was planned with."""
    load_builtins()
    for source in sources:
        known = _LOADED.get(source.id)
        if known is not None and known.source.sha256 == source.sha256:
            continue
        if source.kind == "file":
            _activate_file(source)
        else:
            _activate_module(source)
    if cell is not None:
        check_cell(cell)


def check_cell(cell: CellConfig) -> None:
    """PluginError unless every plugin the cell was planned with is loaded here with the same hash."""
    for pid, sha in getattr(cell, "plugin_hashes", {}).items():
        known = _LOADED.get(pid)
        if known is None:
            raise PluginError(
                f"the cell uses plugin {pid!r}, which is not loaded in this process; load it with "
                f"--plugin or the spec's plugins:"
            )
        if known.source.sha256 != sha:
            raise PluginError(
                f"plugin {pid!r} changed since the cell was planned (source sha256 {sha[:12]}..., "
                f"now {known.source.sha256[:12]}...); plan the cells again"
            )


def _activate_module(source: PluginSource) -> None:
    """A module plugin in a worker: the installed module if its source is the driver's, else the
    files the driver shipped (written under a temporary folder named by the hash)."""
    if importlib.util.find_spec(source.module.split(".")[0]) is not None:
        try:
            _, files = _package_files(source.module)
        except PluginError:
            files = ()
        if digest(files) == source.sha256:
            _load_module(source.module, source.kind, source.call)
            return
    root = Path(tempfile.gettempdir()) / "pflbench-plugins" / source.sha256[:16]
    for rel, content in source.files:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_file() or target.read_bytes() != content:
            target.write_bytes(content)
    for name in [
        m for m in sys.modules if m == source.module.split(".")[0] or m.startswith(source.module.split(".")[0] + ".")
    ]:
        del sys.modules[name]  # an installed copy with other code: the shipped one replaces it
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    _forget(source.id)
    _load_module(source.module, source.kind, source.call)


def unload(plugin_id: str) -> None:
    """Remove what the plugin registered (its module stays imported); for tests and notebooks."""
    known = _LOADED.get(plugin_id)
    if known is not None and known.source.kind == "file":
        sys.modules.pop(known.source.module, None)
    _forget(plugin_id)


def loaded() -> list[Loaded]:
    """The plugins loaded in this process, in load order."""
    return list(_LOADED.values())


def loaded_versions() -> dict[str, str]:
    """The plugins loaded in this process, id -> the sha256 of its source (what a report shows of a
    plugin whose store holds cells of several versions: `pflbench.reports.cells.load_cells`)."""
    return {p.source.id: p.source.sha256 for p in loaded()}


# ---- the command line ------------------------------------------------------------------------------

PLUGIN_COMMANDS = ("run", "sweep", "report", "list")


def add_plugin_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="load your own algorithms, datasets, partition schemes or models from a .py file or "
        "a module before anything else (repeatable; docs/howto/own-method.md)",
    )


def load_requested(args: argparse.Namespace) -> str | None:
    """Load the command's `--plugin`s (and the installed entry points); the error message, or None."""
    try:
        load(getattr(args, "plugins", None) or [])
    except PluginError as error:
        return str(error)
    return None
