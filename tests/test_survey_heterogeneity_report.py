"""The survey's experiment (benchmarks/survey.yaml, MobileNetV3-Large for 32x32 inputs), wall time per
method in the report, and the "who copes with what" section (pflbench/reports/heterogeneity.py) on
stores fabricated with heterogeneity cells (the knobs' implementations are not needed to read them)."""

from pathlib import Path

import pytest
import torch

from pflbench.config import CellConfig
from pflbench.simulator.models import build_model
from pflbench.reports.cells import load_cells
from pflbench.reports.heterogeneity import NEWCOMER_KEY, OFF, cope_tables, markdown_section
from pflbench.run.spec import load_spec
from pflbench.storage.store import Store
from pflbench.simulator.client_model import ClientModel
from pflbench.simulator.training import SGD, batch_plan, train_clients
from tests.report_helpers import cell_result

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


# ---- MobileNetV3-Large, adapted to 32x32 -------------------------------------------------------------


def test_mobilenetv3_large_keeps_a_2x2_map_and_torchvisions_parameter_counts():
    for shape, classes, count in (
        ((3, 32, 32), 10, 4_214_842),
        ((3, 32, 32), 100, 4_330_132),
        ((1, 28, 28), 10, 4_214_554),
    ):
        model = build_model("mobilenetv3-large", shape, classes)
        assert sum(p.numel() for p in model.parameters()) == count
        assert model.features(torch.zeros(2, *shape)).shape[-2:] == (2, 2)  # torchvision's own: 1x1
        assert model(torch.zeros(2, *shape)).shape == (2, classes)


def test_mobilenetv3_trains_batched_and_in_a_loop_alike():
    torch.manual_seed(0)
    module = build_model("mobilenetv3-large", (3, 32, 32), 10)
    module.classifier[2].p = 0.0  # dropout draws differ between the paths; everything else must agree
    model = ClientModel(module)
    assert model._twins[False] is not None  # natively batched: every parameter layer has a stacked twin
    state = model.init(2, seed=0)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    indices = [torch.arange(0, 8), torch.arange(8, 16)]
    plans = batch_plan([8, 8], 4, 1, None, [torch.Generator().manual_seed(k) for k in range(2)])
    batched, loss_b = train_clients(
        model, {k: v.clone() for k, v in state.items()}, x, y, indices, plans, SGD(0.05, 0.9), batched=True
    )
    looped, loss_l = train_clients(
        model, {k: v.clone() for k, v in state.items()}, x, y, indices, plans, SGD(0.05, 0.9), batched=False
    )
    assert torch.allclose(loss_b, loss_l, atol=1e-4)
    for name in model.param_names:
        assert torch.allclose(batched[name], looped[name], atol=1e-3), name
    assert not torch.equal(batched["classifier.3.weight"], state["classifier.3.weight"])


# ---- the survey spec ---------------------------------------------------------------------------------


def test_survey_spec_is_the_papers_setting_and_its_quick_scale_runs_on_cifar10_jpeg():
    full = load_spec(BENCHMARKS / "survey.yaml")
    assert {c.dataset for c in full.cells} == {"cifar10", "cifar100"} and full.optional_datasets == {
        "cifar10",
        "cifar100",
    }
    for cell in full.cells:
        assert (cell.clients, cell.participation, cell.local_epochs, cell.batch_size) == (100, 0.05, 5, 32)
        assert cell.model == "mobilenetv3-large" and cell.partition == "dirichlet"
        assert cell.partition_params["alpha"] == {"cifar10": 0.3, "cifar100": 0.1}[cell.dataset]
        assert cell.partition_params["mean_samples_per_client"] == 600
        assert round(600 * cell.train_fraction) == 500 and cell.val_fraction == 0.0
    assert len(full.cells) == 2 * len({c.algorithm for c in full.cells}) and "fedavg" in {
        c.algorithm for c in full.cells
    }
    quick = load_spec(BENCHMARKS / "survey.yaml", scale="quick")
    assert {c.dataset for c in quick.cells} == {"cifar10-jpeg"}
    assert all(round(c.clients * c.participation) == 5 and c.local_epochs == 5 for c in quick.cells)


