"""Published studies: `publish` (slimmed copy + manifest), `rerun` and `verify` (a stored cell repeats
its metrics; a tampered file or changed code is caught), staleness, the peak memory of a cell, and the
leaderboard of several studies with a stale one marked."""

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from pydantic import create_model
from rich.console import Console

from pflbench.algorithm import get_algorithm
from pflbench.cli import main
from pflbench.studies.publish import MANIFEST, PublishError, publish, read_manifest, study_state
from pflbench.reports.build import ReportOptions
from pflbench.run.options import RunOptions
from pflbench.run.runner import run_plan
from pflbench.storage.store import METRICS, SUMMARY, check_folder, file_record, read_json_dict, write_json
from pflbench.studies.verify import check_cell, compare, rerun, sample_cells

SPEC = """
name: tiny
matrix:
  algorithm: [fedavg, local]
  dataset:
    - {name: synthetic, options: {num_samples: 600}}
  partition:
    - {scheme: pathological, params: {classes_per_client: 3}}
  clients: [4]
  seed: [0]
defaults: {rounds: 2, batch_size: 16, lr: 0.05}
resources: {cpus: 1, gpus: 0}
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A two-cell spec run into a store, published as a study; returns (tmp, spec path, study folder)."""
    from pflbench.run.spec import load_spec

    tmp = tmp_path_factory.mktemp("publish")
    spec = tmp / "tiny.yaml"
    spec.write_text(SPEC)
    options = RunOptions(results=tmp / "store", data_root=tmp / "data", use_ray=False)
    assert run_plan(load_spec(spec), options, Console(file=open(tmp / "log", "w"))).exit_code == 0
    # allow_dirty: the checkout running the tests may have uncommitted changes
    study = publish(str(spec), "tiny", tmp / "store", out=tmp / "published", note="a test study", allow_dirty=True)
    return tmp, spec, study


@pytest.fixture
def study(made, tmp_path, monkeypatch):
    """A fresh copy of the published study (tests may damage it)."""
    tmp, spec, published = made
    monkeypatch.setenv("PFLBENCH_DATA", str(tmp / "data"))
    copy = tmp_path / "published" / "tiny"
    shutil.copytree(published, copy)
    study_state.cache_clear()
    return copy


def cell_folders(study):
    return sorted(p for p in study.iterdir() if (p / SUMMARY).is_file())


def test_publish_writes_a_slim_study_with_its_manifest_and_the_cells_peak_memory(made):
    tmp, spec, study = made
    manifest = read_manifest(study)
    assert manifest["command"] == f"pflbench run {spec}" and manifest["note"] == "a test study"
    assert set(manifest["versions"]) == {"pflbench", "torch", "python"}
    assert manifest["statuses"] == {"finished": 2} and manifest["missing"] == []
    assert manifest["machines"][0]["cells"] == 2 and manifest["machines"][0]["cpu_model"]
    assert manifest["wall_time"]["cell_seconds"] > 0 and manifest["date"]
    for folder in cell_folders(study):
        assert check_folder(folder) == []  # the copy is an intact store
        summary = read_json_dict(folder / SUMMARY)
        # peak memory beside wall time (pflbench/run/cost.py): at least the RSS the cell started from
        assert summary["peak_host_bytes"] >= summary["host_start_bytes"] > 0
        assert summary["peak_host_method"] in ("vmhwm", "sampled", "process")
        assert manifest["commit"] == summary["code_commit"]  # the commit the cell ran with
        # the narrowing `--set`s of each cell were checked at publish time to give exactly that cell
        assert manifest["cells"][folder.name]["sets"] == [
            f"algorithm={json.loads((folder / 'config.json').read_text())['cell']['algorithm']}"
        ]
    assert {p.name for p in study.iterdir()} == {MANIFEST, *manifest["cells"]}


def test_the_slimmed_artifacts_keep_what_reports_and_the_readme_read(tmp_path):
    """pFedLA's alpha and FedFomo's affinity and weights stay (every round); other arrays go."""
    import numpy as np

    from pflbench.studies.publish import _slim_artifacts

    source = tmp_path / "arrays.npz"
    arrays = {
        f"{name}_round{r:05d}": np.full((2, 2), r, dtype=np.float32)
        for name in ("alpha", "affinity", "weights", "embeddings")
        for r in (10, 20)
    }
    np.savez(source, alpha_layers=np.array(["conv1"]), **arrays)
    record = _slim_artifacts(source, tmp_path / "slim" / "arrays.npz")
    with np.load(tmp_path / "slim" / "arrays.npz") as kept:
        assert sorted(kept.files) == sorted(["alpha_layers"] + [n for n in arrays if not n.startswith("embeddings")])
        assert kept["weights_round00020"][0, 0] == 20
    assert record["bytes"] == (tmp_path / "slim" / "arrays.npz").stat().st_size


