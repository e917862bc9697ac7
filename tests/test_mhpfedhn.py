"""MH-pFedHN / MH-pFedHNGD: five architectures end to end, exact generated sizes, heads shared by
chunk count, the hypernetwork update rule, and the distillation loss."""

import math

import pytest
import torch

from pflbench.algorithms.mhpfedhn import MHpFedHN, MHpFedHNGD, MultiHeadHypernetwork, distillation, hypernetwork_step
from pflbench.config import CellConfig
from pflbench.simulator.federation import Federation
from pflbench.simulator.rounds import prepare_cell, run_cell


def _cell(**overrides):
    base = dict(
        algorithm="mh-pfedhn",
        dataset="synthetic-images",
        dataset_options={"num_samples": 200, "channels": 3, "size": 32},
        partition="pathological",
        partition_params={"classes_per_client": 3},
        clients=5,
        rounds=1,
        batch_size=16,
        lr=0.05,
        seed=0,
        model="hetero5",
        hp={"hidden_dim": 4, "embedding_dim": 8, "server_updates": "per_round"},
    )
    return CellConfig(**{**base, **overrides})


def _algorithm(cell, tmp_path):
    fed = Federation(cell, *prepare_cell(cell, tmp_path))
    alg = MHpFedHN(fed, MHpFedHN.parse_hyperparams(cell.hp))
    alg.setup()
    return fed, alg


def test_five_architectures_run_end_to_end_with_exact_sizes(tmp_path):
    result = run_cell(_cell(), data_root=tmp_path)
    assert result.status == "finished", result.error
    last = result.metrics[result.metrics["round"] == 1]
    assert len(last) == 5 and last["accuracy"].notna().all()
    # Each client downloads its generated vector and uploads its update: 4 bytes per parameter.
    counts = [234_006, 268_814, 347_178, 523_242, 565_386]  # one client per architecture
    assert last["bytes_down"].tolist() == [4 * k for k in counts]
    assert last["bytes_up"].tolist() == [4 * k for k in counts]
    assert result.artifacts["heads_round00001"].tolist() == [math.ceil(k / 3072) for k in counts]


def test_every_generated_vector_has_exactly_its_clients_parameter_count(tmp_path):
    fed, alg = _algorithm(_cell(clients=7), tmp_path)
    for c in range(fed.num_clients):
        model = fed.models[int(fed.group_of[c])]
        theta = alg.hnet(c)
        assert theta.shape == (model.numel(model.param_names),)
        assert alg.hnet.embeddings[c].shape[0] == math.ceil(theta.numel() / 3072)
    personal = alg.personalized()
    for g, state in enumerate(personal):
        assert set(state) == set(fed.models[g].names)


def test_clients_share_a_head_exactly_when_their_chunk_counts_are_equal(tmp_path):
    # chunk 300000: CNN (234,006) and VGG8 (268,814) need 1 chunk, the three ResNets 2.
    fed, alg = _algorithm(_cell(hp={"hidden_dim": 4, "chunk_size": 300_000}), tmp_path)
    keys = [alg.hnet.head_key(c) for c in range(5)]
    assert keys == [1, 1, 2, 2, 2] and sorted(alg.hnet.heads) == ["1", "2"]
    before = [alg.hnet(c).detach() for c in range(5)]
    with torch.no_grad():
        alg.hnet.heads["2"][1].add_(1.0)  # move the ResNets' head only
    after = [alg.hnet(c).detach() for c in range(5)]
    assert [not torch.equal(b, a) for b, a in zip(before, after)] == [False, False, True, True, True]
    # With the official chunk size, five sizes -> five heads.
    fed, alg = _algorithm(_cell(), tmp_path)
    assert len({alg.hnet.head_key(c) for c in range(5)}) == len(alg.hnet.heads) == 5


def test_hypernetwork_update_lowers_the_clients_loss_on_a_toy_problem():
    torch.manual_seed(0)
    sizes = [40, 7000]  # 1 and 3 chunks of 3072
    hnet = MultiHeadHypernetwork(sizes, embedding_dim=8, hidden_dim=16, hidden_layers=2)
    targets = [torch.randn(k) * 0.1 for k in sizes]
    optimizer = torch.optim.Adam(hnet.parameters(), lr=1e-2)

    def loss():
        with torch.no_grad():
            return sum(0.5 * ((hnet(i) - t) ** 2).sum() for i, t in enumerate(targets)).item()

    start = loss()
    for _ in range(40):
        generated = [hnet(i) for i in range(len(sizes))]
        # A client's local step on 0.5 ||theta - t||^2 with lr 0.1: delta = theta - theta' = 0.1 (theta - t).
        deltas = [0.1 * (g.detach() - t) for g, t in zip(generated, targets)]
        hypernetwork_step(hnet, optimizer, generated, deltas, clip=50.0)
    assert loss() < 0.2 * start


def test_distillation_loss_limits():
    logits = torch.randn(2, 5, 4)
    labels = torch.randint(0, 4, (2, 5))
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(2, 5).mean(1)
    same = torch.cat([labels[..., None].float(), logits], dim=-1)  # teacher == student
    other = torch.cat([labels[..., None].float(), torch.randn(2, 5, 4)], dim=-1)
    assert torch.allclose(distillation(0.0, 15.0)(logits, other, {}, {}), ce)
    assert torch.allclose(distillation(0.3, 15.0)(logits, same, {}, {}), 0.7 * ce, atol=1e-6)
    assert (distillation(1.0, 2.0)(logits, other, {}, {}) > 0).all()


@pytest.mark.parametrize("updates", ["per_client", "per_round"])
def test_gd_variant_sends_the_global_model_and_runs(tmp_path, updates):
    cell = _cell(
        algorithm="mh-pfedhngd",
        model="mh-cnn,resnet10",
        clients=4,
        hp={"hidden_dim": 4, "embedding_dim": 8, "server_updates": updates},
    )
    result = run_cell(cell, data_root=tmp_path)
    assert result.status == "finished", result.error
    cnn, resnet = 234_006, 347_178
    assert result.metrics["bytes_down"].tolist() == [4 * (cnn + cnn)] * 2 + [4 * (resnet + cnn)] * 2
    assert result.metrics["bytes_up"].tolist() == result.metrics["bytes_down"].tolist()


def test_gd_global_model_is_the_smallest_architecture_and_shares_its_head(tmp_path):
    cell = _cell(algorithm="mh-pfedhngd", model="resnet10,mh-cnn", clients=4)
    fed = Federation(cell, *prepare_cell(cell, tmp_path))
    alg = MHpFedHNGD(fed, MHpFedHNGD.parse_hyperparams(cell.hp))
    alg.setup()
    assert alg.global_model.numel(alg.global_model.param_names) == 234_006  # the CNN, not ResNet10
    global_index = fed.num_clients  # the extra embedding
    assert alg.hnet.head_key(global_index) == alg.hnet.head_key(2) != alg.hnet.head_key(0)
