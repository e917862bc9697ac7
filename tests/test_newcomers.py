"""Unseen clients (`unseen_fraction`, pflbench/newcomers/): newcomers never take part in training,
every algorithm serves them a model or is refused before any work, and the knob at 0 changes nothing."""

import dataclasses

import numpy as np
import pytest
import torch

from pflbench.algorithm import ALGORITHMS, get_algorithm
from pflbench.config import CellConfig, cell_hash
from pflbench.simulator.federation import Federation
from pflbench.simulator.metrics import METRIC_COLUMNS, protocol_summary
from pflbench.simulator.rounds import prepare_cell, run_cell, run_rounds
from pflbench.serving import Serving
from pflbench.simulator.metrics import trained_rows
from pflbench.newcomers import newcomer_ids
from pflbench.run.spec import parse_spec
from pflbench.run.spec_problems import SpecError

get_algorithm("fedavg")  # registers the built-in algorithms
SERVED = sorted(name for name, cls in ALGORITHMS.items() if not cls.capabilities.newcomers)
REFUSED = sorted(name for name, cls in ALGORITHMS.items() if cls.capabilities.newcomers)
# Small local work and models for the slow methods, so the whole registry runs in a few seconds.
MH = {"hidden_dim": 4, "embedding_dim": 8, "server_updates": "per_round"}
QUICK_HP = {
    "pfedhn": {"inner_steps": 2},
    "pfedhn-pc": {"inner_steps": 2},
    "fedrep": {"head_epochs": 1},
    "fedbabu": {"finetune_epochs": 1},
    "mh-pfedhn": MH,
    "mh-pfedhngd": MH,
    "fedmn": {"dims": [16, 8], "encoder_hidden": 16, "router_x_dim": 8, "router_y_dim": 8, "router_samples": 16},
}


def _cell(**overrides) -> CellConfig:
    base = dict(
        algorithm="fedavg",
        dataset="synthetic",
        dataset_options={"num_samples": 600},
        partition="pathological",
        partition_params={"classes_per_client": 3},
        clients=10,
        rounds=3,
        local_epochs=1,
        batch_size=16,
        lr=0.05,
        seed=3,
        unseen_fraction=0.3,
    )
    return CellConfig(**{**base, **overrides})


def test_newcomers_are_drawn_from_the_seed_alone():
    ids = newcomer_ids(0.3, 10, seed=3)
    assert len(ids) == 3 and np.array_equal(ids, newcomer_ids(0.3, 10, seed=3))
    assert not np.array_equal(ids, newcomer_ids(0.3, 10, seed=4))  # another seed, another draw (here)
    assert len(newcomer_ids(0.0, 10, seed=3)) == 0


def test_newcomers_are_never_sampled_and_keep_their_partition_ids(tmp_path):
    cell = _cell(participation=0.5, rounds=6)
    fed = Federation(cell, *prepare_cell(cell, tmp_path))
    held = newcomer_ids(cell.unseen_fraction, cell.clients, cell.seed)
    assert fed.newcomers.client_ids.tolist() == held.tolist()
    assert sorted([*fed.client_ids.tolist(), *held.tolist()]) == list(range(cell.clients))
    sampled = set(fed.client_ids[fed.schedule].flatten().tolist())
    assert sampled and not sampled & set(held.tolist())
    assert fed.schedule.shape[1] == round(0.5 * 7)  # participation applies to the 7 trained clients
    # What the algorithm's hooks see: positions of trained clients only.
    seen_by_hooks = []
    algorithm = get_algorithm("fedavg")(fed, get_algorithm("fedavg").parse_hyperparams({}))
    configure = algorithm.configure
    algorithm.configure = lambda rnd: seen_by_hooks.extend(fed.client_ids[rnd.clients.numpy()]) or configure(rnd)
    result = run_rounds(fed, algorithm)
    assert seen_by_hooks and not set(seen_by_hooks) & set(held.tolist())
    newcomer_rows = result.metrics[result.metrics["newcomer"]]
    assert sorted(set(newcomer_rows["client"])) == held.tolist()
    assert (newcomer_rows[["bytes_down", "bytes_up"]] == 0).all().all()
    assert sorted(set(trained_rows(result.metrics)["client"])) == fed.client_ids.tolist()


