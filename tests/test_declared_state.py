"""Checkpoint state is declared by each method (pflbench/algorithm.py: `state`, `state_objects`,
`state_rebuilt`), not found by walking the instance: declared state round-trips, an undeclared attribute
fails the cell at the end of the round that set it, naming it and the class's file, every built-in declares
all it sets (and what it calls rebuilt is), and a plugin written before declarations (extending `Algorithm`
for FedAvg's behaviour, walking its attributes) is refused with one line naming its file."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from torch import nn

from cells import federation, small_cell
from checkpoint_helpers import differences, interrupted_and_resumed, uninterrupted
from pflbench.simulator import rounds
from pflbench.algorithm import ALGORITHMS, StateError, get_algorithm, undeclared_state
from pflbench.fedavg import FedAvg
from pflbench.storage.checkpoint import CheckpointPolicy, Checkpointer
from pflbench.simulator.rounds import run_cell
from pflbench.storage.store import CHECKPOINT

get_algorithm("fedavg")  # registers the built-in algorithms
IMAGES = dict(dataset="synthetic-images", dataset_options={"num_samples": 200, "channels": 3, "size": 32})


class Counted(FedAvg):
    """FedAvg with a round counter, a module, a per-round history set on first use and a rebuilt split."""

    state = (*FedAvg.state, "rounds_seen", "history")
    state_objects = ("probe",)
    state_rebuilt = ("split",)

    def setup(self) -> None:
        super().setup()
        self.rounds_seen = 0
        self.probe = nn.Linear(2, 2)
        self.split = list(self.engine.model.names[:1])

    def aggregate(self, rnd, upload):
        super().aggregate(rnd, upload)
        self.rounds_seen += 1
        self.history = [*getattr(self, "history", []), float(rnd.number)]
        with torch.no_grad():
            self.probe.weight.add_(1.0)


def _saved(state: dict) -> dict:
    """`state` through torch.save / torch.load, as a checkpoint file carries it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_declared_state_round_trips_and_nothing_else_is_saved(tmp_path):
    fed = federation(small_cell(rounds=2), tmp_path)
    alg = Counted(fed, Counted.parse_hyperparams({}))
    alg.setup()
    assert set(alg.state_dict()["attributes"]) == {"global_state", "client_state", "rounds_seen"}  # no history yet
    for number in (1, 2):
        rounds.run_round(alg, number, torch.arange(fed.num_clients))
    saved = alg.state_dict()
    assert set(saved["attributes"]) == {"global_state", "client_state", "rounds_seen", "history"}
    assert set(saved["objects"]) == {"probe"} and "split" not in saved["attributes"]
    fresh = Counted(fed, Counted.parse_hyperparams({}))
    fresh.setup()
    fresh.load_state_dict(_saved(saved))
    assert fresh.rounds_seen == 2 and fresh.history == [1.0, 2.0] and fresh.split == alg.split
    assert torch.equal(fresh.probe.weight, alg.probe.weight)
    for name in fed.model.names:
        assert torch.equal(fresh.global_state[name], alg.global_state[name])
        assert torch.equal(fresh.client_state[name], alg.client_state[name])
    other = FedAvg(fed, FedAvg.parse_hyperparams({}))
    other.setup()
    with pytest.raises(StateError, match=r"not taken from a FedAvg: .*it has history, rounds_seen"):
        other.load_state_dict(_saved(saved))


class Forgets(FedAvg):
    """Sets an attribute in a hook and declares it nowhere."""

    def aggregate(self, rnd, upload):
        super().aggregate(rnd, upload)
        self.server_momentum = {n: t.clone() for n, t in self.global_state.items()}


def test_an_undeclared_attribute_is_caught_with_its_name(tmp_path, monkeypatch):
    fed = federation(small_cell(rounds=2), tmp_path)
    alg = Forgets(fed, Forgets.parse_hyperparams({}))
    alg.setup()
    assert undeclared_state(alg) == []
    rounds.run_round(alg, 1, torch.arange(fed.num_clients))
    assert undeclared_state(alg) == ["server_momentum"]
    with pytest.raises(StateError, match=r"Forgets \(.*\) sets server_momentum, declared in none of `state`"):
        alg.state_dict()
    # in a cell: it fails at the end of the round that set it, naming the attribute and the class's file
    monkeypatch.setattr(rounds, "get_algorithm", lambda name: Forgets)
    cell = small_cell(rounds=3)
    with pytest.raises(
        StateError,
        match=rf"Forgets \({__file__}\) sets server_momentum.*"
        r"state = \(\*FedAvg\.state, 'server_momentum'\)",
    ):
        run_cell(
            cell,
            data_root=tmp_path,
            checkpointer=Checkpointer(tmp_path / "cell", cell, CheckpointPolicy(every=1, minutes=0)),
        )
    assert not (tmp_path / "cell" / CHECKPOINT).exists()


# ---- every built-in declares everything it sets, and what it calls rebuilt is rebuilt --------------------


