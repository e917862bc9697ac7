"""CI's watch over every published cell (pflbench/studies/watch.py, `pflbench watch`): the slices cover every cell once
in N commits; the representatives are the cheapest cell of each algorithm, model and client path; and a one-ulp
change planted in a model's forward is caught by the fingerprint filed for this kind of machine, with the cell,
study and commit named, although it stays within `verify`'s tolerance against a cell that ran elsewhere."""

import json
from pathlib import Path

import pytest
from rich.console import Console

from pflbench.simulator import models
from pflbench.cli import main
from pflbench.cli.publish import WATCH_BUDGET
from pflbench.studies.publish import publish
from pflbench.run.options import RunOptions
from pflbench.run.runner import run_plan
from pflbench.storage.store import SUMMARY, file_record, read_json_dict, write_json
from pflbench.studies.watch import (
    BUDGET,
    FINGERPRINTS,
    FingerprintBook,
    PublishedCell,
    cost_slices,
    machine_key,
    published_cells,
    representatives,
    slice_cost,
    slice_of,
)

ROOT = Path(__file__).resolve().parents[1]

SPEC = """
name: tiny
matrix:
  algorithm: [fedavg]
  dataset:
    - {name: synthetic, options: {num_samples: 600}}
  partition:
    - {scheme: pathological, params: {classes_per_client: 3}}
  clients: [4]
  seed: [0]
defaults: {rounds: 4, eval_every: 2, batch_size: 16, lr: 0.05}
resources: {cpus: 1, gpus: 0}
"""


def test_n_consecutive_slices_cover_every_cell_once():
    names = [f"study{s}/{i:012x}" for s in range(5) for i in range(40)]
    slices = [{n for n in names if slice_of(n, 10) == k} for k in range(10)]
    assert sum(len(s) for s in slices) == len(names) and set().union(*slices) == set(names)
    assert all(slices), "every slice holds some of 200 cells"
    assert [slice_of(n, 10) for n in names] == [slice_of(n, 10) for n in names]  # fixed by the name


def test_slices_cut_by_cost_stay_within_the_budget_and_a_cell_over_it_is_a_slice_of_its_own():
    def cell(study, name, seconds, device="cpu"):
        return PublishedCell(study, Path(study) / name, "fedavg", "cnn", "loop", device, "finished", seconds)

    cells = [cell(f"s{i % 3}", f"{i:012x}", seconds) for i, seconds in enumerate([90, 400, 10, 250, 600, 30, 5] * 4)]
    cells += [cell("big", "0000000000ff", 1000.0)]  # over the budget alone
    cells += [cell("gpu", "000000000000", 8.0, device="cuda"), cell("cpu", "000000000000", 500.0)]
    slices, over = cost_slices(cells, 700.0)
    assert [c.name for c in over] == ["big/0000000000ff"] and slices[-1] == over  # over the budget: its own slice
    costs = [sum(slice_cost(c, cells) for c in s) for s in slices[:-1]]
    assert max(costs) <= 700.0, costs
    names = [c.name for s in slices for c in s]
    assert sorted(names) == sorted(c.name for c in cells)  # every cell, each once
    assert slice_cost(cells[-2], cells) == 500.0  # a GPU cell re-run on the CPU costs its CPU twin's time
    assert len(slices) - 1 <= 2 * sum(costs) / 700.0 + 1  # next-fit: no slice beside the next is under half full
    assert cost_slices(cells, 700.0) == (slices, over)  # fixed by the cells, not by the call


def test_ci_watches_a_slice_cut_by_cost_whose_cells_stay_within_the_stated_budget():
    """CI (.ci/run) takes its watch slice by cost (`--turn`), at the budget the docs state; every slice of the
    published store stays within it (slices by count drew 2-32 minutes as stored)."""
    import shlex

    (line,) = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip().startswith(".venv/bin/pflbench watch")
    ]
    words = shlex.split(line)
    assert "--turn" in words and "--slice" not in words, line
    budget = float(words[words.index("--budget") + 1].removeprefix("${WATCH_BUDGET:-").removesuffix("}"))
    assert budget == BUDGET == WATCH_BUDGET  # CI's default, the module's and the command line's
    docs = (ROOT / "docs" / "howto" / "publish.md").read_text()
    assert f"--budget {budget:.0f}" in docs or f"{budget / 60:.0f} minutes of stored" in docs
    cells = published_cells(ROOT / "results" / "published")
    slices, over = cost_slices(cells, budget)
    assert sorted(c.name for s in slices for c in s) == sorted(c.name for c in cells)  # every cell in a slice
    for chosen in slices:
        cost = sum(slice_cost(c, cells) for c in chosen)
        assert cost <= budget or chosen in [[c] for c in over], f"{len(chosen)} cells cost {cost:.0f} s as stored"
    # One cell over the budget is a CI run of its own; past half an hour it would crowd CI's 90-minute window.
    assert all(slice_cost(c, cells) <= 1800 for c in over), [(c.name, slice_cost(c, cells)) for c in over]