def test_rerun_of_a_stored_cell_gives_its_stored_metrics(study):
    for folder in cell_folders(study):
        result = rerun(folder)
        stored = pd.read_parquet(folder / METRICS)
        pd.testing.assert_frame_equal(
            stored.drop(columns="wall_time"), result.metrics.drop(columns="wall_time"), check_dtype=False
        )
        assert compare(folder, result, exact=True) == []


def test_the_rerun_command_finds_the_cell_compares_and_writes_it(study, tmp_path, capsys):
    folder = cell_folders(study)[0]
    assert main(["rerun", folder.name, "--results", str(study.parent), "--out", str(tmp_path / "again")]) == 0
    out = capsys.readouterr().out
    assert f"{folder.name} (" in out and ": identical" in out
    assert (tmp_path / "again" / folder.name / SUMMARY).is_file()
    assert main(["rerun", "0123456789ab", "--results", str(study.parent)]) == 2


def tamper(folder, fix_checksum: bool) -> None:
    """Raise one client's stored accuracy (and, if asked, re-record the file's checksum)."""
    metrics = pd.read_parquet(folder / METRICS)
    metrics.loc[metrics.index[-1], "accuracy"] = min(1.0, metrics["accuracy"].iloc[-1] + 0.25)
    metrics.to_parquet(folder / METRICS, index=False)
    if fix_checksum:
        summary = read_json_dict(folder / SUMMARY)
        summary["files"][METRICS] = file_record(folder / METRICS)
        write_json(folder / SUMMARY, summary)


@pytest.mark.parametrize("fix_checksum", [True, False])
def test_verify_detects_a_tampered_metrics_file(study, capsys, fix_checksum):
    target = cell_folders(study)[0]
    tamper(target, fix_checksum)
    check = check_cell(target)
    assert not check.ok and check.verdict == "DIFFERS"
    assert [d.what for d in check.differences] == ["metrics.parquet accuracy"]
    assert "1 of" in check.differences[0].detail
    # an unfixed file fails the store's check (its size or its checksum, whichever differs first)
    assert any(note.startswith("damaged: metrics.parquet") for note in check.notes) == (not fix_checksum)
    # the command: every cell, exit 1, the tampered cell named
    assert main(["verify", str(study), "--sample", "0"]) == 1
    out = capsys.readouterr().out
    assert f"differ or have problems: {target.name}" in out and "differs: metrics.parquet accuracy" in out
    # tolerance mode holds a rerun to each round's mean accuracy within ACCURACY_TOLERANCE: a last round
    # whose mean moved by at least 50 points is caught
    metrics = pd.read_parquet(target / METRICS)
    last = metrics["round"] == metrics["round"].max()
    metrics.loc[last, "accuracy"] = 0.0 if metrics.loc[last, "accuracy"].mean() > 0.5 else 1.0
    metrics.to_parquet(target / METRICS, index=False)
    check = check_cell(target, force_tolerance=True)
    assert check.mode == "tolerance" and [d.what for d in check.differences] == ["metrics.parquet mean accuracy"]


def test_verify_detects_a_cell_whose_code_changed(study, monkeypatch):
    fedavg = get_algorithm("fedavg")
    folder = next(p for p in cell_folders(study) if "fedavg" in (p / "config.json").read_text())
    assert check_cell(folder).ok
    monkeypatch.setattr(fedavg, "aggregate", lambda self, rnd, upload: None)  # the server stops averaging
    check = check_cell(folder)
    assert not check.ok and any(d.what == "metrics.parquet accuracy" for d in check.differences)
    assert check.notes == []  # its id did not change: only the rerun can tell


def add_default(monkeypatch, algorithm: str) -> None:
    """Give `algorithm` a new hyperparameter with a default, as a code change would."""
    cls = get_algorithm(algorithm)
    monkeypatch.setattr(cls, "Hyperparams", create_model("Changed", new_knob=(int, 1), __base__=cls.Hyperparams))


