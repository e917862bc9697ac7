"""`centralized`: one model trained on the union of the round's clients' data, evaluated per client."""

import torch

from pflbench.simulator.rounds import run_cell, run_round
from cells import federation, small_cell
from pflbench.algorithms.centralized import Centralized


def test_one_model_learns_from_every_clients_data(tmp_path):
    # Two clients with one class each: a model trained on either client alone predicts that class
    # everywhere (accuracy 0 on the other client); only training on the union serves both.
    cell = small_cell(
        algorithm="centralized", partition_params={"classes_per_client": 1}, clients=2, rounds=3, local_epochs=2
    )
    fed = federation(cell, tmp_path)
    labels = [set(fed.labels[fed.splits["train"][c]].tolist()) for c in range(2)]
    assert len(labels[0]) == len(labels[1]) == 1 and labels[0] != labels[1]
    result = run_cell(cell, data_root=tmp_path)
    final = result.metrics[result.metrics["round"] == cell.rounds]
    assert (final["accuracy"] > 0.9).all(), final
    assert result.rounds["bytes_up"].sum() == result.rounds["bytes_down"].sum() == 0


def test_trains_on_the_sampled_clients_data_only_and_every_client_gets_the_same_model(tmp_path):
    cell = small_cell(algorithm="centralized", clients=4)
    fed = federation(cell, tmp_path)
    algorithm = Centralized(fed, Centralized.Hyperparams())
    algorithm.setup()
    seen = []
    train_pooled = fed.train_pooled
    fed.train_pooled = lambda rnd, clients, state, **kw: (
        seen.append(clients.tolist()) or train_pooled(rnd, clients, state, **kw)
    )
    before = {n: t.clone() for n, t in algorithm.global_state.items()}
    run_round(algorithm, 0, torch.tensor([1, 3]))
    assert seen == [[1, 3]]
    assert any(not torch.equal(before[n], algorithm.global_state[n]) for n in before)
    personal = algorithm.personalized()
    for t in personal.values():
        assert all(torch.equal(t[0], t[c]) for c in range(1, 4))