def test_heterogeneity_spec_turns_on_one_knob_at_a_time():
    """6 algorithms x 9 variants (the `variants` axis): every knob off, each of the 5 knobs alone, and
    the privacy knob at three more budgets/clips; every cell at eval_every 5, so cells differ only in
    their knobs."""
    knobs = ("feature_shift", "concept_shift", "system", "privacy", "unseen_fraction")
    plan = load_spec(BENCHMARKS / "heterogeneity.yaml")
    assert len(plan.cells) == 54 and {c.eval_every for c in plan.cells} == {5}
    for algorithm in ("local", "fedavg", "fedrep", "ditto", "pfedhn", "pfedla"):
        mine = [c for c in plan.cells if c.algorithm == algorithm]
        on = sorted(tuple(k for k in knobs if getattr(c, k)) for c in mine)
        assert on == sorted([(), *((k,) for k in knobs), *[("privacy",)] * 3])
        privacy = sorted((c.privacy["epsilon"], c.privacy.get("clip", 1.0)) for c in mine if c.privacy)
        assert privacy == [(8, 0.1), (8, 1.0), (64, 0.1), (64, 0.3)]


# ---- who copes with what -----------------------------------------------------------------------------


def _write(
    root, algorithm, accuracies, seed=0, status="finished", dataset="synthetic", summary=None, clients=2, **knobs
):
    cell = CellConfig(
        algorithm=algorithm, dataset=dataset, partition="dirichlet", clients=clients, rounds=3, seed=seed, **knobs
    )
    Store(root).write(cell, cell_result(status=status, accuracies=accuracies, summary=summary))


def _store(tmp_path):
    root = tmp_path / "results"
    for seed, shift in ((0, 0.0), (1, 0.02)):
        _write(root, "fedavg", (0.80 + shift, 0.80 + shift), seed=seed)
        _write(root, "fedavg", (0.40 + shift, 0.40 + shift), seed=seed, concept_shift={"clusters": 4})
        _write(root, "local", (0.70, 0.70), seed=seed)
        _write(root, "local", (0.68, 0.70), seed=seed, concept_shift={"clusters": 4})
    _write(root, "fedavg", (0.79, 0.79), system={"dropout": 0.3, "stragglers": 0.5})
    _write(root, "local", (0.5, 0.5), status="failed", system={"dropout": 0.3, "stragglers": 0.5})
    # Client 1 held out (partition id 1): its newcomer accuracy is compared with client 1's in the knob-off
    # cell (seed 0: 80%), not with that cell's mean over all clients.
    _write(root, "fedavg", (0.9, 0.9), unseen_fraction=0.5, summary={NEWCOMER_KEY: 0.6, "newcomers": [1]})
    _write(root, "fedavg", (0.5, 0.5), dataset="other", clients=3)  # another study, knob off only: no table
    return root


def test_copes_is_measured_against_the_algorithms_own_knob_off_cell(tmp_path):
    tables = cope_tables(load_cells(_store(tmp_path)))
    assert len(tables) == 1
    table = tables[0]
    assert table.settings[0] == OFF and "concept_shift.clusters=4" in table.settings
    assert [row.algorithm for row in table.rows] == ["local", "fedavg"]
    fedavg, local = (next(r for r in table.rows if r.algorithm == a) for a in ("fedavg", "local"))
    shifted = table.entry(fedavg, "concept_shift.clusters=4")
    assert shifted.mean == pytest.approx(41.0) and shifted.delta == pytest.approx(-40.0)  # paired by seed
    assert shifted.copes() is False and "✗" in shifted.text()
    assert table.entry(local, "concept_shift.clusters=4").copes() is True  # -1 point
    dropped = "system.dropout=0.3, system.stragglers=0.5"
    assert table.entry(fedavg, dropped).copes() is True
    failed = table.entry(local, dropped)
    assert failed.values == [] and failed.problems == {"failed": 1} and failed.copes() is None  # never a zero
    newcomer = table.entry(fedavg, "unseen_fraction=0.5")
    assert newcomer.newcomers and newcomer.mean == pytest.approx(60.0) and newcomer.delta == pytest.approx(-20.0)
    summary = table.copes_summary()
    assert summary["FedAvg"]["concept_shift"] is False and summary["Local"]["concept_shift"] is True
    assert summary["Local"]["system"] is None and summary["FedAvg"]["privacy"] is None