def test_a_study_is_stale_when_the_code_gives_its_cells_other_ids(study, monkeypatch):
    assert study_state(study).label == "current"
    add_default(monkeypatch, "local")
    study_state.cache_clear()
    state = study_state(study)
    assert state.label == "stale"
    assert any("1 of 2 stored configurations resolve to other cell ids" in why for why in state.stale)
    assert any("now plans 1 cells that are not in the study" in why for why in state.stale)
    # verify says so for that cell
    folder = next(p for p in cell_folders(study) if '"local"' in (p / "config.json").read_text())
    assert any(note.startswith("stale: the current code resolves") for note in check_cell(folder).notes)


def test_a_study_with_a_failed_cell_is_failed(study):
    manifest = read_manifest(study)
    gone = cell_folders(study)[0]
    shutil.rmtree(gone)  # as if its run had crashed: planned, no result
    write_json(study / MANIFEST, {**manifest, "statuses": {"finished": 1, "failed": 1}, "missing": [gone.name]})
    study_state.cache_clear()
    state = study_state(study)
    assert state.label == "failed" and state.stale == []
    assert state.failed == ["1 cells failed"]
    assert state.incomplete == ["1 of the 2 cells its command plans are published; 1 still to run"]


def test_a_study_published_before_all_its_cells_ran_is_incomplete(study, tmp_path):
    """A paper-scale study is published cell by cell as they finish: it is shown as incomplete (apart
    from the current ones), not as failed, and says how many cells are still to come."""
    from pflbench.reports.studies import build_leaderboard

    manifest = read_manifest(study)
    gone = cell_folders(study)[0]
    shutil.rmtree(gone)
    write_json(study / MANIFEST, {**manifest, "statuses": {"finished": 1}, "missing": [gone.name]})
    study_state.cache_clear()
    state = study_state(study)
    assert state.label == "incomplete" and state.failed == [] and state.stale == []
    index = build_leaderboard(study.parent, tmp_path / "site", options=ReportOptions(figures=False)).read_text()
    # the incomplete studies' own table (one per group of studies: studies-incomplete-<group>)
    assert re.search(r'id="studies-incomplete(-[a-z]+)?"', index) and 'data-state="incomplete"' in index
    assert "1 not run yet" in index and "1 of the 2 cells its command plans are published" in index
    assert "incomplete: 1 of the 2" in (tmp_path / "site" / "tiny" / "index.html").read_text()


def test_sampling_is_seeded_and_respects_max_seconds(study):
    from pflbench.studies.verify import sample_cells

    assert sample_cells(study, 1, seed=3) == sample_cells(study, 1, seed=3)
    assert {p.name for s in range(20) for p in sample_cells(study, 1, seed=s)} == {p.name for p in cell_folders(study)}
    assert sample_cells(study, None, seed=0, max_seconds=0.0) == []
    with pytest.raises(ValueError, match="no cell ffffffffffff"):
        sample_cells(study, None, seed=0, cells=["ffffffffffff"])


def test_publish_refuses_bad_requests_before_writing(made, tmp_path):
    import pflbench.studies.publish as publish_module
    from pflbench.studies.publish import PublishError

    tmp, spec, _ = made
    with pytest.raises(PublishError, match="plain folder name"):
        publish(str(spec), "../x", tmp / "store", out=tmp_path, allow_dirty=True)
    with pytest.raises(PublishError, match="has a result"):
        publish(str(spec), "x", tmp_path / "empty", out=tmp_path, allow_dirty=True)
    publish(str(spec), "x", tmp / "store", out=tmp_path, allow_dirty=True)
    with pytest.raises(PublishError, match="--replace"):
        publish(str(spec), "x", tmp / "store", out=tmp_path, allow_dirty=True)
    assert list(tmp_path.iterdir()) == [tmp_path / "x"]
    # cells run by uncommitted code, or by two commits: refused (the manifest could not say what ran)
    summaries = [{"code_commit": "a" * 40, "code_dirty": False}, {"code_commit": "a" * 40, "code_dirty": True}]
    with pytest.raises(PublishError, match="uncommitted changes"):
        publish_module.code_of(summaries, allow_dirty=False)
    summaries[1] = {"code_commit": "b" * 40, "code_dirty": False}
    with pytest.raises(PublishError, match="2 different commits"):
        publish_module.code_of(summaries, allow_dirty=False)
    assert publish_module.code_of(summaries[:1] * 3, allow_dirty=False) == ("a" * 40, False)
    assert publish_module.code_of(summaries, allow_dirty=True)[1] is True


