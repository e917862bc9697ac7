"""The explicit round (issue 44): every hook of a round receives the round's context, one frozen
`Round`; what crosses the network has one type, a `Payload` (per-client tensors with their byte
count; uploads lost to dropout are part of it); the evaluation hooks receive whom they serve
(`Serving`), the newcomers through their own; nothing of it lives in a field another hook sets."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from cells import federation as make_federation, received, small_cell
from pflbench.simulator import rounds
from pflbench.algorithm import ALGORITHMS, ClientRound, Payload, Round, Scored, Serving
from pflbench.simulator.rounds import run_cell, run_round
from pflbench.simulator.system import SystemParams, SystemPlan

ROOT = Path(__file__).resolve().parents[1]
FedAvg = ALGORITHMS.get("fedavg")
STRAGGLERS = {"stragglers": 0.4, "straggler_work": 0.3}


# ---- the round's context --------------------------------------------------------------------------------
def test_every_hook_of_a_round_receives_one_frozen_round_with_the_download_once_configured(tmp_path):
    fed = make_federation(small_cell(participation=0.6, system={**STRAGGLERS, "dropout": 0.3}), tmp_path)
    seen = []

    class Spy(FedAvg):
        def configure(self, rnd):
            seen.append(("configure", rnd))
            return super().configure(rnd)

        def receive(self, rnd, download):
            seen.append(("receive", rnd, download))
            return super().receive(rnd, download)

        def local_train(self, rnd, state):
            seen.append(("local_train", rnd))
            return super().local_train(rnd, state)

        def send(self, rnd, state):
            seen.append(("send", rnd))
            return super().send(rnd, state)

        def aggregate(self, rnd, upload):
            seen.append(("aggregate", rnd, upload))
            return super().aggregate(rnd, upload)

    alg = Spy(fed, Spy.parse_hyperparams({}))
    alg.setup()
    clients = torch.as_tensor(fed.schedule[0])
    download, upload = run_round(alg, 1, clients)
    hooks = [entry[0] for entry in seen]
    assert hooks[:4] == ["configure", "receive", "local_train", "send"]
    configured, later = seen[0][1], [entry[1] for entry in seen[1:]]
    assert configured.download is None and all(r.download is download for r in later)
    # the client side's round: a ClientRound, whose download is always there; configure's is a plain Round
    assert not isinstance(configured, ClientRound) and all(isinstance(r, ClientRound) for r in later)
    assert all(r.number == 1 and torch.equal(r.clients, clients) for r in [configured, *later])
    assert seen[1][2] is download  # receive's download is the round's
    plan = SystemPlan(SystemParams(**fed.cell.system), fed.cell.clients, fed.cell.rounds, fed.cell.seed)
    assert list(configured.work) == plan.work[0, fed.client_ids].tolist()  # every client's share this round
    with pytest.raises(dataclasses.FrozenInstanceError):
        configured.number = 2
    if "aggregate" in hooks:  # what arrived: the upload's own rows, their places among the round's clients
        arrived = seen[-1][2]
        assert torch.equal(arrived.clients, clients[arrived.positions]) and arrived.lost is None
        assert torch.equal(upload.arrived().clients, arrived.clients)


def test_a_hook_called_alone_with_the_round_does_what_it_does_in_the_engine(tmp_path):
    """No hidden state: local training is cut to the stragglers' share because it is given the Round,
    not because the engine set a field on the Federation (there is none to set)."""
    fed = make_federation(small_cell(participation=1.0, local_epochs=2, system=STRAGGLERS), tmp_path)
    assert not hasattr(fed, "local_round")
    clients = torch.arange(fed.num_clients)
    trained = {}

    class Keeps(FedAvg):
        def local_train(self, rnd, state):
            trained["engine"] = super().local_train(rnd, state)
            return trained["engine"]

    run_round(_setup(Keeps, fed), 1, clients)
    alone = _setup(FedAvg, fed)
    rnd, state = received(alone, 1, clients)
    trained["alone"] = alone.local_train(rnd, state)
    assert all(torch.equal(trained["engine"][n], trained["alone"][n]) for n in fed.model.names)
    steps = [len(p) for p in fed.local_plans(rnd, clients)]
    full = [len(p) for p in fed.local_plans(rnd.number, clients)]  # a round number: nothing is cut
    assert steps != full and all(s <= f for s, f in zip(steps, full))
    uncut = fed.train(rnd.number, clients, state).state
    assert not all(torch.equal(uncut[n], trained["alone"][n]) for n in fed.model.param_names)


def _setup(cls, fed):
    alg = cls(fed, cls.parse_hyperparams({}))
    alg.setup()
    return alg


# ---- one type for what crosses the network -----------------------------------------------------------------
def test_a_payload_reads_stacked_or_per_client_and_counts_each_clients_bytes():
    clients = torch.tensor([3, 5, 8])
    stacked = Payload.from_state({"w": torch.arange(6.0).view(3, 2), "n": torch.zeros(3, dtype=torch.long)}, clients)
    assert stacked.is_stacked and len(stacked) == 3 and stacked.nbytes.tolist() == [8 + 8] * 3
    assert torch.equal(stacked.row(1)["w"], torch.tensor([2.0, 3.0])) and len(stacked.rows) == 3
    rows = Payload.from_rows(
        [{"a": torch.ones(2)}, {"a": torch.ones(2), "b": torch.ones(3, dtype=torch.float64)}, {}], clients
    )
    assert not rows.is_stacked and rows.nbytes.tolist() == [8, 8 + 24, 0]
    with pytest.raises(ValueError, match="different tensors per client"):
        _ = rows.state
    same = Payload.from_rows([{"a": torch.full((2,), float(k))} for k in range(3)], clients, stacked=True)
    assert torch.equal(same.state["a"], torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]))
    assert Payload.empty(clients).nbytes.tolist() == [0, 0, 0] and Payload.empty(clients).state == {}
    with pytest.raises(ValueError, match="one row each"):
        Payload.from_rows([{}], clients)


def test_lost_uploads_are_part_of_the_payload_and_only_the_arrived_ones_reach_the_server():
    clients = torch.tensor([3, 5, 8])
    upload = Payload.from_state({"w": torch.arange(6.0).view(3, 2)}, clients, header={"ids": torch.tensor([7, 8, 9])})
    assert upload.delivered(None) is upload and upload.arrived() is upload
    assert upload.positions.tolist() == [0, 1, 2]
    sent = upload.delivered(torch.tensor([True, False, True]))
    assert sent.nbytes.tolist() == [8, 0, 8] and sent.lost.tolist() == [False, True, False]
    arrived = sent.arrived()
    assert arrived.clients.tolist() == [3, 8] and arrived.positions.tolist() == [0, 2]
    assert torch.equal(arrived.state["w"], torch.tensor([[0.0, 1.0], [4.0, 5.0]]))
    assert arrived.header["ids"].tolist() == [7, 9] and arrived.nbytes.tolist() == [8, 8]
    per_client = Payload.from_rows([{"a": torch.ones(1)}, {"a": torch.zeros(1)}, {}], clients)
    none = per_client.delivered(torch.tensor([False, False, False])).arrived()
    assert len(none) == 0 and none.rows == []


def test_the_engine_hands_aggregate_only_the_arrived_uploads_and_counts_lost_ones_as_not_sent(tmp_path):
    fed = make_federation(small_cell(clients=8, participation=0.6, system={"dropout": 0.5}), tmp_path)
    got = []

    class Keeps(FedAvg):
        def aggregate(self, rnd, upload):
            got.append((rnd, upload))
            super().aggregate(rnd, upload)

    alg = _setup(Keeps, fed)
    lost_some = False
    for number in range(1, fed.cell.rounds + 1):
        clients = torch.as_tensor(fed.schedule[number - 1])
        arrived = fed.arrived(number, clients)
        got.clear()
        _, upload = run_round(alg, number, clients)
        assert torch.equal(upload.nbytes > 0, arrived)  # a lost upload counts no bytes
        if not arrived.any():
            assert not got  # nothing arrived: the server keeps its state
            continue
        lost_some |= not bool(arrived.all())
        ((rnd, delivered),) = got
        assert delivered.clients.tolist() == clients[arrived].tolist()
        assert delivered.positions.tolist() == torch.nonzero(arrived).flatten().tolist()
    assert lost_some


# ---- evaluation: whom the models serve ---------------------------------------------------------------------
def test_newcomers_are_served_through_their_own_context_and_self_engine_stays_the_trained_clients(
    tmp_path, monkeypatch
):
    calls = []

    class Watches(FedAvg):
        def evaluate(self, serving, models, splits):
            calls.append(("evaluate", serving, self.engine))
            return super().evaluate(serving, models, splits)

        def adapt_locally(self, serving, models):
            calls.append(("adapt_locally", serving, self.engine))
            return super().adapt_locally(serving, models)

        def newcomer_models(self, serving):
            calls.append(("newcomer_models", serving, self.engine))
            return super().newcomer_models(serving)

    made = []
    original = rounds.Federation

    def federation(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(rounds, "get_algorithm", lambda name: Watches)
    monkeypatch.setattr(rounds, "Federation", federation)
    cell = small_cell(clients=8, rounds=2, unseen_fraction=0.25, finetune_epochs=1)
    assert run_cell(cell, data_root=tmp_path).status == "finished"
    fed = made[0]
    newcomers = [c for c in calls if c[1].newcomers]
    trained = [c for c in calls if not c[1].newcomers]
    assert {c[0] for c in newcomers} == {"evaluate", "adapt_locally", "newcomer_models"}
    assert {c[0] for c in trained} == {"evaluate", "adapt_locally"}
    assert all(c[1].clients is fed.newcomers for c in newcomers) and all(c[1].clients is fed for c in trained)
    assert all(c[2] is fed for c in calls)  # the algorithm's own engine (the Federation) is never swapped
    assert all(c[1].adapt_epochs == 1 and c[1].round in (1, 2) for c in calls)
    # the newcomers' Federation shares the cell's data and models, and holds only its own clients
    assert fed.newcomers.cell_data is fed.cell_data and fed.newcomers.features is fed.features
    assert fed.newcomers.models == fed.models and fed.newcomers.newcomers is None
    assert not set(fed.newcomers.client_ids.tolist()) & set(fed.client_ids.tolist())


def test_scored_models_are_taken_as_scored_and_evaluate_scores_every_other_model(tmp_path, monkeypatch):
    evaluated = []

    class Marks(FedAvg):
        def evaluate(self, serving, models, splits):
            evaluated.append(splits)
            count = serving.clients.num_clients
            return {split: (torch.full((count,), 0.25), torch.full((count,), 1.5)) for split in splits}

        def adapt_locally(self, serving, models):
            count = serving.clients.num_clients
            return Scored({split: (torch.full((count,), 0.75), torch.full((count,), 0.5)) for split in ("test", "val")})

    monkeypatch.setattr(rounds, "get_algorithm", lambda name: Marks)
    result = run_cell(small_cell(rounds=2, finetune_epochs=1), data_root=tmp_path)
    assert result.status == "finished"
    assert (result.metrics["accuracy"] == 0.25).all() and (result.metrics["val_loss"] == 1.5).all()
    assert (result.metrics["accuracy_adapted"] == 0.75).all() and (result.metrics["loss_adapted"] == 0.5).all()
    assert evaluated == [("test", "val")] * 2  # the personalized models of each evaluation, every split at once


# ---- nothing swapped, copied or re-stacked by type -----------------------------------------------------------
def test_no_hidden_round_state_no_swapped_federation_and_no_upload_restacked_by_type():
    hidden = re.compile(
        r"local_round|copy\.copy\(|\.serving\(|\bself\.(fed|engine)\s*(:[^=]*)?=(?!=)|type\(self\)\.evaluate|"
        r"restack|payload_bytes|\"scores\" in"
    )
    found = []
    for path in (ROOT / "pflbench").rglob("*.py"):  # the built-in algorithms included
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if hidden.search(line) and not line.lstrip().startswith("#"):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    # Algorithm.__init__ stores the trained clients' engine, once
    allowed = {"pflbench/algorithm.py"}
    assert [f for f in found if f.split(":")[0] not in allowed] == []
    assert [f.split(": ", 1)[1] for f in found] == [
        "self.engine: Engine = engine  # what the method may ask of the engine (pflbench.engine)"
    ]


def test_the_public_round_types_are_exported_by_the_contract():
    import pflbench.algorithm as contract

    for name in ("Round", "Payload", "Serving", "Scored", "Scores", "Models"):
        assert name in contract.__all__ and hasattr(contract, name)
    assert Round.__dataclass_params__.frozen and Serving.__dataclass_params__.frozen