def test_newcomers_are_compared_with_the_same_clients_in_the_knob_off_cell(tmp_path):
    """Issue 29, item 3: Local serves a newcomer exactly as it trains everyone, so if the held-out
    clients are the hard ones, the knob-off cell's mean over *all* clients makes Local look as if it
    did not cope. The baseline is the same partition ids in the knob-off cell."""
    root = tmp_path / "results"
    _write(root, "local", (0.95, 0.95, 0.70, 0.95), clients=4)  # client 2 is the hard one
    _write(
        root,
        "local",
        (0.95, 0.95, 0.95),
        clients=4,
        unseen_fraction=0.25,  # client 2 held out: 70% as a newcomer
        summary={NEWCOMER_KEY: 0.70, "newcomers": [2]},
    )
    _write(root, "fedavg", (0.80, 0.80, 0.80, 0.80), clients=4)
    _write(
        root,
        "fedavg",
        (0.80, 0.80, 0.80),
        clients=4,
        unseen_fraction=0.25,  # ids not in the knob-off rows
        summary={NEWCOMER_KEY: 0.50, "newcomers": [7]},
    )
    (table,) = cope_tables(load_cells(root))
    local, fedavg = (next(r for r in table.rows if r.algorithm == a) for a in ("local", "fedavg"))
    newcomers = table.entry(local, "unseen_fraction=0.25")
    assert newcomers.newcomers and newcomers.mean == pytest.approx(70.0)
    assert newcomers.delta == pytest.approx(0.0) and newcomers.copes() is True  # vs the all-client mean: -18.75, ✗
    assert table.copes_summary()["Local"]["unseen_fraction"] is True
    unknown = table.entry(fedavg, "unseen_fraction=0.25")
    assert unknown.mean == pytest.approx(50.0) and unknown.delta is None and unknown.copes() is None  # not judged
    assert "same partition ids" in table.caption


def test_locals_newcomers_match_the_same_clients_trained_on_the_engine(tmp_path):
    """On real cells: Local trains a newcomer exactly as it trains a client of the knob-off cell (same
    partition, batches keyed by partition id), so against the same clients its change is exactly 0 —
    while the knob-off cell's mean over all clients is another number altogether."""
    from pflbench.simulator.rounds import run_cell
    from pflbench.reports.heterogeneity import same_clients_accuracy

    base = dict(
        algorithm="local",
        dataset="synthetic",
        dataset_options={"num_samples": 600},
        partition="pathological",
        partition_params={"classes_per_client": 3},
        clients=10,
        rounds=2,
        local_epochs=1,
        batch_size=16,
        lr=0.05,
        seed=3,
        # both cells normalised alike: under the default (`train`) the statistics come from each
        # cell's own trained clients, and holding clients out moves them slightly
        normalization="pool",
    )
    store = Store(tmp_path / "results")
    results = {}
    for fraction in (0.0, 0.3):
        cell = CellConfig(**base, unseen_fraction=fraction)
        results[fraction] = run_cell(cell, data_root=tmp_path)
        store.write(cell, results[fraction])
    ids = results[0.3].summary["newcomers"]
    cells = load_cells(tmp_path / "results")
    off = cells[cells["unseen_fraction"] == 0.0].iloc[0]
    assert same_clients_accuracy(off, ids) == pytest.approx(results[0.3].summary[NEWCOMER_KEY] * 100)
    (table,) = cope_tables(cells)
    entry = table.entry(table.rows[0], "unseen_fraction=0.3")
    assert entry.newcomers and entry.deltas == [pytest.approx(0.0, abs=1e-9)] and entry.copes() is True
    assert abs(entry.mean - results[0.0].summary["final_accuracy"] * 100) > 1  # the old baseline would mislead


def test_no_heterogeneity_cells_no_section(tmp_path):
    root = tmp_path / "results"
    _write(root, "fedavg", (0.8, 0.8))
    _write(root, "local", (0.7, 0.7))
    assert cope_tables(load_cells(root)) == [] and markdown_section([]) == ""


