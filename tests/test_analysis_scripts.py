"""benchmarks/analysis/: the scripts behind benchmarks/README.md's sentences on pFedLA's weights
(alpha.py), FedFomo's exchange (fedfomo.py), each cell against Local (versus_local.py), a column's
table against the paper (column_table.py), a cell's curve (curve.py) and a cell branched from its
checkpoint (branch.py), run on
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

from pflbench.reports.reference import load_references
from pflbench.run.options import RunOptions
from pflbench.run.runner import run_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "analysis"))
import alpha  # noqa: E402
import branch  # noqa: E402
import column_table  # noqa: E402
import curve  # noqa: E402
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
    from pflbench.run.spec import load_spec

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


def test_curve_reads_each_rounds_mean_and_the_largest_fall(cells, capsys):
    metrics = pd.read_parquet(cells["local"] / "metrics.parquet")
    expected = metrics.groupby("round")["accuracy"].mean() * 100
    found = curve.mean_curve(cells["local"], "accuracy")
    assert list(found.index) == [2, 4] and np.allclose(found.to_numpy(), expected.to_numpy())
    falling = pd.Series([80.0, 86.5, 84.0, 75.0, 76.0], index=[10, 20, 30, 40, 50])
    assert curve.largest_fall(falling) == (30, 40, pytest.approx(9.0))
    assert curve.main([str(cells["local"]), "--rounds", "2,3,4"]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    best = int(expected.idxmax())
    assert f"| local | 0 | {expected[2]:.2f} | – | {expected[4]:.2f} | {best}: {expected[best]:.2f} |" in row
    assert curve.main([str(cells["local"]), "--adapted"]) == 0  # no adaptation run here: said, no crash
    assert capsys.readouterr().out.splitlines()[2].endswith("| no accuracy_adapted scores |")


def test_column_table_takes_every_delta_from_unrounded_means(tmp_path):
    """Means 90.666... (clients 90, 91, 91) against the paper's 94.83: Δ −4.16, not the −4.13 of a
    mean rounded to 90.7 first; a second seed in another store makes the row a mean ± SD over seeds,
    its difference to Local pooled over (seed, client) pairs."""
    from report_helpers import write_cell

    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "paper.csv").write_text(
        "algorithm,dataset,partition,clients,protocol,mean,std\n"
        "pfedhn,fmnist,pathological,3,adapted-final-clients,94.83,0.33\n"
    )
    references = load_references(tmp_path / "reference")
    local = {0: (0.90, 0.92, 0.94), 1: (0.88, 0.90, 0.95)}
    ours = {0: ((0.90, 0.91, 0.91), (0.92, 0.95, 0.95)), 1: ((0.89, 0.93, 0.93), (0.90, 0.94, 0.97))}
    for seed in (0, 1):
        store = tmp_path / f"seed{seed}"
        write_cell(store, algorithm="local", clients=3, seed=seed, accuracies=local[seed], adapted=local[seed])
        write_cell(store, algorithm="pfedhn", clients=3, seed=seed, accuracies=ours[seed][0], adapted=ours[seed][1])

    one = column_table.table([tmp_path / "seed0"], references).splitlines()
    local_row, row = (next(line for line in one if line.startswith(f"| {name} |")) for name in ("Local", "pFedHN"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    delivered, adapted = np.mean(ours[0][0]) * 100, np.mean(ours[0][1]) * 100
    assert cells[3:8] == [
        f"{delivered:.2f}",
        f"{adapted:.2f}",
        "94.83",
        "\u22124.16",
        f"{adapted - 94.83:+.2f}".replace("-", "\u2212"),
    ]
    assert round(delivered, 1) - 94.83 == pytest.approx(-4.13)  # what a rounded mean would have printed
    differences = (np.array(ours[0][1]) - np.array(local[0])) * 100
    assert cells[9] == (
        f"{differences.mean():+.2f} ± {differences.std(ddof=1) / np.sqrt(3):.2f} (3 up, 0 down)".replace("-", "\u2212")
    )
    assert local_row.split("|")[6].strip() == "–" and local_row.split("|")[10].strip() == "–"  # no paper, no − Local

    both = column_table.table([tmp_path / "seed0", tmp_path / "seed1"], references).splitlines()
    cells = [c.strip() for c in next(line for line in both if line.startswith("| pFedHN |")).split("|")[1:-1]]
    per_seed = [np.mean(ours[s][1]) * 100 for s in (0, 1)]
    assert cells[2] == "0, 1" and cells[1] == "`seed0` / `seed1`"
    assert (
        cells[4]
        == f"{np.mean(per_seed):.2f} ± {np.std(per_seed, ddof=1):.2f} (seeds {per_seed[0]:.2f} / {per_seed[1]:.2f})"
    )
    assert cells[7] == (
        f"{np.mean(per_seed) - 94.83:+.2f} (seeds {per_seed[0] - 94.83:+.2f} / {per_seed[1] - 94.83:+.2f})".replace(
            "-", "\u2212"
        )
    )
    pooled = np.concatenate([(np.array(ours[s][1]) - np.array(local[s])) * 100 for s in (0, 1)])
    seeds = [((np.array(ours[s][1]) - np.array(local[s])) * 100).mean() for s in (0, 1)]
    assert cells[9].startswith(f"{pooled.mean():+.2f} ± {pooled.std(ddof=1) / np.sqrt(6):.2f} (")
    assert cells[9].endswith(
        f"; over seeds {np.mean(seeds):+.2f} ± {np.std(seeds, ddof=1):.2f} SD".replace("-", "\u2212")
    )


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
    from pflbench.run.spec import load_spec

    tmp = tmp_path_factory.mktemp("branch")
    (tmp / "spec.yaml").write_text(BRANCH_SPEC)
    options = RunOptions(
        results=tmp / "store", data_root=tmp / "data", use_ray=False, checkpoint_every=3, keep_checkpoints=True
    )
    assert run_plan(load_spec(tmp / "spec.yaml"), options, Console(file=io.StringIO())).exit_code == 0
    folder = next(f for f in (tmp / "store").iterdir() if (f / "summary.json").is_file())
    return tmp, folder


def _branch(tmp, folder, name, *extra):
    out = tmp / f"{name}.json"
    assert (
        branch.main(
            [
                str(folder / "checkpoint.pt"),
                "--config",
                str(folder / "config.json"),
                "--out",
                str(out),
                "--data-root",
                str(tmp / "data"),
                "--check",
                str(folder),
                "--probe-every",
                "1",
                "--power-steps",
                "30",
                *extra,
            ]
        )
        == 0
    )
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
    assert (
        branch.main(
            [
                str(tmp / "light.pt"),
                "--config",
                str(folder / "config.json"),
                "--out",
                str(tmp / "light.json"),
                "--data-root",
                str(tmp / "data"),
                "--check",
                str(folder),
                "--power-steps",
                "30",
            ]
        )
        == 0
    )
    light = json.loads((tmp / "light.json").read_text())
    assert light["differences"] == [] and light["evaluations"] == found["evaluations"]
    assert branch.main(["--write-snapshots", str(folder / "checkpoint.pt"), "--out", str(tmp / "snapshots")]) == 0
    assert (
        branch.main(
            [
                "--config",
                str(folder / "config.json"),
                "--out",
                str(tmp / "snapshots.json"),
                "--data-root",
                str(tmp / "data"),
                "--power-steps",
                "30",
                "--snapshots",
                str(tmp / "snapshots" / "snapshot-0003.pt"),
            ]
        )
        == 0
    )
    probed = json.loads((tmp / "snapshots.json").read_text())["probes"]
    assert len(probed) == 1 and {k: v for k, v in probed[0].items() if k not in ("seconds", "moved")} == {
        k: v for k, v in found["probes"][0].items() if k not in ("seconds", "moved")
    }
    changed = _branch(tmp, folder, "beta", "--set", "hp.beta=0.01")
    assert changed["changes"] == ["hp.beta=0.01"] and len(changed["differences"]) >= 1


def test_a_branch_of_a_privacy_cell_probes_the_wrapped_methods_shared_model(tmp_path):
    """A cell with privacy runs its method wrapped (pflbench.simulator.privacy.DifferentiallyPrivate), which
    delegates hooks, not attributes: the branch reads `global_state` (and knows Per-FedAvg) through the
    wrapper, and repeats the stored rounds from the checkpoint, the privacy plan's state included."""
    from pflbench.run.spec import load_spec

    (tmp_path / "spec.yaml").write_text(
        BRANCH_SPEC.replace("hp: {beta: 0.05}}", "hp: {beta: 0.05}, privacy: {epsilon: 8.0, clip: 0.05}}")
    )
    options = RunOptions(
        results=tmp_path / "store",
        data_root=tmp_path / "data",
        use_ray=False,
        checkpoint_every=3,
        keep_checkpoints=True,
    )
    assert run_plan(load_spec(tmp_path / "spec.yaml"), options, Console(file=io.StringIO())).exit_code == 0
    folder = next(f for f in (tmp_path / "store").iterdir() if (f / "summary.json").is_file())
    assert json.loads((folder / "config.json").read_text())["cell"]["privacy"]["epsilon"] == 8.0
    found = _branch(tmp_path, folder, "private", "--power-steps", "2")
    assert found["differences"] == [] and [e["round"] for e in found["evaluations"]] == [4, 6]
    assert [p["round"] for p in found["probes"]] == [3, 4, 5, 6]
    assert all(p["moved"] > 0 for p in found["probes"][1:]) and "delivered_test_accuracy" in found["probes"][0]