def test_leaderboard_renders_several_studies_and_marks_a_stale_one(made, tmp_path, monkeypatch):
    from pflbench.reports.studies import build_leaderboard

    tmp, spec, _ = made
    monkeypatch.setenv("PFLBENCH_DATA", str(tmp / "data"))
    published = tmp_path / "published"
    publish(str(spec), "both", tmp / "store", out=published, allow_dirty=True)
    publish(str(spec), "fedavg-only", tmp / "store", sets=["algorithm=fedavg"], out=published, allow_dirty=True)
    publish(str(spec), "local-only", tmp / "store", sets=["algorithm=local"], out=published, allow_dirty=True)
    add_default(monkeypatch, "local")  # "both" and "local-only" hold local cells: stale now
    index = build_leaderboard(published, tmp_path / "site", options=ReportOptions(figures=False))
    html = index.read_text()
    current, stale = html.split('id="stale"')
    assert 'data-study="fedavg-only" data-state="current"' in current
    assert 'data-study="both" data-state="stale"' in stale and 'data-study="local-only" data-state="stale"' in stale
    assert "stored configurations resolve to other cell ids" in stale
    for name in ("both", "fedavg-only", "local-only"):
        assert (tmp_path / "site" / name / "index.html").is_file()
    page = next((tmp_path / "site" / "fedavg-only" / "cells").glob("*.html")).read_text()
    cell_id = next((tmp_path / "site" / "fedavg-only" / "cells").glob("*.html")).stem
    assert f"pflbench rerun {cell_id}" in page and 'id="study-provenance"' in page
    assert '<details class="history"><summary>How it was made' in page  # the command, commit, history: folded
    assert "--set algorithm=fedavg" in page  # the spec + --set form
    stale_page = (tmp_path / "site" / "both" / "index.html").read_text()
    assert 'class="state-stale">stale</span>' in stale_page and "peak host MB" in stale_page


def test_a_study_page_leads_with_what_the_study_is_and_folds_the_history():
    """Issue 61: a study's page opens with the first sentence of its manifest's note; the rest (resumes,
    loads, worktrees) goes into the folded provenance."""
    from pflbench.reports.provenance import lead_sentence

    note = (
        "pFedLA Table 2 (dominant), 10 clients (issue 41; from commit 2729b7c. on 2 cores). Local: rounds "
        "1-387 ran on 2026-11-26. FedAvg: 6505 s."
    )
    assert lead_sentence(note) == (
        "pFedLA Table 2 (dominant), 10 clients (issue 41; from commit 2729b7c. on 2 cores).",
        "Local: rounds 1-387 ran on 2026-11-26. FedAvg: 6505 s.",
    )
    assert lead_sentence("one line, no history") == ("one line, no history", "")
    assert lead_sentence("") == ("", "")


def test_leaderboard_shows_a_studys_variants_beside_it(made, tmp_path, monkeypatch, capsys):
    """results/published/leaderboard.yaml puts one study's rows beside another's on its page (each cell
    page keeping its own study's reproduce commands); a name that is no study is one clear error."""
    from pflbench.cli import main
    from pflbench.studies.publish import LEADERBOARD, beside_studies
    from pflbench.reports.studies import build_leaderboard

    tmp, spec, _ = made
    monkeypatch.setenv("PFLBENCH_DATA", str(tmp / "data"))
    published = tmp_path / "published"
    publish(str(spec), "column", tmp / "store", sets=["algorithm=fedavg"], out=published, allow_dirty=True)
    publish(str(spec), "variants", tmp / "store", sets=["algorithm=local"], out=published, allow_dirty=True)
    assert beside_studies(published) == {}
    (published / LEADERBOARD).write_text("beside:\n  column: [variants]\n")
    assert beside_studies(published) == {"column": [published / "variants"]}
    build_leaderboard(published, tmp_path / "site", options=ReportOptions(figures=False, partitions=False))
    column = (tmp_path / "site" / "column" / "index.html").read_text()
    variants = (tmp_path / "site" / "variants" / "index.html").read_text()
    assert 'data-algorithm="local"' in column and 'data-algorithm="fedavg"' in column and "beside this store" in column
    assert 'data-algorithm="fedavg"' not in variants  # the variants' own page is as before
    pages = {p.stem: p.read_text() for p in (tmp_path / "site" / "column" / "cells").glob("*.html")}
    local = next(text for text in pages.values() if "--set algorithm=local" in text)
    reproduce = local.split('id="reproduce"')[1]
    assert "This cell is from the study variants</strong>, shown beside column" in reproduce
    assert "--set algorithm=fedavg" not in reproduce  # its own study's commands, not the column's
    (published / LEADERBOARD).write_text("beside:\n  column: [variant]\n")
    with pytest.raises(PublishError, match="no published study 'variant' \\(published: column, variants\\)"):
        beside_studies(published)
    assert main(["leaderboard", "--published", str(published), "--out", str(tmp_path / "site2"), "--no-figures"]) == 2
    assert "leaderboard: " in capsys.readouterr().err


