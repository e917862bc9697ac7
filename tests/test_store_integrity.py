"""A damaged store never crashes or lies: every way of damaging one cell's files (truncated, garbled,
deleted, the wrong JSON type), a stray folder and a copied folder are reported by cell and file,
never read as results, and `run` sets the damaged folder aside and runs the cell again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from pflbench.cli import main
from pflbench.config import cell_hash
from pflbench.reports.build import ReportOptions, build_reports
from pflbench.run.options import RunOptions
from pflbench.run.runner import run_plan
from pflbench.run.spec import parse_spec
from pflbench.storage.store import DAMAGED, SET_ASIDE, Store, load_store, scan_store

SPEC = {
    "name": "t",
    "matrix": {"algorithm": ["fedavg", "pfedla"], "dataset": ["synthetic"]},
    "defaults": {
        "clients": 3,
        "rounds": 1,
        "lr": 0.05,
        "dataset_options": {"num_samples": 300},
        "partition_params": {"classes_per_client": 2},
    },
}


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _garble(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated": _truncate,
    "garbled": _garble,
    "deleted": Path.unlink,
    "list": lambda p: p.write_text("[1, 2]"),
    "null": lambda p: p.write_text("null"),
    "binary": lambda p: p.write_bytes(b"\xff\xfe\x00garbage"),
}
# (file, damage): the 18 ways of damaging one cell; with the stray and copied folders below, 20 cases.
CASES = (
    [("summary.json", d) for d in ("truncated", "garbled", "list", "null", "binary")]
    + [("config.json", d) for d in ("truncated", "garbled", "deleted", "list")]
    + [
        (f, d)
        for f in ("metrics.parquet", "rounds.parquet", "artifacts/arrays.npz")
        for d in ("truncated", "garbled", "deleted")
    ]
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A store of two finished cells (pFedLA's has artifacts), run once for every case."""
    root = tmp_path_factory.mktemp("pristine")
    plan = parse_spec(SPEC)
    report = run_plan(
        plan, RunOptions(results=root / "results", data_root=root / "data", use_ray=False), Console(quiet=True)
    )
    assert report.exit_code == 0
    return root, plan


@pytest.fixture
def store_copy(pristine, tmp_path):
    root, plan = pristine
    shutil.copytree(root / "results", tmp_path / "results")
    return tmp_path / "results", root / "data", plan


def _report_ok(results: Path, out: Path) -> None:
    """The report renders the intact cells and names every entry it did not read."""
    report = build_reports(results, out, ReportOptions(figures=False))
    assert (out / "index.html").exists()
    markdown = (out / "report.md").read_text()
    assert "## Store entries not read as results" in markdown
    for problem in scan_store(results)[1]:
        assert str(problem) in markdown and any(str(problem) in note for note in report.notes)


@pytest.mark.parametrize("file,damage", CASES, ids=[f"{f}-{d}" for f, d in CASES])
def test_a_damaged_cell_is_reported_and_run_again(store_copy, tmp_path, capsys, file, damage):
    results, data, plan = store_copy
    store = Store(results)
    pfedla = next(c for c in plan.cells if c.algorithm == "pfedla")
    folder = store.cell_dir(pfedla)
    DAMAGE[damage](folder / file)

    assert store.status(pfedla) == DAMAGED
    intact, problems = scan_store(results)
    assert [p.folder for p in problems] == [cell_hash(pfedla)] and problems[0].file == file
    assert list(load_store(results)["algorithm"]) == ["fedavg"]  # never read as a result
    assert main(["store", "check", "--results", str(results)]) == 1
    assert f"{cell_hash(pfedla)}/{file}" in capsys.readouterr().out
    _report_ok(results, tmp_path / "report")

    report = run_plan(plan, RunOptions(results=results, data_root=data, use_ray=False), Console(quiet=True))
    assert report.exit_code == 0 and report.ran == 1  # only the damaged cell ran again
    kept = list((results / SET_ASIDE).iterdir())
    assert len(kept) == 1 and kept[0].name.startswith(cell_hash(pfedla))  # set aside, not deleted
    assert not (kept[0] / file).exists() if damage == "deleted" else (kept[0] / file).exists()
    assert store.status(pfedla) == "finished"
    assert sorted(load_store(results)["algorithm"]) == ["fedavg", "pfedla"]
    assert main(["store", "check", "--results", str(results)]) == 0


def test_a_deleted_summary_is_no_result_and_runs_again(store_copy):
    results, data, plan = store_copy
    pfedla = next(c for c in plan.cells if c.algorithm == "pfedla")
    (Store(results).cell_dir(pfedla) / "summary.json").unlink()
    assert Store(results).status(pfedla) is None and len(load_store(results)) == 1
    report = run_plan(plan, RunOptions(results=results, data_root=data, use_ray=False), Console(quiet=True))
    assert report.ran == 1 and len(load_store(results)) == 2


def test_stray_and_copied_folders_are_foreign_never_counted(store_copy, tmp_path, capsys):
    results, data, plan = store_copy
    fedavg = next(c for c in plan.cells if c.algorithm == "fedavg")
    shutil.copytree(Store(results).cell_dir(fedavg), results / "0123456789ab")  # a copy under another name
    (results / "stray").mkdir()
    (results / "stray" / "summary.json").write_text("{not json")
    table = load_store(results)
    assert len(table) == 2 and sorted(table["hash"]) == sorted(cell_hash(c) for c in plan.cells)
    problems = {p.folder: p for p in scan_store(results)[1]}
    assert problems["0123456789ab"].kind == "foreign" and problems["stray"].kind == DAMAGED
    assert main(["store", "check", "--results", str(results)]) == 1
    out = capsys.readouterr().out
    assert "foreign: 0123456789ab/config.json" in out and "stray/summary.json" in out
    _report_ok(results, tmp_path / "report")
    report = run_plan(plan, RunOptions(results=results, data_root=data, use_ray=False), Console(quiet=True))
    assert report.ran == 0  # nothing in the plan is damaged; the foreign folders are left alone
    assert (results / "0123456789ab").is_dir() and (results / "stray").is_dir()


def test_the_summary_lists_every_file_with_its_size_and_checksum(store_copy):
    results, _, plan = store_copy
    folder = Store(results).cell_dir(next(c for c in plan.cells if c.algorithm == "pfedla"))
    files = json.loads((folder / "summary.json").read_text())["files"]
    assert set(files) == {"config.json", "metrics.parquet", "rounds.parquet", "artifacts/arrays.npz"}
    assert all(files[name]["bytes"] == (folder / name).stat().st_size for name in files)
