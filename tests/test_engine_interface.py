"""The engine interface (pflbench.engine.Engine): exactly its documented members, never the cell's
configuration; the Federation implements every one; and methods that ask the engine only through it
run cells: every built-in (each hook, newcomers and local adaptation included, with any other attribute
an error) and a FedAvg written here against the interface alone, which matches the built-in bit for bit."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import pytest
import torch

from cells import federation, small_cell
from pflbench import engine as engine_module
from pflbench.simulator import rounds
from pflbench.algorithm import ALGORITHMS, Algorithm, AlgorithmRegistry, ClientRound, Payload, Round, get_algorithm
from pflbench.engine import MEMBERS, Budget, Engine
from pflbench.simulator.rounds import run_cell
from pflbench.serving import Serving
from pflbench.simulator.training import State, weighted_mean

ROOT = Path(__file__).resolve().parents[1]
get_algorithm("fedavg")  # registers the built-in algorithms

# What a method may ask of the engine, as documented (pflbench/engine.py's docstring, the reference page).
DOCUMENTED = (
    "num_clients",
    "client_ids",
    "device",
    "model",
    "models",
    "heterogeneous",
    "group_names",
    "group_clients",
    "group_of",
    "model_of",
    "by_group",
    "init_state",
    "input_shape",
    "num_classes",
    "train_sizes",
    "split_sizes",
    "split_names",
    "sample_ids",
    "data",
    "num_samples",
    "budget",
    "sgd",
    "batched",
    "train",
    "train_pooled",
    "local_plans",
    "batch_generators",
    "adapt_locally",
    "evaluate",
    "evaluate_personalized_splits",
    "generator",
    "torch_global",
    "seed_torch_global",
    "kept_local",
)
# The engine's own, never handed to a method.
ENGINES_OWN = {
    "cell",
    "cell_data",
    "execution",
    "features",
    "labels",
    "splits",
    "schedule",
    "system",
    "privacy",
    "newcomers",
    "round",
    "shifts",
    "compiled",
    "channels_last",
    "client_threads",
    "arrived",
    "privatize",
}


class Narrow:
    """The engine interface and nothing else: any other attribute is an AttributeError, so a method run
    through it provably asks the engine for nothing more."""

    def __init__(self, fed):
        object.__setattr__(self, "_fed", fed)

    def __getattr__(self, name: str):
        if name not in MEMBERS:
            raise AttributeError(f"{name!r} is not part of the engine interface (pflbench.engine.Engine)")
        return getattr(self._fed, name)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"the engine interface is read-only ({name!r})")


def test_the_interface_is_exactly_its_documented_members_and_not_the_cell():
    assert MEMBERS == DOCUMENTED
    assert "cell" not in MEMBERS and not ENGINES_OWN & set(MEMBERS)
    for name in MEMBERS:
        assert f"`{name}`" in engine_module.__doc__, name  # the module doc lists it
        assert inspect.getdoc(getattr(Engine, name)), name  # and it has its own docstring
    # the public method API: formatted, type-checked and rendered with the rest of it
    assert "ruff format --check pflbench tests" in (ROOT / "Makefile").read_text()  # the whole package
    checked = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert any(Path("pflbench/engine.py").is_relative_to(entry) for entry in checked), checked
    assert '"pflbench.engine"' in (ROOT / "docs" / "gen_reference.py").read_text()


def test_the_federation_implements_every_member(tmp_path):
    cell = small_cell(participation=0.6)
    fed = federation(cell, tmp_path)
    for name in MEMBERS:
        declared = inspect.getattr_static(Engine, name)
        if isinstance(declared, property):
            assert getattr(fed, name) is not None, name
            continue
        wanted = inspect.signature(declared).parameters
        given = inspect.signature(getattr(fed, name)).parameters
        for parameter in list(wanted.values())[1:]:  # but self
            assert parameter.name in given, (name, parameter.name)
            assert given[parameter.name].kind == parameter.kind, (name, parameter.name)
            assert given[parameter.name].default == parameter.default, (name, parameter.name)
    assert fed.budget == Budget(rounds=3, clients_per_round=3, local_epochs=1, batch_size=16)
    assert fed.budget.clients_per_round == fed.schedule.shape[1]
    assert fed.sgd.lr == cell.lr and fed.kept_local == frozenset()
    first = fed.generator("test.draws", 2, 1).initial_seed()
    assert first == fed.generator("test.draws", 2, 1).initial_seed() != fed.generator("test.draws", 2, 0).initial_seed()
    assert fed.generator("test.coins", kind="numpy").random() == fed.generator("test.coins", kind="numpy").random()


class EngineOnlyFedAvg(Algorithm):
    """FedAvg written against the engine interface alone: its models from `init_state`, local SGD from
    `train`, the weights from `train_sizes`; every client's model is the global one."""

    state = ("global_state", "client_state")

    def __init__(self, engine: Engine, hp):
        super().__init__(Narrow(engine), hp)

    def setup(self) -> None:
        self.global_state = self.engine.init_state(1)
        self.client_state = self.engine.init_state(self.engine.num_clients)

    def configure(self, rnd: Round) -> Payload:
        count = len(rnd.clients)
        return Payload.from_state({n: t.expand(count, *t.shape[1:]) for n, t in self.global_state.items()}, rnd.clients)

    def receive(self, rnd: ClientRound, download: Payload) -> State:
        return dict(download.state)

    def local_train(self, rnd: ClientRound, state: State) -> State:
        return self.engine.train(rnd, rnd.clients, state).state

    def send(self, rnd: ClientRound, state: State) -> Payload:
        return Payload.from_state(state, rnd.clients)

    def aggregate(self, rnd: ClientRound, upload: Payload) -> None:
        weights = self.engine.train_sizes[upload.clients].float()
        weights = weights / weights.sum()
        self.global_state = {n: weighted_mean(t, weights).unsqueeze(0) for n, t in upload.state.items()}

    def personalized(self) -> State:
        count = self.engine.num_clients
        return {n: t.expand(count, *t.shape[1:]) for n, t in self.global_state.items()}