def test_two_recording_runs_side_by_side_each_keep_what_the_other_filed(tmp_path):
    path = tmp_path / FINGERPRINTS
    first = FingerprintBook(path)
    first.record("kind A", "s/old", "0" * 64, 1, "c0")
    first.save()
    long_run, new_study = FingerprintBook(path), FingerprintBook(path)  # both read the file before either saves
    new_study.record("kind A", "t/1", "1" * 64, 5, "c1")
    new_study.record("kind B", "t/1", "2" * 64, 5, "c1")
    new_study.save()
    long_run.record("kind A", "s/long", "3" * 64, 10, "c1")
    long_run.save()  # its book was read before the new study's records: they stay in the file
    kinds = json.loads(path.read_text())
    assert sorted(kinds["kind A"]) == ["s/long", "s/old", "t/1"] and sorted(kinds["kind B"]) == ["t/1"]
    assert kinds["kind A"]["t/1"]["fingerprint"] == "1" * 64 and kinds["kind A"]["s/long"]["rounds"] == 10
    assert long_run.get("kind B", "t/1") is not None  # a save also brings the book up to the file


def test_representatives_are_the_cheapest_finished_cpu_cell_of_each_algorithm_model_and_path():
    def cell(study, name, algorithm, seconds, status="finished", device="cpu", model="cnn"):
        return PublishedCell(study, Path(study) / name, algorithm, model, "loop", device, status, seconds)

    cells = [
        cell("a", "1", "fedavg", 9.0),
        cell("b", "2", "fedavg", 3.0),
        cell("c", "3", "fedavg", 1.0, "diverged"),
        cell("d", "4", "fedavg", 0.5, device="cuda"),
        cell("e", "5", "fedavg", 2.0, model="mlp"),
        cell("f", "6", "pfedme", 500.0),
        cell("g", "7", "local", 4.0),
    ]
    chosen = {c.name for c in representatives(cells, max_seconds=120)}
    assert chosen == {"b/2", "e/5", "g/7"}  # pfedme's only cell is over the cap


@pytest.fixture
def published(tmp_path, monkeypatch):
    """A one-cell study published from this machine, its summary then saying it ran on another CPU (as
    most published cells did, for the machine CI runs on)."""
    from pflbench.run.spec import load_spec

    monkeypatch.setenv("PFLBENCH_DATA", str(tmp_path / "data"))
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    options = RunOptions(results=tmp_path / "store", data_root=tmp_path / "data", use_ray=False)
    assert run_plan(load_spec(spec), options, Console(file=open(tmp_path / "log", "w"))).exit_code == 0
    study = publish(str(spec), "tiny", tmp_path / "store", out=tmp_path / "published", allow_dirty=True)
    (cell,) = [p for p in study.iterdir() if (p / SUMMARY).is_file()]
    summary = read_json_dict(cell / SUMMARY)
    write_json(cell / SUMMARY, {**summary, "cpu_model": "Another CPU", "cpu_capability": "AVX2"})
    return tmp_path / "published", cell


def one_ulp_up(monkeypatch):
    """Every output of the MLP's forward scaled by 1 + 2^-23 (one ulp of relative change; gradients follow).
    Not a plain one-ulp shift of the outputs: cross-entropy is shift-invariant, and on some CPUs (AMD EPYC
    family 26) its float32 reduction absorbed such a shift, leaving every metric bit for bit the same."""
    forward = models.MLP.forward

    def planted(self, x):
        return forward(self, x) * (1 + 2.0**-23)

    monkeypatch.setattr(models.MLP, "forward", planted)