def test_the_curvature_probe_finds_the_hessians_top_eigenvalue(branched):
    """Against the exact Hessian of one client's train loss (the synthetic cell's small model, 8,714
    parameters): its two extreme eigenvalues by Lanczos (scipy's eigsh) on exact float64 Hessian-vector
    products of a loss written here, not the probe's batched one. Lanczos gives the dense eigvalsh of the
    whole Hessian to 1e-8 at ~80 products, where building the Hessian (8,714 backward passes) and its
    O(n^3) solve took ~110 s on a loaded 2-core machine."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from scipy.sparse.linalg import LinearOperator, eigsh

    from pflbench.simulator.execution import ExecutionOptions
    from pflbench.simulator.rounds import cell_global_rng

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
            params[n] = vector[at : at + shape.numel()].view(shape)
            at += shape.numel()
        logits = fed.model.forward(params, fed.features[ids][None].to(vector.dtype), train=True)
        return F.cross_entropy(logits[0], fed.labels[ids])

    w = torch.cat([state[n][0].flatten() for n in names])
    vector = w.clone().requires_grad_(True)
    grad = torch.autograd.grad(loss(vector), vector)[0]
    assert float(grad_norm[0]) == pytest.approx(float(grad.norm()), rel=1e-4)
    exact = w.double()

    def hessian_times(v):
        return torch.autograd.functional.hvp(loss, exact, torch.as_tensor(np.ravel(v)))[1].numpy()

    hessian = LinearOperator((len(exact), len(exact)), matvec=hessian_times, dtype=np.float64)
    start = np.random.default_rng(0).standard_normal(len(exact))
    lowest, highest = sorted(eigsh(hessian, k=2, which="BE", v0=start, tol=1e-8, return_eigenvectors=False))
    # power iteration finds the eigenvalue largest in size (here the top one: the loss is convex in the
    # last layer and the rest is flatter)
    assert highest > abs(lowest)
    assert float(top[0]) == pytest.approx(float(highest), rel=0.02)