def test_peak_memory_counts_what_the_cell_held_at_its_peak_not_before():
    import numpy as np

    from pflbench.run.cost import measured

    class Result:  # what `measured` needs of a CellResult
        summary: dict

    def cell(megabytes: int):
        def run():
            block = np.ones(megabytes * 2**20, dtype=np.uint8)  # touched: resident
            del block
            result = Result()
            result.summary = {}
            return result

        return run

    big = measured("cpu", cell(200)).summary
    small = measured("cpu", cell(1)).summary  # after the big one, in the same process
    assert big["peak_host_bytes"] - big["host_start_bytes"] >= 190 * 2**20  # pages the start held may be released
    if small["peak_host_method"] != "process":  # a lifetime peak cannot be reset (not Linux)
        assert small["peak_host_bytes"] - small["host_start_bytes"] < 50 * 2**20
    assert big["cpu_model"] and big["cpu_cores"] >= 1 and "gpu_model" not in big


def test_a_peak_reading_that_lags_the_start_reading_still_reports_at_least_the_start(monkeypatch):
    """The kernel's RSS counters are cached per thread: a VmHWM read after the reset once came out a page
    under the VmRSS read at the start (CI, 2026-11-25). The span includes its start, so the peak cannot be less."""
    from pflbench.run import cost

    host = cost.HostPeak()
    host.stop()  # ends the sampler thread where this machine uses one
    host.method, host.start_bytes, host._thread = "vmhwm", 1_301_348_352, None
    monkeypatch.setattr(cost, "_status_kib", lambda field: 1_301_344_256 // 1024)  # 4 KiB under the start
    assert host.stop() == 1_301_348_352
    monkeypatch.setattr(cost, "_status_kib", lambda field: 2_000_000)  # a real peak above the start is kept
    assert host.stop() == 2_000_000 * 1024


def test_a_cell_without_a_narrowed_spec_form_still_gets_its_page(made, tmp_path, monkeypatch):
    """A spec whose cells no `--set` narrows to one (a `variants` axis, say) leaves a cell's manifest entry
    without `sets`: its page shows the `rerun` command alone (this crashed the leaderboard before)."""
    import json

    from pflbench.reports.studies import build_leaderboard

    tmp, spec, _ = made
    monkeypatch.setenv("PFLBENCH_DATA", str(tmp / "data"))
    published = tmp_path / "published"
    study = publish(str(spec), "bundled", tmp / "store", out=published, allow_dirty=True)
    manifest = json.loads((study / "manifest.json").read_text())
    for entry in manifest["cells"].values():
        entry.pop("sets", None)
    (study / "manifest.json").write_text(json.dumps(manifest))
    build_leaderboard(published, tmp_path / "site", options=ReportOptions(figures=False))
    page = next((tmp_path / "site" / "bundled" / "cells").glob("*.html"))
    text = page.read_text()
    assert f"pflbench rerun {page.stem}" in text and "narrowed to this cell" not in text


def test_every_cell_is_narrowed_by_its_variant_name_and_client_entry(tmp_path):
    """Each cell of a spec with a `variants` axis gets the `--set variant=NAME` form, and a clients entry
    with a participation its `clients={...}` form, that expand the spec to exactly that cell (issue 31:
    every published cell one command from re-running; both had only the rerun command)."""
    from pflbench.config import cell_hash
    from pflbench.studies.publish import narrowing_sets
    from pflbench.run.spec import load_spec
    from pflbench.run.spec_axes import parse_sets

    spec = tmp_path / "v.yaml"
    spec.write_text(
        "name: v\nmatrix:\n  algorithm: [fedavg, local]\n  dataset: [synthetic]\n"
        "  clients: [5, {clients: 6, participation: 0.5}]\n  variants:\n"
        "    - {name: plain}\n    - {name: 'slow, short', set: {lr: 0.001, rounds: 3}}\n"
    )
    plan = load_spec(spec)
    assert len(plan.cells) == 8
    for cell in plan.cells:
        sets = narrowing_sets(cell, str(spec), None, [], plan)
        assert sets is not None and sets[0].startswith("variant=")
        assert [cell_hash(c) for c in load_spec(spec, parse_sets(sets)).cells] == [cell_hash(cell)]


def test_verify_rounds_reruns_the_first_rounds_only_and_compares_those(study, tmp_path, monkeypatch, capsys):
    """`verify --rounds R` (a paper-scale cell in minutes): the rerun stops after R rounds, everything it
    ran is compared exactly, later stored rounds are not; no checkpoint of the cell is read or written."""
    from pflbench.studies.verify import rounds_to_run

    assert rounds_to_run({"rounds": 600, "eval_every": 10}, 1) == 10  # up to the next evaluation round
    assert rounds_to_run({"rounds": 600, "eval_every": 10}, 25) == 30
    assert rounds_to_run({"rounds": 20, "eval_every": 10}, 15) is None  # that is the whole run
    target = cell_folders(study)[0]
    monkeypatch.chdir(tmp_path)  # a store in the working directory holding a (broken) checkpoint of the cell
    planted = tmp_path / "results" / target.name / "checkpoint.pt"
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"not a checkpoint")
    check = check_cell(target, rounds=1)
    assert check.ok and check.rounds == 1 and check.verdict == "identical"
    assert set(check.rerun_result.metrics["round"]) == {1} and check.rerun_result.summary["stopped_after"] == 1
    assert planted.read_bytes() == b"not a checkpoint" and not (tmp_path / "results" / "_damaged").exists()
    tamper(target, fix_checksum=True)  # the last round's accuracy: after the rounds compared
    assert check_cell(target, rounds=1).ok
    metrics = pd.read_parquet(target / METRICS)
    metrics.loc[0, "accuracy"] = 1.0 - metrics.loc[0, "accuracy"]  # round 1: compared
    metrics.to_parquet(target / METRICS, index=False)
    assert [d.what for d in check_cell(target, rounds=1).differences] == ["metrics.parquet accuracy"]
    assert main(["verify", str(study), "--cell", target.name, "--rounds", "1"]) == 1
    assert f"{target.name} (" in capsys.readouterr().out


