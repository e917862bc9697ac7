"""docs/explanation/house.md's layers are the code's: every module of the package is in exactly one layer,
the method API's layer is the API the import-cycle test closes, and no import points down the table
except the page's known crossings (each of which still exists: a crossing removed leaves the page)."""

from __future__ import annotations

import re
from pathlib import Path

from test_import_cycles import METHOD_API, _imports, _modules

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "explanation" / "house.md"


def _table(heading: str) -> list[list[str]]:
    """The rows of the first table after `heading`, as their cells."""
    text = PAGE.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def _layers() -> list[tuple[str, list[str]]]:
    return [(row[0], re.findall(r"`([\w.]+)`", row[1])) for row in _table("The layers")]


def _top(module: str) -> str:
    """`pflbench.x` for any module of the package under pflbench/x."""
    return ".".join(module.split(".")[:2])


def _crossings(layer_of: dict[str, int]) -> set[tuple[str, str]]:
    modules = _modules()
    found = set()
    for name, path in modules.items():
        if name == "pflbench":
            continue
        for target in _imports(name, path, modules):
            if target != "pflbench" and layer_of[_top(target)] > layer_of[_top(name)]:
                found.add((_top(name).split(".")[1], _top(target).split(".")[1]))
    return found


def test_every_module_is_in_exactly_one_layer_and_the_api_layer_is_the_closed_api():
    layers = _layers()
    assert [name for name, _ in layers][0] == "method API" and len(layers) == 7
    listed = [module for _, modules in layers for module in modules]
    assert len(listed) == len(set(listed)), "a module in two layers"
    package = {_top(name).split(".")[1] for name in _modules() if name != "pflbench"}
    assert set(listed) == package, (sorted(package - set(listed)), sorted(set(listed) - package))
    assert {f"pflbench.{m}" for m in layers[0][1]} == METHOD_API


def test_no_import_points_down_the_table_but_the_known_crossings():
    layer_of = {f"pflbench.{module}": i for i, (_, modules) in enumerate(_layers()) for module in modules}
    known = {(row[0].strip("`"), row[1].strip("`")) for row in _table("Known crossings")}
    assert _crossings(layer_of) == known


def test_the_check_sees_a_crossing():
    layer_of = {f"pflbench.{module}": i for i, (_, modules) in enumerate(_layers()) for module in modules}
    layer_of["pflbench.storage"] = len(_layers())  # the results store below the command line
    assert ("run", "storage") in _crossings(layer_of)
