"""Each figure function writes non-empty PNG and SVG files and returns what it drew, which matches
its input: pFedLA's α as stored in a cell's artifacts (Figures 5-7), curves, distributions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from report_helpers import dirichlet_alpha, write_cell

from pflbench.reports import figures as fig
from pflbench.reports.cells import read_artifacts

LAYERS = np.array(["conv1", "conv2", "fc1", "fc2", "fc3"])


def written(stem, formats=("png", "svg")):
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        assert path.stat().st_size > 1000, path
    assert stem.with_name(f"{stem.name}.png").read_bytes()[:4] == b"\x89PNG"
    if "svg" in formats:
        assert b"<svg" in stem.with_name(f"{stem.name}.svg").read_bytes()[:2000]


@pytest.fixture(scope="module")
def stored_alpha(tmp_path_factory):
    """α of 6 clients x 5 layers at rounds 2, 4, 6, written to and read back from a store."""
    root = tmp_path_factory.mktemp("store")
    arrays = {}
    for rnd in (2, 4, 6):
        arrays[f"alpha_round{rnd:05d}"] = dirichlet_alpha(6, 5, seed=rnd)
        arrays[f"alpha_layers_round{rnd:05d}"] = LAYERS
    folder = write_cell(root, algorithm="pfedla", artifacts=arrays)
    artifacts = read_artifacts(root / folder)
    assert set(artifacts) == {"alpha", "alpha_layers"} and list(artifacts["alpha"]) == [2, 4, 6]
    return artifacts, arrays


def test_alpha_heatmap_draws_the_stored_layer(stored_alpha, tmp_path):
    artifacts, arrays = stored_alpha
    drawn = fig.alpha_heatmap(artifacts["alpha"][4], tmp_path / "fig6", layer="fc1", layer_names=LAYERS)
    np.testing.assert_array_equal(drawn, arrays["alpha_round00004"][:, 2, :])
    np.testing.assert_allclose(drawn.sum(axis=1), 1.0, rtol=1e-5)
    written(tmp_path / "fig6")
    with pytest.raises(ValueError, match="unknown layer 'fc9'"):
        fig.alpha_heatmap(artifacts["alpha"][4], tmp_path / "x", layer="fc9", layer_names=LAYERS)


def test_alpha_evolution_and_per_layer_weights(stored_alpha, tmp_path):
    artifacts, arrays = stored_alpha
    drawn = fig.alpha_evolution(artifacts["alpha"], tmp_path / "fig5", client=3, layer_names=LAYERS, formats=("png",))
    assert drawn.shape == (3, 5, 6)
    np.testing.assert_array_equal(drawn[1], arrays["alpha_round00004"][3])
    written(tmp_path / "fig5", ("png",))
    drawn = fig.client_layer_weights(
        artifacts["alpha"][6], tmp_path / "fig7", client=1, layer_names=LAYERS, formats=("png",)
    )
    np.testing.assert_array_equal(drawn, arrays["alpha_round00006"][1])
    written(tmp_path / "fig7", ("png",))


def test_learning_curves_bands_over_seeds(tmp_path):
    curves = pd.DataFrame(
        {
            "label": ["A"] * 4 + ["B"] * 2,
            "seed": [0, 0, 1, 1, 0, 0],
            "round": [1, 2, 1, 2, 1, 2],
            "accuracy": [0.5, 0.7, 0.7, 0.9, 0.3, 0.4],
        }
    )
    stats = fig.learning_curves(curves, tmp_path / "curves", formats=("png",)).set_index(["label", "round"])
    assert stats.loc[("A", 2), "mean"] == pytest.approx(80.0) and stats.loc[("A", 2), "std"] == pytest.approx(
        np.sqrt(200)
    )
    assert stats.loc[("B", 1), "std"] == 0 and stats.loc[("B", 1), "seeds"] == 1
    written(tmp_path / "curves", ("png",))


def test_client_distribution_marks_the_worst_ten_percent(tmp_path):
    values = np.linspace(0.1, 1.0, 20)
    drawn = fig.client_accuracy_distribution({"A": values}, tmp_path / "dist", formats=("png",))
    assert drawn["A"]["worst10_threshold"] == pytest.approx(values[1] * 100)  # 2 of 20 clients
    assert drawn["A"]["worst10_mean"] == pytest.approx(values[:2].mean() * 100)
    written(tmp_path / "dist", ("png",))


def test_client_distribution_lays_out_many_long_variant_labels(tmp_path):
    """Thirteen rows, three of them a variant's long label (a study with its variants beside it): the
    layout holds (matplotlib warns when constrained layout collapses the axes) and every label is on
    its row, wrapped."""
    import warnings

    labels = [
        "Local",
        "FedAvg",
        "Per-FedAvg",
        "pFedMe",
        "FedBN",
        "FedRep",
        "FedFomo",
        "HeurpFedLA",
        "pFedHN (inner_optimizer=official, batch_size=64)",
        "pFedHN (inner_optimizer=cell, batch_size=32)",
        "pFedLA (head_init=uniform, hn_lr=0.01, hn_optimizer=adam, hn_sign=ascend)",
        "pFedLA (head_init=random, hn_lr=0.005, hn_optimizer=sgd, hn_sign=descend)",
        "pFedLA",
    ]
    values = {label: np.linspace(0.7, 0.95, 10) for label in labels}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = fig.client_accuracy_distribution(values, tmp_path / "dist", formats=("png",))
    assert list(drawn) == labels
    wrapped = fig.wrapped_labels(labels)
    assert wrapped[0] == "Local" and [w.replace("\n", " ") for w in wrapped] == labels
    assert wrapped[10].count("\n") == 2 and max(len(line) for line in wrapped[10].split("\n")) <= 36
    written(tmp_path / "dist", ("png",))


def test_communication_label_distribution_and_generic_artifacts(tmp_path):
    points = pd.DataFrame(
        {
            "label": ["FedAvg", "HeurpFedLA (retain_layers=1)"],
            "mb_per_round": [2.0, 1.0],
            "accuracy": [80.0, 85.0],
            "accuracy_std": [1.0, 0.5],
        }
    )
    paper = pd.DataFrame({"label": ["k=0", "k=1"], "comm_mbytes": [491.08, 488.65], "accuracy": [90.65, 94.11]})
    assert fig.communication_vs_accuracy(points, tmp_path / "comm", paper=paper, formats=("png",)).equals(points)
    written(tmp_path / "comm", ("png",))
    counts = np.array([[5, 0, 3], [0, 7, 1]])
    np.testing.assert_array_equal(fig.label_distribution(counts, tmp_path / "labels"), counts)
    written(tmp_path / "labels")
    routing = np.arange(24, dtype=float).reshape(2, 3, 4)
    np.testing.assert_array_equal(fig.array_figure(routing, tmp_path / "routing", formats=("png",)), routing)
    assert fig.array_figure(np.array(["a", "b"]), tmp_path / "names") is None


def test_curves_after_adaptation_are_drawn_from_the_adapted_cells_only(tmp_path):
    from pflbench.reports.build import ReportOptions, build_reports, curve_of
    from pflbench.reports.cells import load_cells, read_metrics

    root = tmp_path / "results"
    write_cell(root, algorithm="fedavg", accuracies=(0.6, 0.8), adapted=(0.9, 0.7), rounds=4)
    write_cell(root, algorithm="local", accuracies=(0.5, 0.7), rounds=4)  # no local adaptation
    cells = load_cells(root).set_index("algorithm")
    adapted = curve_of(read_metrics(cells.loc["fedavg", "path"]), "accuracy_adapted")
    assert adapted["round"].tolist() == [1, 2, 3, 4] and adapted["accuracy"].iloc[-1] == pytest.approx(0.8)
    assert curve_of(read_metrics(cells.loc["local", "path"]), "accuracy_adapted").empty
    report = build_reports(root, tmp_path / "out", ReportOptions(formats=("png",), partitions=False))
    shown = dict(report.figures)
    adapted_png = shown["Learning curves after local adaptation: fmnist, 10 clients, pathological"]
    assert (tmp_path / "out" / adapted_png).stat().st_size > 1000
    assert (tmp_path / "out" / shown["Learning curves: fmnist, 10 clients, pathological"]).exists()
