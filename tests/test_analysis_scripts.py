"""benchmarks/analysis/: the scripts behind benchmarks/README.md's sentences on pFedLA's weights
(alpha.py), FedFomo's exchange (fedfomo.py) and each cell against Local (versus_local.py), run on
small cells made here and checked against the raw arrays they summarize."""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from pflbench.runner import RunOptions, run_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "analysis"))
import alpha  # noqa: E402
import fedfomo  # noqa: E402
import versus_local  # noqa: E402

SPEC = """
name: analysis
matrix:
  algorithm: [fedfomo, pfedla, local]
  dataset:
    - {name: synthetic, options: {num_samples: 600}}
  partition:
    - {scheme: pathological, params: {classes_per_client: 3}}
  clients: [5]
  seed: [0]
defaults: {rounds: 4, eval_every: 2, batch_size: 16, lr: 0.05, val_fraction: 0.1}
resources: {cpus: 1, gpus: 0}
"""


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    from pflbench.spec import load_spec

    tmp = tmp_path_factory.mktemp("analysis")
    (tmp / "spec.yaml").write_text(SPEC)
    options = RunOptions(results=tmp / "store", data_root=tmp / "data", use_ray=False)
    assert run_plan(load_spec(tmp / "spec.yaml"), options, Console(file=io.StringIO())).exit_code == 0
    found = {}
    for folder in (tmp / "store").iterdir():
        if (folder / "summary.json").is_file():
            found[json.loads((folder / "config.json").read_text())["cell"]["algorithm"]] = folder
    return found


def test_fedfomo_summary_counts_what_its_weight_arrays_hold(cells):
    folder = cells["fedfomo"]
    weights = fedfomo.load(folder, "weights")
    assert list(weights) == [2, 4]  # every evaluation round
    stacked = np.stack(list(weights.values()))
    found = fedfomo.describe(folder)
    assert found["stored_rounds"] == 2 and found["pairs"] == 20 and found["last_round"] == 4
    assert found["clients_stepping_per_round"] == pytest.approx(((stacked > 0).any(2).sum(1)).mean())
    assert found["positive_weights_per_round"] == pytest.approx((stacked > 0).sum((1, 2)).mean())
    assert 0.0 <= found["mean_row_sum"] <= 1.0 + 1e-6 and found["max_weight"] == pytest.approx(stacked.max())
    assert all(np.diag(w).sum() == 0 for w in weights.values())  # a client's own model is not among its weights


def test_alpha_summary_reads_the_self_weights_and_shared_classes(cells):
    folder = cells["pfedla"]
    alphas, layers = alpha.load_alphas(folder)
    assert list(alphas) == [2, 4] and layers
    shared = alpha.shared_classes(folder)
    assert shared.shape == (5, 5) and (np.diag(shared) == 3).all()  # 3 classes each, all above 1/C
    found = alpha.describe(folder, [2, 4], shared_rounds=[2])
    assert found["by_shared_classes"][2] == alpha.by_shared_classes(alphas[2], layers, shared)
    last, eye, off = alphas[4], np.arange(5), ~np.eye(5, dtype=bool)
    assert last.shape == (5, len(layers), 5)
    for a in alphas.values():  # each client's weights over sources sum to 1 per layer
        np.testing.assert_allclose(a.sum(axis=-1), 1.0, rtol=1e-5)
    for layer in range(len(layers)):
        assert found["self_weight"][4][layer] == round(float(last[eye, layer, eye].mean()), 3)
        by_shared = found["by_shared_classes_last_round"][layers[layer]]["mean_weight_by_shared_classes"]
        for k, mean in by_shared.items():
            assert mean == round(float(last[:, layer, :][off][shared[off] == k].mean()), 3)
    assert found["exact_0_or_1"][2] == round(float(((alphas[2] == 0) | (alphas[2] == 1)).mean()), 3)


def test_versus_local_pairs_each_cell_with_local_client_by_client(cells):
    import pandas as pd

    store = cells["local"].parent
    local = versus_local.find_local(json.loads((cells["pfedla"] / "config.json").read_text())["cell"], [store])
    assert local == cells["local"]
    metrics = {name: pd.read_parquet(cells[name] / "metrics.parquet") for name in ("pfedla", "local")}
    last = {name: m[m["round"] == 4].set_index("client")["accuracy"] * 100 for name, m in metrics.items()}
    found = versus_local.versus(cells["pfedla"], local, "accuracy")
    expected = (last["pfedla"] - last["local"]).to_numpy()
    assert found.mean == pytest.approx(expected.mean()) and found.se == pytest.approx(expected.std(ddof=1) / np.sqrt(5))
    table = versus_local.table([cells["pfedla"], cells["local"]], [store], [2, 4])
    pfedla_row, local_row = table.splitlines()[2:]
    share = alpha.describe(cells["pfedla"], [4])["exact_0_or_1"][4]
    assert pfedla_row.endswith(f" / {100 * share:.1f}% |") and "| pfedla | 0 | defaults |" in pfedla_row
    assert f"{found.mean:+.2f} ± {found.se:.2f}" in pfedla_row
    assert "| local | 0 | val_fraction" not in local_row and local_row.count("| – |") == 3  # no difference to itself
