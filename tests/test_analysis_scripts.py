"""benchmarks/analysis/: the scripts behind benchmarks/README.md's sentences on pFedLA's weights
(alpha.py), FedFomo's exchange (fedfomo.py), each cell against Local (versus_local.py) and a cell
branched from its checkpoint (branch.py), run on
small cells made here and checked against the raw arrays they summarize."""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from pflbench.runner import RunOptions, run_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "analysis"))
import alpha  # noqa: E402
import branch  # noqa: E402
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


BRANCH_SPEC = """
name: branch
matrix:
  algorithm: [perfedavg]
  dataset:
    - {name: synthetic, options: {num_samples: 400}}
  partition:
    - {scheme: pathological, params: {classes_per_client: 3}}
  clients: [4]
  seed: [0]
defaults: {rounds: 6, eval_every: 2, batch_size: 16, lr: 0.05, finetune_epochs: 1, hp: {beta: 0.05}}
resources: {cpus: 1, gpus: 0}
"""


@pytest.fixture(scope="module")
def branched(tmp_path_factory):
    """A Per-FedAvg cell run to the end with its round-3 checkpoint kept (checkpoint_every 3: rounds 3
    and 6, and the last round writes none)."""
    from pflbench.spec import load_spec

    tmp = tmp_path_factory.mktemp("branch")
    (tmp / "spec.yaml").write_text(BRANCH_SPEC)
    options = RunOptions(results=tmp / "store", data_root=tmp / "data", use_ray=False, checkpoint_every=3,
                         keep_checkpoints=True)
    assert run_plan(load_spec(tmp / "spec.yaml"), options, Console(file=io.StringIO())).exit_code == 0
    folder = next(f for f in (tmp / "store").iterdir() if (f / "summary.json").is_file())
    return tmp, folder


def _branch(tmp, folder, name, *extra):
    out = tmp / f"{name}.json"
    assert branch.main([str(folder / "checkpoint.pt"), "--config", str(folder / "config.json"), "--out", str(out),
                        "--data-root", str(tmp / "data"), "--check", str(folder), "--probe-every", "1",
                        "--power-steps", "30", *extra]) == 0
    return json.loads(out.read_text())


def test_a_branch_without_changes_repeats_the_stored_rounds(branched):
    tmp, folder = branched
    found = _branch(tmp, folder, "same")
    assert found["checkpoint"]["round"] == 3 and found["ended"] == "ran to the end"
    assert [e["round"] for e in found["evaluations"]] == [4, 6]
    assert found["differences"] == []
    assert [p["round"] for p in found["probes"]] == [3, 4, 5, 6]
    assert found["probes"][0]["moved"] == 0.0 and all(p["moved"] > 0 for p in found["probes"][1:])
    # the delivered models are the shared one after one step of alpha: the stored evaluation's accuracy
    stored = pd.read_parquet(folder / "metrics.parquet").groupby("round")["accuracy"].mean()
    assert found["probes"][1]["delivered_test_accuracy"] == pytest.approx(float(stored[4]), abs=1e-6)
    # a light checkpoint (without Per-FedAvg's cache of delivered models) branches to the same rounds,
    # and a snapshot of the shared model alone probes as the whole checkpoint does
    assert branch.main([str(folder / "checkpoint.pt"), "--write-light", str(tmp / "light.pt")]) == 0
    assert branch.main([str(tmp / "light.pt"), "--config", str(folder / "config.json"), "--out", str(tmp / "light.json"),
                        "--data-root", str(tmp / "data"), "--check", str(folder), "--power-steps", "30"]) == 0
    light = json.loads((tmp / "light.json").read_text())
    assert light["differences"] == [] and light["evaluations"] == found["evaluations"]
    assert branch.main(["--write-snapshots", str(folder / "checkpoint.pt"), "--out", str(tmp / "snapshots")]) == 0
    assert branch.main(["--config", str(folder / "config.json"), "--out", str(tmp / "snapshots.json"), "--data-root",
                        str(tmp / "data"), "--power-steps", "30", "--snapshots", str(tmp / "snapshots" / "snapshot-0003.pt")]) == 0
    probed = json.loads((tmp / "snapshots.json").read_text())["probes"]
    assert len(probed) == 1 and {k: v for k, v in probed[0].items() if k not in ("seconds", "moved")} == {
        k: v for k, v in found["probes"][0].items() if k not in ("seconds", "moved")}
    changed = _branch(tmp, folder, "beta", "--set", "hp.beta=0.01")
    assert changed["changes"] == ["hp.beta=0.01"] and len(changed["differences"]) >= 1


def test_the_curvature_probe_finds_the_hessians_top_eigenvalue(branched):
    """Against the exact Hessian of one client's train loss (the synthetic cell's small model)."""
    import torch
    import torch.nn.functional as F

    from pflbench.execution import ExecutionOptions
    from pflbench.rounds import cell_global_rng

    tmp, folder = branched
    cell = branch.branch_cell(json.loads((folder / "config.json").read_text()), [])
    with cell_global_rng(cell.seed, torch.device("cpu")):
        fed, algorithm = branch.federation_of(cell, ExecutionOptions(device="cpu", threads=1), tmp / "data")
        algorithm.setup()
    state = {k: t.expand(fed.num_clients, *t.shape[1:]).clone() for k, t in algorithm.global_state.items()}
    grad_norm, top = branch.curvature(fed, state, steps=200)
    names = fed.model.param_names
    length = min(len(fed.splits["train"][c]) for c in range(fed.num_clients))
    ids = fed.splits["train"][0][:length]
    shapes = [state[n][:1].shape for n in names]

    def loss(vector):
        params, at = {}, 0
        for n, shape in zip(names, shapes):
            params[n] = vector[at:at + shape.numel()].view(shape)
            at += shape.numel()
        logits = fed.model.forward(params, fed.features[ids][None], train=True)
        return F.cross_entropy(logits[0], fed.labels[ids])

    w = torch.cat([state[n][0].flatten() for n in names]).double().float()
    hessian = torch.autograd.functional.hessian(loss, w)
    exact = torch.linalg.eigvalsh(hessian.double())
    grad = torch.autograd.grad(loss(w.requires_grad_(True)), w)[0]
    assert float(grad_norm[0]) == pytest.approx(float(grad.norm()), rel=1e-4)
    # power iteration finds the eigenvalue largest in size (here the top one: the loss is convex in the
    # last layer and the rest is flatter)
    assert float(top[0]) == pytest.approx(float(exact[-1]), rel=0.02)