def _same(a, b) -> bool:
    """Equal values: tensors and arrays by content, containers item by item; an object without an equality
    of its own (a model's architecture) by its type."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a).__eq__ is object.__eq__:
        return type(a) is type(b)
    return bool(a == b)


class Inspecting(Checkpointer):
    """After every round (its evaluation included): nothing undeclared, the rebuilt attributes as a fresh
    setup() makes them; records which declared attributes the instance had."""

    def __init__(self, *args, seen: set, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = seen

    def after_round(self, rnd, fed, algorithm, loop, elapsed):
        cls = type(algorithm)
        assert undeclared_state(algorithm) == [], (cls.name, rnd)
        fresh = cls(algorithm.engine, algorithm.hp)
        fresh.setup()
        for name in cls.state_rebuilt:  # (some only in some cells: Local's rows, across architectures)
            if name in vars(algorithm) or name in vars(fresh):
                assert name in vars(algorithm) and name in vars(fresh), f"{cls.name}: {name} not rebuilt by setup()"
                assert _same(vars(algorithm)[name], vars(fresh)[name]), f"{cls.name}: {name} changed, declared rebuilt"
        self.seen.update(vars(algorithm))
        return super().after_round(rnd, fed, algorithm, loop, elapsed)


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_every_built_in_declares_all_it_sets(name, tmp_path):
    cls = ALGORITHMS.get(name)
    cells = [
        small_cell(
            algorithm=name,
            clients=6,
            rounds=2,
            eval_every=1,
            finetune_epochs=1,
            hp=dict(cls.quick_hp),
            unseen_fraction=0.0 if cls.capabilities.newcomers else 0.34,
            dataset_options={"num_samples": 400},
        )
    ]
    if cls.capabilities.heterogeneous_models:
        cells.append(
            small_cell(
                algorithm=name, model="mh-cnn,vgg8", clients=4, rounds=2, lr=0.01, hp=dict(cls.quick_hp), **IMAGES
            )
        )
    if name == "fedmn":
        cells.append(small_cell(algorithm=name, clients=3, rounds=2, hp=dict(cls.quick_hp), **IMAGES))
    seen: set[str] = set()
    for i, cell in enumerate(cells):
        inspecting = Inspecting(tmp_path / f"cell{i}", cell, CheckpointPolicy(every=0, minutes=0), seen=seen)
        result = run_cell(cell, data_root=tmp_path, checkpointer=inspecting)
        assert result.status == "finished", result.error
    declared = {*cls.state, *cls.state_objects, *cls.state_rebuilt}
    assert declared <= seen, f"{name} declares {sorted(declared - seen)}, which it never sets"


# ---- plugins written before: the walk, FedAvg from Algorithm, one line each --------------------------------

# A plugin as written when Algorithm was FedAvg and checkpoints walked the attributes: current-form hooks,
# FedAvg's from the base class, a server velocity it does not declare.
OLD_MOMENTUM = """from pflbench.algorithm import ALGORITHMS, Algorithm


@ALGORITHMS.register("old-momentum")
class OldMomentum(Algorithm):
    def setup(self):
        super().setup()
        self.velocity = {n: t.clone() * 0 for n, t in self.global_state.items()}

    def aggregate(self, rnd, upload):
        average = self.weighted_mean(upload)
        for n, mean in average.items():
            self.velocity[n] = 0.5 * self.velocity[n] + (self.global_state[n] - mean)
            self.global_state[n] = self.global_state[n] - self.velocity[n]
"""

NEW_MOMENTUM = """from pflbench.algorithm import ALGORITHMS
from pflbench.fedavg import FedAvg


@ALGORITHMS.register("new-momentum")
class NewMomentum(FedAvg):
    state = (*FedAvg.state, "velocity")

    def setup(self):
        super().setup()
        self.velocity = {n: t.clone() * 0 for n, t in self.global_state.items()}

    def aggregate(self, rnd, upload):
        average = self.weighted_mean(upload)
        for n, mean in average.items():
            self.velocity[n] = 0.5 * self.velocity[n] + (self.global_state[n] - mean)
            self.global_state[n] = self.global_state[n] - self.velocity[n]
"""


def test_an_old_plugin_is_refused_in_one_line_and_its_new_form_runs_and_resumes(tmp_path, monkeypatch):
    from pflbench.loader import plugins
    from pflbench.loader.plugins import PluginError

    old_file = tmp_path / "old_momentum.py"
    old_file.write_text(OLD_MOMENTUM)
    with pytest.raises(PluginError) as caught:
        plugins.load([str(old_file)])
    line = str(caught.value)
    assert "\n" not in line and str(old_file) in line
    assert "leaves configure, receive, send, personalized to Algorithm" in line and "class OldMomentum(FedAvg)" in line
    assert "old-momentum" not in ALGORITHMS.names()
    new_file = tmp_path / "new_momentum.py"
    new_file.write_text(NEW_MOMENTUM)
    plugins.load([str(new_file)])
    try:
        new = ALGORITHMS.get("new-momentum")
        cell = small_cell(rounds=4, eval_every=2)
        monkeypatch.setattr(rounds, "get_algorithm", lambda name: new)
        declared = uninterrupted(cell, tmp_path)
        resumed, notes = interrupted_and_resumed(cell, tmp_path / "new", tmp_path, at=2)
        assert notes == ["resumed at round 2 of 4"] and differences(declared, resumed) == []
    finally:
        plugins.unload("new_momentum.py")