def test_a_drawn_verify_sample_leaves_out_diverged_cells(tmp_path):
    # A divergence is not reproducible across CPU kinds: CI's drawn sample skips such cells; by name
    # they are still verified.
    for name, status in (("aaaa", "finished"), ("bbbb", "diverged")):
        (tmp_path / name).mkdir()
        (tmp_path / name / SUMMARY).write_text(json.dumps({"status": status, "wall_time": 1.0}))
    assert [p.name for p in sample_cells(tmp_path, 2, seed=0, max_seconds=5)] == ["aaaa"]
    assert [p.name for p in sample_cells(tmp_path, None, seed=0, cells=["bbbb"])] == ["bbbb"]


def test_the_leaderboard_links_every_page_to_the_docs_site(made, tmp_path, monkeypatch):
    """`pflbench leaderboard --docs-url`: the index, each study's page and each cell page link to the
    documentation; a relative URL (make leaderboard: ../../site/index.html) is taken from the index, so the
    link climbs out of a study's folder and its cells/ folder; an absolute one is used as given."""
    import os

    from pflbench.reports.studies import build_leaderboard

    tmp, spec, published = made
    monkeypatch.setenv("PFLBENCH_DATA", str(tmp / "data"))
    site = tmp_path / "reports" / "leaderboard"
    build_leaderboard(
        published.parent, site, options=ReportOptions(figures=False, partitions=False, docs_url="../../site/index.html")
    )
    docs = (tmp_path / "site" / "index.html").resolve()
    pages = [site / "index.html", site / "tiny" / "index.html", next((site / "tiny" / "cells").glob("*.html"))]
    for page in pages:
        links = re.findall(r'<a href="([^"]+)">documentation</a>', page.read_text())
        assert len(links) == 1, page
        assert Path(os.path.normpath(page.parent / links[0])) == docs, (page, links)
    build_leaderboard(
        published.parent,
        tmp_path / "other",
        options=ReportOptions(figures=False, partitions=False, docs_url="https://example.org/pflbench/"),
    )
    cell_page = next((tmp_path / "other" / "tiny" / "cells").glob("*.html")).read_text()
    assert '<a href="https://example.org/pflbench/">documentation</a>' in cell_page
    build_leaderboard(published.parent, tmp_path / "none", options=ReportOptions(figures=False, partitions=False))
    assert ">documentation</a>" not in (tmp_path / "none" / "index.html").read_text()
