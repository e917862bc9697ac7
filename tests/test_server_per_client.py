"""A server that updates after each client (pFedHN, MH-pFedHN with server_updates="per_client"): each
client's upload goes to the engine as it is made (`rnd.deliver`), and the driver calls the server's hook
(`Algorithm.aggregate_client`) with what arrived, before the next client trains; dropout and privacy are
the engine's, each upload privatized once, as it leaves its client."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cells import small_cell
from pflbench.simulator import rounds
from pflbench.algorithm import ClientRound, Payload, get_algorithm
from pflbench.fedavg import FedAvg
from pflbench.algorithms.mhpfedhn import CLIENT_ORDER_STREAM
from pflbench.simulator.rounds import run_cell

SYSTEM = {"dropout": 0.5}
MH = {"hidden_dim": 4, "embedding_dim": 8}


def _spied(name: str, events: list):
    """`name`'s class, recording each client's local training and each server update, in order."""
    cls = get_algorithm(name)

    class Spied(cls):  # type: ignore[misc, valid-type]
        def aggregate_client(self, rnd: ClientRound, upload: Payload) -> None:
            events.append(("server", rnd.number, upload.clients.tolist()))
            super().aggregate_client(rnd, upload)

    original = Spied.__mro__[1].__dict__
    if "inner_train" in original:  # pFedHN: one client per call in the per-client loop

        def inner_train(self, rnd, clients, state):
            events.append(("train", rnd.number, clients.tolist()))
            return cls.inner_train(self, rnd, clients, state)

        Spied.inner_train = inner_train
    return Spied


def _run(name: str, hp: dict, monkeypatch, tmp_path, **cell):
    events: list = []
    made = []
    original = rounds.Federation

    def federation(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(rounds, "get_algorithm", lambda _: _spied(name, events))
    monkeypatch.setattr(rounds, "Federation", federation)
    result = run_cell(
        small_cell(algorithm=name, clients=8, participation=0.5, rounds=3, hp=hp, **cell), data_root=tmp_path
    )
    assert result.status == "finished", result.error
    return events, made[0], result


def _arrived(fed, rnd: int, clients: list[int]) -> list[int]:
    arrived = fed.arrived(rnd, torch.tensor(clients))
    return clients if arrived is None else [c for c, on in zip(clients, arrived.tolist()) if on]


def test_pfedhn_each_arrived_update_reaches_the_server_before_the_next_client_trains(tmp_path, monkeypatch):
    events, fed, _ = _run("pfedhn", {"inner_steps": 2}, monkeypatch, tmp_path, system=SYSTEM)
    expected, lost = [], 0
    for rnd in range(1, 4):
        clients = fed.schedule[rnd - 1].tolist()
        arrived = _arrived(fed, rnd, clients)
        lost += len(clients) - len(arrived)
        for c in clients:  # the round's order; a lost update never reaches the server
            expected.append(("train", rnd, [c]))
            if c in arrived:
                expected.append(("server", rnd, [c]))
    assert lost > 0 and events == expected


def test_mh_pfedhn_takes_the_clients_in_its_drawn_order_and_steps_after_each(tmp_path, monkeypatch):
    events, fed, _ = _run("mh-pfedhn", MH, monkeypatch, tmp_path, system=SYSTEM)
    expected = []
    for rnd in range(1, 4):
        clients = fed.schedule[rnd - 1].tolist()
        order = np.asarray(clients)[fed.generator(CLIENT_ORDER_STREAM, rnd, kind="numpy").permutation(len(clients))]
        arrived = _arrived(fed, rnd, clients)
        expected += [("server", rnd, [c]) for c in order.tolist() if c in arrived]
    assert events == expected and len(events) < 3 * 4  # in the drawn order, the lost ones left out


@pytest.mark.parametrize("name,hp", [("pfedhn", {"inner_steps": 2}), ("mh-pfedhn", MH)])
def test_each_delivered_update_is_privatized_once_as_it_leaves_its_client(name, hp, tmp_path, monkeypatch):
    events, fed, result = _run(name, hp, monkeypatch, tmp_path, system=SYSTEM, privacy={"epsilon": 8.0, "clip": 1.0})
    released = sum(len(clients) for kind, _, clients in events if kind == "server")
    assert released > 0 and int(sum(fed.privacy.releases)) == released  # not again in the round's upload
    assert result.summary["privacy_epsilon_max"] is not None


def test_a_round_the_engine_does_not_drive_has_no_server_to_deliver_to(tmp_path):
    from cells import federation

    fed = federation(small_cell(), tmp_path)
    clients = torch.arange(2)
    rnd = fed.round(1, clients).with_download(Payload.empty(clients))
    with pytest.raises(RuntimeError, match="no server to deliver to"):
        rnd.deliver(Payload.empty(clients[:1]))


def test_a_method_that_delivers_must_say_what_its_server_does(tmp_path, monkeypatch):
    class Delivers(FedAvg):
        def local_train(self, rnd: ClientRound, state):
            trained = self.engine.train(rnd, rnd.clients, state).state
            rnd.deliver(Payload.from_state({n: t[:1] for n, t in trained.items()}, rnd.clients[:1]))
            return trained

    monkeypatch.setattr(rounds, "get_algorithm", lambda _: Delivers)
    with pytest.raises(NotImplementedError, match=r"Delivers delivers uploads .* aggregate_client"):
        run_cell(small_cell(rounds=1), data_root=tmp_path)
