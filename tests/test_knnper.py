"""kNN-Per (pflbench/algorithms/knnper.py): its kNN outputs and interpolated accuracy against the official
code's lines (faiss datastore) on the same tensors (tests/fixtures/official/knnper/: the generator names
the repository and commit); lambda chosen on the validation split, never on the test split; training
exactly FedAvg's."""

from pathlib import Path

import torch

from cells import small_cell
import pytest

from pflbench.algorithms.knnper import KNNPer, knn_probabilities
from pflbench.simulator.rounds import run_cell

FIXTURE = torch.load(Path(__file__).parent / "fixtures" / "official" / "knnper" / "knnper.pt")


def test_knn_outputs_and_interpolated_accuracy_match_the_official_code():
    f = FIXTURE
    knn = knn_probabilities(f["test_features"], f["train_features"], f["train_labels"], 4, f["k"], 1.0)
    torch.testing.assert_close(knn, f["knn_outputs"], rtol=1e-5, atol=1e-6)
    probabilities = torch.softmax(f["logits"], 1)
    for weight, reference in zip(f["weights"].tolist(), f["accuracy"].tolist()):
        mixed = weight * knn + (1 - weight) * probabilities
        assert (mixed.argmax(1) == f["test_labels"]).sum().item() == round(reference * len(f["test_labels"]))


def test_lambda_is_chosen_on_validation_and_training_is_fedavgs(tmp_path):
    cell = small_cell(algorithm="knn-per", rounds=2)
    knn, fedavg = run_cell(cell, data_root=tmp_path), run_cell(small_cell(rounds=2), data_root=tmp_path)
    assert knn.status == "finished"
    assert knn.rounds["bytes_up"].equals(fedavg.rounds["bytes_up"])
    # lambda 0 is the global model: FedAvg's scores exactly
    zero = run_cell(small_cell(algorithm="knn-per", rounds=2, hp={"weight": 0.0}), data_root=tmp_path)
    torch.testing.assert_close(
        torch.tensor(zero.metrics["accuracy"].to_numpy()), torch.tensor(fedavg.metrics["accuracy"].to_numpy())
    )
    # the memory helps on pathological splits (3 classes per client)
    assert knn.metrics["accuracy"].mean() > fedavg.metrics["accuracy"].mean()


def test_a_cell_without_a_validation_split_must_fix_lambda():
    with pytest.raises(ValueError, match="chooses each client's lambda on its validation split, but val_fraction is 0"):
        KNNPer.check_cell(small_cell(algorithm="knn-per", val_fraction=0.0))
    KNNPer.check_cell(small_cell(algorithm="knn-per", val_fraction=0.0, hp={"weight": 0.5}))
