"""pFedLA's fixed family (`alpha_rule="fixed"`: `self_weight` on the client itself, the rest spread over the
other clients by `spread`): the weights' sums, self-weight and spreads (uniform; by shared labels, against a
hand computation; by validation similarity, reading no test data), that they never move, checkpoint resume,
and the refusals before any work."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cells import small_cell
from checkpoint_helpers import differences, interrupted_and_resumed, uninterrupted
from pflbench.algorithms.pfedla import PFedLA
from pflbench.config import CellConfig, cell_hash
from pflbench.data.partitioning import ClientSplits
from pflbench.run.spec import SpecError, resolve_cell
from pflbench.simulator.federation import Federation
from pflbench.simulator.rounds import prepare_cell, run_cell, run_round

SPREADS = ["uniform", "shared_classes", "validation_similarity"]


def _cell(**overrides) -> CellConfig:
    return small_cell(**{"algorithm": "pfedla", **overrides})


def _fixed(fed: Federation, self_weight: float = 0.5, spread: str = "uniform") -> PFedLA:
    alg = PFedLA(fed, PFedLA.parse_hyperparams({"alpha_rule": "fixed", "self_weight": self_weight, "spread": spread}))
    alg.setup()
    return alg


def _federation(tmp_path, train_classes: list[dict[int, int]], held: int = 20) -> Federation:
    """Client c's train split holds train_classes[c][k] samples of class k; its validation and test splits
    `held` samples each of the same classes (round-robin), none shared between clients or splits."""
    cell = _cell(
        partition="iid", partition_params={}, clients=len(train_classes), dataset_options={"num_samples": 4000}
    )
    dataset, _ = prepare_cell(cell, tmp_path)
    labels = dataset.labels.numpy()
    free = {k: list(np.flatnonzero(labels == k)) for k in range(int(labels.max()) + 1)}
    train, val, test = [], [], []
    for amounts in train_classes:
        train.append([free[k].pop() for k, count in amounts.items() for _ in range(count)])
        classes = list(amounts)
        val.append([free[classes[i % len(classes)]].pop() for i in range(held)])
        test.append([free[classes[i % len(classes)]].pop() for i in range(held)])
    return Federation(cell, dataset, ClientSplits(train, val, test))


def _two_groups(tmp_path) -> Federation:
    """Clients 0-2 hold classes 0-4, clients 3-5 classes 5-9."""
    return _federation(tmp_path, [{k: 24 for k in (range(5) if c < 3 else range(5, 10))} for c in range(6)])


@pytest.mark.parametrize("spread", SPREADS)
@pytest.mark.parametrize("self_weight", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_weights_sum_to_one_per_client_and_layer_with_the_self_weight_as_set(tmp_path, spread, self_weight):
    fed = _two_groups(tmp_path)
    alpha = _fixed(fed, self_weight, spread).all_alphas()  # [N, L, N]
    n, layers = fed.num_clients, alpha.shape[1]
    assert alpha.shape == (n, layers, n) and layers == 3 and (alpha >= 0).all()
    torch.testing.assert_close(alpha.sum(-1), torch.ones(n, layers), rtol=0, atol=1e-6)
    everyone = torch.arange(n)
    assert torch.equal(alpha[everyone, :, everyone], torch.full((n, layers), self_weight))
    assert torch.equal(alpha, alpha[:, :1].expand_as(alpha))  # the same in every layer


@pytest.mark.parametrize("self_weight", [0.25, 0.5, 0.75])
def test_the_uniform_spread_is_exactly_uniform(tmp_path, self_weight):
    fed = _two_groups(tmp_path)
    alpha = _fixed(fed, self_weight, "uniform").all_alphas()
    n = fed.num_clients
    off = ~torch.eye(n, dtype=torch.bool)
    others = alpha.permute(1, 0, 2)[:, off]  # [L, N * (N - 1)]: every weight on another client
    assert torch.equal(others, torch.full_like(others, others[0, 0].item()))
    torch.testing.assert_close(others[0, 0].item(), (1 - self_weight) / (n - 1))


def test_the_shared_classes_spread_follows_the_shared_share_of_labels_by_hand(tmp_path):
    """Train label shares: client 0 (1/2, 1/2, 0, 0), client 1 (3/4, 0, 1/4, 0), client 2 (0, 0, 1, 0), client 3
    (0, 0, 0, 1). Shared share sum_c min: 0-1 1/2, 0-2 0, 1-2 1/4, 3 with anyone 0. Self-weight 1/2, the other
    half in proportion; client 3 shares no label, so it keeps all of its weight."""
    fed = _federation(tmp_path, [{0: 4, 1: 4}, {0: 6, 2: 2}, {2: 8}, {3: 8}])
    alpha = _fixed(fed, 0.5, "shared_classes").all_alphas()
    expected = torch.tensor(
        [
            [1 / 2, 1 / 2, 0, 0],
            [1 / 2 * (1 / 2) / (3 / 4), 1 / 2, 1 / 2 * (1 / 4) / (3 / 4), 0],
            [0, 1 / 2, 1 / 2, 0],
            [0, 0, 0, 1],
        ]
    )
    torch.testing.assert_close(alpha, expected[:, None, :].expand_as(alpha), rtol=0, atol=1e-7)


def test_the_validation_similarity_spread_reads_no_test_data_and_finds_the_groups(tmp_path):
    """Poisoning every test sample (inputs and labels) changes nothing; poisoning the validation split
    does. On two groups of clients with disjoint classes, a client weighs its own group's clients above
    the other group's."""
    fed = _two_groups(tmp_path)
    alpha = _fixed(fed, 0.25, "validation_similarity").all_alphas()
    n = fed.num_clients
    same = torch.tensor([[i // 3 == j // 3 and i != j for j in range(n)] for i in range(n)])
    cross = torch.tensor([[i // 3 != j // 3 for j in range(n)] for i in range(n)])
    first = alpha[:, 0]
    assert (first[same].view(n, 2).amin(1) > first[cross].view(n, 3).amax(1)).all()

    def poisoned(split: str) -> torch.Tensor:
        fed = _two_groups(tmp_path)
        ids = torch.as_tensor(np.concatenate(fed.splits[split]))
        gen = torch.Generator().manual_seed(1)
        fed.features[ids] = 100 * torch.randn(fed.features[ids].shape, generator=gen)
        fed.labels[ids] = (fed.labels[ids] + 5) % 10
        return _fixed(fed, 0.25, "validation_similarity").all_alphas()

    assert torch.equal(poisoned("test"), alpha)
    assert not torch.allclose(poisoned("val"), alpha, atol=1e-3)


@pytest.mark.parametrize("spread", SPREADS)
def test_fixed_weights_never_move_while_the_server_copies_take_the_updates(tmp_path, spread):
    fed = _two_groups(tmp_path)
    alg = _fixed(fed, 0.5, spread)
    alpha, net = alg.all_alphas().clone(), {k: t.detach().clone() for k, t in alg.hypernet.items()}
    copies = {p: t.clone() for p, t in alg.server_params.items()}
    for rnd in (1, 2, 3):
        run_round(alg, rnd, torch.arange(fed.num_clients))
    assert torch.equal(alg.all_alphas(), alpha)
    assert all(torch.equal(alg.hypernet[k], net[k]) for k in net)
    assert all(not torch.equal(copies[p], alg.server_params[p]) for p in copies)


def test_half_on_self_and_shared_classes_on_a_split_of_equal_class_amounts_is_the_shared_classes_reference(tmp_path):
    """Where every client holds equal amounts of the same number of classes (as `pathological` splits do), the
    shared share of labels is proportional to the number of classes shared: the `shared_classes` rule's
    weights (client 4 shares none: all of its weight on itself under both)."""
    fed = _federation(tmp_path, [{0: 6, 1: 6}, {1: 6, 2: 6}, {2: 6, 3: 6}, {0: 6, 3: 6}, {4: 6, 5: 6}])
    reference = PFedLA(fed, PFedLA.parse_hyperparams({"alpha_rule": "shared_classes"}))
    reference.setup()
    torch.testing.assert_close(_fixed(fed, 0.5, "shared_classes").all_alphas(), reference.all_alphas())


@pytest.mark.parametrize("spread", ["shared_classes", "validation_similarity"])
def test_a_fixed_cell_resumes_bit_identical(tmp_path, spread):
    cell = _cell(rounds=4, eval_every=2, hp={"alpha_rule": "fixed", "self_weight": 0.25, "spread": spread})
    full = uninterrupted(cell, tmp_path)
    resumed, notes = interrupted_and_resumed(cell, tmp_path / "store" / "cell", tmp_path, at=2)
    assert notes == ["resumed at round 2 of 4"] and full.status == "finished"
    assert differences(full, resumed) == []
    weights = full.artifacts["alpha_round00004"]
    assert np.allclose(weights.sum(-1), 1, atol=1e-6) and np.all(weights[np.arange(5), :, np.arange(5)] == 0.25)


def test_a_validation_similarity_cell_without_a_validation_split_is_refused_before_any_work():
    fixed = {"alpha_rule": "fixed", "spread": "validation_similarity"}
    with pytest.raises(
        SpecError,
        match="hp.spread 'validation_similarity' weighs the other clients on each client's validation split, but val_fraction is 0; give val_fraction > 0",
    ) as err:
        resolve_cell({"algorithm": "pfedla", "dataset": "synthetic", "val_fraction": 0.0, "hp": fixed})
    assert len(str(err.value).splitlines()) == 1
    with pytest.raises(ValueError, match="but val_fraction is 0"):
        PFedLA.check_cell(_cell(val_fraction=0.0, hp=fixed))
    PFedLA.check_cell(_cell(val_fraction=0.1, hp=fixed))
    for spread in ("uniform", "shared_classes"):  # these read no validation split
        PFedLA.check_cell(_cell(val_fraction=0.0, hp={**fixed, "spread": spread}))


def test_the_fixed_settings_without_the_fixed_rule_are_refused():
    for hp in ({"self_weight": 0.25}, {"alpha_rule": "shared_classes", "spread": "shared_classes"}):
        with pytest.raises(SpecError, match="hp.self_weight and hp.spread set the weights of alpha_rule 'fixed'"):
            resolve_cell({"algorithm": "pfedla", "dataset": "synthetic", "hp": hp})


def test_the_new_settings_leave_every_earlier_cell_id_alone():
    """Every published pFedLA and HeurpFedLA cell (its stored config has no self_weight or spread) still hashes
    to its id; today's resolution of a cell at the defaults hashes as it did without the two fields; a fixed
    cell has an id of its own."""
    published = [
        path
        for path in sorted(Path(__file__).parents[1].glob("results/published/*/*/config.json"))
        if json.loads(path.read_text())["cell"]["algorithm"] in ("pfedla", "heurpfedla")
    ]
    assert len(published) >= 50
    for path in published:
        stored = json.loads(path.read_text())
        assert "spread" not in stored["cell"]["hp"]
        assert cell_hash(CellConfig.stored(stored["cell"])) == stored["hash"] == path.parent.name
    today = resolve_cell({"algorithm": "pfedla", "dataset": "synthetic", "hp": {"alpha_rule": "shared_classes"}})
    assert today.hp["self_weight"] == 0.5 and today.hp["spread"] == "uniform"
    data = today.model_dump(mode="json")
    before = {**data, "hp": {k: v for k, v in data["hp"].items() if k not in ("self_weight", "spread")}}
    assert cell_hash(CellConfig.stored(before)) == cell_hash(today)
    fixed = resolve_cell({"algorithm": "pfedla", "dataset": "synthetic", "hp": {"alpha_rule": "fixed"}})
    assert cell_hash(fixed) != cell_hash(resolve_cell({"algorithm": "pfedla", "dataset": "synthetic"}))


def test_a_fixed_cell_runs_end_to_end_on_the_batched_path(tmp_path):
    from pflbench.simulator.execution import ExecutionOptions

    cell = _cell(
        rounds=2, eval_every=1, hp={"alpha_rule": "fixed", "self_weight": 0.75, "spread": "validation_similarity"}
    )
    result = run_cell(cell, data_root=tmp_path, execution=ExecutionOptions(client_batching="on"))
    assert result.status == "finished" and result.summary["client_batching"] == "batched"
    assert np.array_equal(result.artifacts["alpha_round00001"], result.artifacts["alpha_round00002"])


def test_the_question_specs_share_their_cells_with_the_published_columns():
    """The fixed family's 600-round spec, the moving-alpha and logit-bound specs and the 175-sample Local spec
    differ from the published Table 1-2 cells only in what they vary: set back, they give the published ids;
    the grid's nine fixed cells are those of the 600-round spec's variants at the grid's settings."""
    from pflbench.run.spec import load_spec
    from pflbench.run.spec_axes import parse_sets

    benchmarks = Path(__file__).parents[1] / "benchmarks"

    def ids(spec: str, *sets: str) -> list[str]:
        return [cell_hash(c) for c in load_spec(benchmarks / spec, parse_sets(list(sets))).cells]

    table2 = ("dataset=fmnist", "clients=10", "seed=0", "resources.gpus=0")
    assert ids("table2.yaml", *table2, "algorithm=pfedla") == ["5fc5d2675474"]  # table2-full's pFedLA
    fixed = ids("table2-full-pfedla-fixed.yaml")
    assert len(fixed) == 9
    assert (
        fixed[4]
        == ids(
            "table2.yaml",
            *table2,
            "algorithm=pfedla",
            "hp.alpha_rule=fixed",
            "hp.self_weight=0.5",
            "hp.spread=shared_classes",
        )[0]
    )
    assert ids("table2-full-pfedla-moving.yaml", "hp.hn_lr=0.01") == ["f3a229b3d8b0"]  # the alive Table 2 cell
    assert ids("table1-2-full-pfedla-bounds.yaml", "hp.logit_bound=2.0") == ["0ea69107428e", "f3a229b3d8b0"]
    for variant, share in (("175 samples, share 0.3", 0.3), ("175 samples, share 0.45", 0.45)):
        assert ids("table2-full-175-local.yaml", f"variant={variant}") == ids(
            "table2.yaml",
            *table2,
            "algorithm=local",
            "partition_params.samples_per_client=175",
            f"partition_params.dominant_share={share}",
        )
    grid = load_spec(benchmarks / "table2-pfedla-fixed-grid.yaml").cells
    full = load_spec(benchmarks / "table2-full-pfedla-fixed.yaml").cells
    assert [c.hp for c in grid[:9]] == [c.hp for c in full]
    assert {(c.rounds, c.val_fraction, c.finetune_epochs) for c in grid} == {(150, 0.1, 0)}
    assert [c.algorithm for c in grid[9:]] == ["fedavg", "pfedla"] and grid[10].hp["alpha_rule"] == "learned"