def test_report_and_leaderboard_show_who_copes_and_wall_time(tmp_path):
    from pflbench.reports.build import ReportOptions, build_reports

    report = build_reports(_store(tmp_path), tmp_path / "out", ReportOptions(figures=False, partitions=False))
    markdown = report.markdown.read_text()
    assert "## Who copes with what" in markdown and "at most 5 points" in markdown
    section = markdown[markdown.index("## Who copes") :]
    assert "| FedAvg | 81.0 | 41.0 (-40.0) ✗ | 79.0 (-1.0) ✓ | 60.0ⁿ (-20.0) ✗ |" in section
    assert "compared with the knob-off cell's accuracy on the same clients (the same partition ids" in section
    assert "| Local | 70.0 | 69.0 (-1.0) ✓ | 1 failed | – |" in section
    # The accuracy tables keep knob-on cells in rows of their own, never as more seeds of the knob-off row.
    assert (
        "| FedAvg (concept\\_shift.clusters=4) | 41.00 ± 1.41 |" in markdown and "| FedAvg | 81.00 ± 1.41 |" in markdown
    )
    assert "wall s" in markdown  # the communication table's wall-clock column (the survey reports it per method)
    html = report.index.read_text()
    assert 'id="copes"' in html and "concept_shift.clusters=4" in html and "41.0 (-40.0) ✗" in html
    assert "accuracy on the same clients (the same partition ids" in html
    latex = report.latex.read_text()
    assert r"Who copes with what" in latex and r"41.0 (-40.0) $\times$" in latex and r"$\checkmark$" in latex
    assert "accuracy on the same clients (the same partition ids" in latex
    assert "✓" not in latex and "✗" not in latex and "≈" not in latex  # every symbol typeset


def test_a_method_that_diverges_under_a_knob_does_not_cope_and_per_method_lr_shares_the_study(tmp_path):
    root = tmp_path / "results"
    _write(root, "fedavg", (0.80, 0.80))
    _write(root, "fedavg", (0.1, 0.1), status="diverged", privacy={"epsilon": 8})
    _write(root, "local", (0.70, 0.70), lr=0.05)  # a method's own lr (pFedHN's in heterogeneity.yaml)
    _write(root, "local", (0.69, 0.70), lr=0.05, privacy={"epsilon": 8})
    tables = cope_tables(load_cells(root))
    assert len(tables) == 1  # one study despite Local's lr
    table = tables[0]
    fedavg, local = (next(r for r in table.rows if r.algorithm == a) for a in ("fedavg", "local"))
    setting = next(s for s in table.settings if s != OFF)
    assert table.entry(fedavg, setting).copes() is False and "diverged ✗" in table.entry(fedavg, setting).text()
    assert table.entry(local, setting).copes() is True
    assert table.copes_summary()["FedAvg"]["privacy"] is False and table.copes_summary()["Local"]["privacy"] is True


def test_figures_draw_the_knob_off_cells_where_a_group_has_both():
    import pandas as pd

    from pflbench.reports.build import _knobs_off

    group = pd.DataFrame({"algorithm": ["fedavg", "fedavg", "local"], "concept_shift.clusters": [None, 4, None]})
    kept, title = _knobs_off(group, "fmnist, 20 clients, dirichlet")
    assert list(kept.index) == [0, 2] and title.endswith("(heterogeneity knobs off)")
    only_on = group.iloc[[1]]  # no knob-off cell to show instead: the group is drawn as it is
    kept, title = _knobs_off(only_on, "t")
    assert kept.equals(only_on) and title == "t"


def test_accuracy_tables_rank_each_knob_setting_among_its_own_rows(tmp_path):
    """A knob-on row is another experiment: FedAvg with half its clients unseen scores 90% over the
    trained ones, above every knob-off row, yet is not the knob-off column's best; under concept shift
    Local (69.0%) is that setting's best, though below knob-off FedAvg (81%)."""
    from pflbench.reports.tables import accuracy_tables

    table = accuracy_tables(load_cells(_store(tmp_path)))[0]
    column = next(c for c in table.columns if c.dataset == "synthetic")
    best = {
        (r.algorithm, r.setting): e.top
        for r in table.rows
        if (e := table.entry(r, column)) is not None and e.mean is not None
    }
    assert best[("fedavg", "")] and not best[("local", "")]
    assert best[("local", "concept_shift.clusters=4")] and not best[("fedavg", "concept_shift.clusters=4")]
    assert not best[("fedavg", "unseen_fraction=0.5")]  # alone in its setting: nothing to rank against
    assert table.entry(next(r for r in table.rows if r.setting == "unseen_fraction=0.5"), column).mean > 81