def test_a_method_written_only_against_the_interface_runs_a_cell_as_the_builtin_does(tmp_path, monkeypatch):
    cell = small_cell(rounds=3, participation=0.6, finetune_epochs=1)
    builtin = run_cell(cell, data_root=tmp_path)
    monkeypatch.setattr(rounds, "get_algorithm", lambda name: EngineOnlyFedAvg)
    mine = run_cell(cell, data_root=tmp_path)
    assert mine.status == builtin.status == "finished"
    columns = ["round", "client", "accuracy", "loss", "val_accuracy", "accuracy_adapted", "bytes_up", "bytes_down"]
    assert mine.metrics[columns].equals(builtin.metrics[columns])
    with pytest.raises(AttributeError, match="not part of the engine interface"):
        _ = Narrow(federation(cell, tmp_path)).cell


def _through_the_interface(cls: type) -> type:
    """`cls` with its engine, and every population an evaluation hook serves, narrowed to the interface."""
    return type(cls.__name__, (cls,), {"__init__": lambda self, engine, hp: cls.__init__(self, Narrow(engine), hp)})


IMAGES = dict(dataset="synthetic-images", dataset_options={"num_samples": 200, "channels": 3, "size": 32})


@pytest.mark.parametrize(
    "name,hetero", [(name, False) for name in sorted(ALGORITHMS.names())] + [("local", True), ("mh-pfedhn", True)]
)
def test_every_builtin_asks_the_engine_only_through_the_interface(name, hetero, tmp_path, monkeypatch):
    cls = get_algorithm(name)
    cell = small_cell(
        algorithm=name,
        clients=8,
        participation=0.5,
        rounds=2,
        eval_every=1,
        finetune_epochs=1,
        unseen_fraction=0.0 if cls.capabilities.newcomers else 0.25,
        hp=dict(cls.quick_hp),
        dataset_options={"num_samples": 600},
    )
    if hetero:
        cell = cell.model_copy(
            update={"model": "mh-cnn,vgg8", "clients": 4, "unseen_fraction": 0.0, "lr": 0.01, **IMAGES}
        )
    monkeypatch.setattr(rounds, "get_algorithm", lambda name: _through_the_interface(cls))
    monkeypatch.setattr(rounds, "Serving", lambda rnd, clients, **kw: Serving(rnd, Narrow(clients), **kw))
    result = run_cell(cell, data_root=tmp_path)
    assert result.status == "finished", result.error
    assert result.metrics["accuracy"].notna().all() and len(result.metrics) >= 2 * cell.clients * (
        1 - cell.unseen_fraction
    )


class ReadsFed(ALGORITHMS.get("fedavg")):
    def local_train(self, rnd: ClientRound, state: State) -> State:
        return self.fed.train(rnd, rnd.clients, state).state  # the name before the engine interface


def test_self_fed_is_retired_with_one_line_naming_the_users_file_and_self_engine(tmp_path):
    cls = AlgorithmRegistry("algorithm").register("reads-fed")(ReadsFed)
    fed = federation(small_cell(), tmp_path)
    alg = cls(fed, cls.parse_hyperparams({}))
    alg.setup()
    clients = torch.arange(2)
    with pytest.raises(AttributeError, match=rf"ReadsFed \({__file__}\): fed was retired.*self\.engine"):
        alg.local_train(fed.round(1, clients).with_download(Payload.empty(clients)), fed.init_state(2))


def test_train_returns_the_steps_each_client_took_a_stragglers_fewer(tmp_path):
    fed = federation(small_cell(clients=4, system={"stragglers": 0.5, "straggler_work": [0.3, 0.3]}), tmp_path)
    clients = torch.arange(4)
    rnd = fed.round(1, clients)
    result = fed.train(rnd, clients, fed.init_state(4))
    planned = [len(plan) for plan in fed.local_plans(rnd, clients)]
    full = [len(plan) for plan in fed.local_plans(1, clients)]  # a round number: nothing cut
    assert result.steps.dtype == torch.int64 and result.steps.tolist() == planned
    assert any(p < f for p, f in zip(planned, full)) and all(p <= f for p, f in zip(planned, full))
    assert fed.train(1, clients, fed.init_state(4), steps=3).steps.tolist() == [3] * 4