# That newcomers' data cannot change training, down to their raw pixels before normalisation, for
# every family of algorithm: tests/test_isolation.py.


@pytest.mark.parametrize("name", SERVED)
def test_every_algorithm_serves_newcomers(name, tmp_path):
    cell = _cell(
        algorithm=name, rounds=2, clients=6, unseen_fraction=0.34, hp=QUICK_HP.get(name, {}), finetune_epochs=1
    )
    result = run_cell(cell, data_root=tmp_path)
    assert result.status == "finished"
    newcomers = result.metrics[result.metrics["newcomer"]]
    assert len(newcomers) == 2 * 2 and newcomers["accuracy"].between(0, 1).all()
    assert 0 <= result.summary["final_accuracy_newcomers"] <= 1
    assert 0 <= result.summary["final_accuracy_adapted_newcomers"] <= 1
    assert "bestval_accuracy_newcomers" in result.summary and result.summary["newcomers"] == sorted(
        set(newcomers["client"])
    )


def test_an_algorithm_that_cannot_serve_newcomers_is_refused_before_any_work(tmp_path, monkeypatch):
    """Every built-in algorithm serves newcomers today (REFUSED is empty); the refusal path is
    exercised on FedAvg marked as refusing."""
    assert REFUSED == []
    fedavg = ALGORITHMS.get("fedavg")
    monkeypatch.setattr(
        fedavg, "capabilities", dataclasses.replace(fedavg.capabilities, newcomers="no newcomer model (test)")
    )
    with pytest.raises(
        ValueError, match="unseen_fraction: algorithm 'fedavg' cannot give unseen clients a model: no newcomer model"
    ):
        run_cell(_cell(), data_root=tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()  # refused before the dataset was even prepared
    with pytest.raises(SpecError, match="cannot give unseen clients a model"):
        parse_spec(
            {
                "name": "x",
                "matrix": {"algorithm": ["fedavg"], "dataset": ["synthetic"]},
                "defaults": {"unseen_fraction": 0.3},
            }
        )


def test_mh_pfedhn_refuses_newcomers_whose_architecture_nobody_trains(tmp_path):
    """hetero5 over 5 clients gives each client its own architecture: a newcomer's has no trained
    embedding to start from, so the cell is refused before any work."""
    cell = _cell(algorithm="mh-pfedhn", model="hetero5", clients=5, unseen_fraction=0.2)
    with pytest.raises(ValueError, match="every client with architecture .* is a newcomer"):
        run_cell(cell, data_root=tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()


def test_pfedhn_newcomer_fits_its_embedding_with_the_hypernetwork_frozen(tmp_path):
    cell = _cell(algorithm="pfedhn", rounds=3, hp={"inner_steps": 5})
    fed = Federation(cell, *prepare_cell(cell, tmp_path))
    algorithm = get_algorithm("pfedhn")(fed, get_algorithm("pfedhn").parse_hyperparams(cell.hp))
    run_rounds(fed, algorithm)
    before = {n: p.detach().clone() for n, p in algorithm.hypernet.named_parameters()}
    models = algorithm.newcomer_models(Serving(cell.rounds, fed.newcomers, newcomers=True))
    assert all(torch.equal(before[n], p) for n, p in algorithm.hypernet.named_parameters())  # table too
    start = before["embedding"].mean(0)
    moved = (algorithm.newcomer_embeddings - start).norm(dim=1)
    assert (moved > 1e-4).all()  # every newcomer's embedding was fitted
    with torch.no_grad():
        generated = algorithm.hypernet.generate(algorithm.newcomer_embeddings)
    assert all(torch.equal(models[n], generated[n]) for n in generated)
    _, fitted = fed.newcomers.evaluate(models, "train")
    with torch.no_grad():
        mean_model = {**models, **algorithm.hypernet.generate(start.repeat(fed.newcomers.num_clients, 1))}
    _, unfitted = fed.newcomers.evaluate(mean_model, "train")
    assert (fitted < unfitted).all()  # the fitted embedding lowers each newcomer's train loss


def test_newcomer_rows_leave_the_trained_clients_summaries_alone(tmp_path):
    result = run_cell(_cell(finetune_epochs=1), data_root=tmp_path)
    trained = trained_rows(result.metrics)
    expected = protocol_summary(trained, "")
    assert {k: result.summary[k] for k in expected} == expected
    assert result.summary["final_accuracy_newcomers"] == pytest.approx(
        result.metrics[result.metrics["newcomer"] & (result.metrics["round"] == 3)]["accuracy"].mean()
    )
    assert "final_accuracy_adapted_newcomers" in result.summary


def test_off_leaves_cells_and_metrics_as_they_were(tmp_path):
    explicit, omitted = (
        _cell(unseen_fraction=0.0),
        _cell(unseen_fraction=0.3).model_copy(update={"unseen_fraction": 0.0}),
    )
    assert "unseen_fraction" not in explicit.canonical_json() and cell_hash(explicit) == cell_hash(omitted)
    result = run_cell(explicit, data_root=tmp_path)
    assert list(result.metrics.columns) == METRIC_COLUMNS  # no newcomer column, no newcomer rows
    assert sorted(set(result.metrics["client"])) == list(range(explicit.clients))
    assert not any("newcomer" in key for key in result.summary)


@pytest.mark.parametrize("fraction, message", [(0.01, "holds out no client"), (0.96, "at least one client must train")])
def test_a_fraction_that_holds_out_nobody_or_everybody_is_refused(fraction, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(
            {
                "name": "x",
                "matrix": {"algorithm": ["fedavg"], "dataset": ["synthetic"], "clients": [10]},
                "defaults": {"unseen_fraction": fraction},
            }
        )


def test_mh_pfedhn_newcomer_fits_a_new_embedding_matrix_with_the_hypernetwork_frozen(tmp_path):
    cell = _cell(algorithm="mh-pfedhn", rounds=1, hp=MH)
    fed = Federation(cell, *prepare_cell(cell, tmp_path))
    algorithm = get_algorithm("mh-pfedhn")(fed, get_algorithm("mh-pfedhn").parse_hyperparams(cell.hp))
    run_rounds(fed, algorithm)
    before = {n: p.detach().clone() for n, p in algorithm.hnet.named_parameters()}
    models = algorithm.newcomer_models(Serving(cell.rounds, fed.newcomers, newcomers=True))
    assert all(torch.equal(before[n], p) for n, p in algorithm.hnet.named_parameters())
    size = fed.model.numel(fed.model.param_names)
    start = torch.stack([e.detach() for e in algorithm.hnet.embeddings[: fed.num_clients]]).mean(0)
    with torch.no_grad():
        unfitted = algorithm.hnet.generate(start, size)
    flat = torch.cat([models[n].flatten(1) for n in fed.model.param_names], dim=1)
    assert flat.shape == (fed.newcomers.num_clients, size) and (flat != unfitted).any(dim=1).all()


def test_reports_show_newcomers_in_their_own_column_and_keep_curves_to_trained_clients(tmp_path):
    from pflbench.reports.cells import load_cells, read_metrics
    from pflbench.reports.tables import communication_tables
    from pflbench.reports.text import markdown_comm_table
    from pflbench.storage.store import Store

    store = Store(tmp_path / "results")
    with_newcomers, without = _cell(rounds=2), _cell(rounds=2, algorithm="local", unseen_fraction=0.0)
    folder = store.write(with_newcomers, run_cell(with_newcomers, data_root=tmp_path))
    store.write(without, run_cell(without, data_root=tmp_path))
    assert "newcomer" not in read_metrics(folder) or not read_metrics(folder)["newcomer"].any()
    assert sorted(set(read_metrics(folder)["client"])) == sorted(
        set(range(10)) - set(newcomer_ids(0.3, 10, 3).tolist())
    )
    (table,) = communication_tables(load_cells(tmp_path / "results"))
    newcomers = {row.algorithm: entry for row, entry in ((r, table.newcomers.get(r.key)) for r, _ in table.rows)}
    assert newcomers["local"] is None and newcomers["fedavg"].values
    assert "newcomers accuracy (%)" in markdown_comm_table(table) and "newcomers" in table.caption