def test_a_one_ulp_change_in_a_model_is_caught_by_this_machines_fingerprint(published, monkeypatch, capsys):
    root, cell = published
    watch = ["watch", "--published", str(root), "--cell", f"tiny/{cell.name}", "--commit", "c0ffee"]
    assert main([*watch, "--record"]) == 0
    out = capsys.readouterr().out
    assert "within tolerance" in out and "[fingerprint recorded]" in out
    book = json.loads((root / FINGERPRINTS).read_text())
    ((kind, cells),) = book.items()
    assert kind == machine_key()
    assert cells[f"tiny/{cell.name}"]["commit"] == "c0ffee" and cells[f"tiny/{cell.name}"]["rounds"] == 2

    assert main(watch) == 0  # unchanged code: the same bits
    assert "identical (fingerprint)" in capsys.readouterr().out

    one_ulp_up(monkeypatch)
    assert main(watch) == 1
    err = capsys.readouterr().err
    assert f"MOVED: cell {cell.name} of study tiny at commit c0ffee" in err
    assert "recorded on this kind of machine at commit c0ffee" in err

    (root / FINGERPRINTS).unlink()  # without it, only verify's comparison with a cell run elsewhere is left
    assert main(watch) == 0
    assert "within tolerance" in capsys.readouterr().out


def test_watch_by_turn_reruns_a_cell_over_the_budget_as_a_slice_of_its_own_and_names_it(published, capsys):
    root, cell = published
    assert main(["watch", "--published", str(root), "--turn", "3", "--budget", "0.0001"]) == 0
    out, err = capsys.readouterr()
    assert f"tiny/{cell.name} is a slice of its own" in out and "slice 0 of 1 cut by cost (1 cells" in out
    assert "within tolerance" in out and "1 of 1 cells repeat" in out  # re-run, not skipped
    assert "nothing chosen" not in err
    assert main(["watch", "--published", str(root), "--turn", "0", "--budget", "-5"]) == 2
    assert "expected a turn >= 0 and a budget > 0 seconds" in capsys.readouterr().err


def test_watch_refuses_a_bad_slice_and_an_unknown_cell(published, capsys):
    root, _ = published
    assert main(["watch", "--published", str(root), "--slice", "10/10"]) == 2
    assert "expected K/N with 0 <= K < N" in capsys.readouterr().err
    assert main(["watch", "--published", str(root), "--cell", "tiny/000000000000"]) == 2
    assert "no published cell 'tiny/000000000000'" in capsys.readouterr().err


def test_a_cell_that_differs_across_machines_gets_this_kinds_fingerprint_from_a_rerun_of_its_commit(published, capsys):
    """A stored run from another kind of machine beyond the tolerance (here its accuracies zeroed, as a cell
    that diverged there and not here) is judged against the same cell run here at its published commit
    (`--reference STORE`); only such a reference is taken."""
    import pandas as pd

    root, cell = published
    store = root.parent / "store"
    metrics = pd.read_parquet(cell / "metrics.parquet")
    metrics.assign(accuracy=0.0).to_parquet(cell / "metrics.parquet")
    summary = read_json_dict(cell / SUMMARY)  # its file record as the other machine's store wrote it
    write_json(
        cell / SUMMARY,
        {**summary, "files": {**summary["files"], "metrics.parquet": file_record(cell / "metrics.parquet")}},
    )
    for folder in (cell, store / cell.name):
        write_json(folder / SUMMARY, {**read_json_dict(folder / SUMMARY), "code_commit": "c0ffee", "code_dirty": False})
    watch = ["watch", "--published", str(root), "--cell", f"tiny/{cell.name}", "--record"]
    assert main(watch) == 1
    assert "DIFFERS: cell" in capsys.readouterr().err
    assert not (root / FINGERPRINTS).exists()

    assert main([*watch, "--reference", str(store)]) == 0
    assert "identical to the reference" in capsys.readouterr().out
    assert f"tiny/{cell.name}" in json.loads((root / FINGERPRINTS).read_text())[machine_key()]

    ran = store / cell.name
    write_json(ran / SUMMARY, {**read_json_dict(ran / SUMMARY), "code_commit": "beef"})
    (root / FINGERPRINTS).unlink()
    assert main([*watch, "--reference", str(store)]) == 1
    assert "reference not usable: the reference ran commit beef" in capsys.readouterr().err
