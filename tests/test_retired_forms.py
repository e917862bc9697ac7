"""The method API's forms before the round context, the card and the engine interface are retired
(pflbench/loader/retired.py, behind the plugin loader; CHANGELOG.md): a class that uses one is refused when it
registers with one line naming its file and the new form, found from its signatures and attributes only
(a current-form class that passes `salt=` to hashlib is registered as it is); a retired name it only reads
fails with such a line; every built-in is registered as it is written."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from cells import federation, small_cell
from pflbench.loader import plugins
from pflbench.loader import retired
from pflbench.simulator import rounds
from pflbench.algorithm import ALGORITHMS, Algorithm, AlgorithmRegistry
from pflbench.loader.plugins import PluginError
from pflbench.simulator.rounds import run_cell
from pflbench.kit.steps import step_ids

ROOT = Path(__file__).resolve().parents[1]
FEDAVG = ALGORITHMS.get("fedavg")


def _registered(cls):
    """`cls` as a plugin's registration gives it to the engine (on a registry of its own)."""
    return AlgorithmRegistry("algorithm").register(cls.__name__.lower())(cls)


class OldAvg(Algorithm):
    """FedAvg as a plugin wrote it before the round context: every round hook in the old form."""

    def configure(self, rnd, clients):
        return super().configure(rnd, clients)

    def receive(self, rnd, clients, download):
        return download

    def local_train(self, rnd, clients, state):
        return self.fed.train(rnd, clients, state).state

    def send(self, rnd, clients, state):
        return state

    def aggregate(self, rnd, clients, upload):
        pass

    def newcomer_models(self, rnd, newcomers):
        return super().newcomer_models(rnd, newcomers)


def test_each_old_form_hook_is_refused_in_one_line_naming_its_file_line_and_new_form():
    with pytest.raises(retired.OldFormError) as caught:
        _registered(OldAvg)
    line = str(caught.value)
    assert "\n" not in line
    for name, new in retired.NEW_FORM.items():
        if name in vars(OldAvg):
            assert f"{__file__}:{vars(OldAvg)[name].__code__.co_firstlineno}: OldAvg.{name}(self, " in line, name
            assert new in line, name
    assert "leaves setup, personalized to Algorithm" in line and "class OldAvg(FedAvg)" in line


@pytest.mark.parametrize(
    "body, new",
    [
        ("display_name = 'Mine'", "card=Card(display_name='Mine')"),
        ("batched = False", "capabilities = Capabilities(batched=False)"),
        ("newcomers_refused = 'no'", "capabilities = Capabilities(newcomers='no')"),
        ("def aggregate_arrived(self, rnd, clients, upload, positions): pass", "aggregate(self, rnd: ClientRound"),
        ("def evaluate_splits(self, personal, splits): pass", "evaluate(self, serving: Serving, models, splits)"),
        ("@classmethod\n    def check_models(cls, model): pass", "cell_refusal(cls, cell)"),
        ("def evaluate(self, personal, split): pass", "evaluate(self, serving: Serving, models, splits)"),
        ("def adapt_locally(self, personal, rnd, epochs): pass", "adapt_locally(self, serving: Serving, models)"),
    ],
    ids=[
        "card",
        "capability",
        "newcomers",
        "aggregate_arrived",
        "evaluate_splits",
        "check_models",
        "evaluate",
        "adapt_locally",
    ],
)
def test_each_other_old_form_of_a_plugin_file_is_one_line_naming_the_file_and_the_new_form(body, new, tmp_path):
    path = tmp_path / "old_form.py"
    path.write_text(
        f"from pflbench.algorithm import ALGORITHMS\nfrom pflbench.fedavg import FedAvg\n\n\n"
        f"@ALGORITHMS.register('old-form')\nclass OldForm(FedAvg):\n    {body}\n"
    )
    with pytest.raises(PluginError) as caught:
        plugins.load([str(path)])
    line = str(caught.value)
    assert "\n" not in line and str(path) in line and new in line and "retired" in line, line
    assert "old-form" not in ALGORITHMS.names()


# A current-form plugin whose module passes salt= to something else than pflbench (hashlib's blake2b): the
# old adapter guessed old forms from the source text, and wrapped this class.
SALTED_HASH = """import hashlib

from pflbench.algorithm import ALGORITHMS, ClientRound
from pflbench.fedavg import FedAvg
from pflbench.simulator.training import State


@ALGORITHMS.register("hashing-avg")
class HashingAvg(FedAvg):
    state = (*FedAvg.state, "digests")

    def setup(self) -> None:
        super().setup()
        self.digests: list[str] = []

    def local_train(self, rnd: ClientRound, state: State) -> State:
        key = hashlib.blake2b(str(rnd.number).encode(), digest_size=8, salt=b"pflbench").hexdigest()
        self.digests.append(key)
        return super().local_train(rnd, state)
"""


def test_a_current_form_plugin_that_passes_salt_to_hashlib_is_registered_as_it_is_and_runs(tmp_path, monkeypatch):
    path = tmp_path / "hashing_avg.py"
    path.write_text(SALTED_HASH)
    plugins.load([str(path)])
    try:
        cls = ALGORITHMS.get("hashing-avg")
        assert cls.__module__ == "pflbench_plugin_hashing_avg" and cls.__name__ == "HashingAvg"
        assert retired.old_forms(cls) == [] and inspect.isfunction(vars(cls)["local_train"])  # its own, unwrapped
        cell = small_cell(rounds=2, eval_every=2)
        monkeypatch.setattr(rounds, "get_algorithm", lambda name: cls)
        ours = run_cell(cell, data_root=tmp_path)
        monkeypatch.setattr(rounds, "get_algorithm", lambda name: FEDAVG)
        theirs = run_cell(cell, data_root=tmp_path)
        columns = [c for c in ours.metrics.columns if c != "wall_time"]
        assert ours.status == "finished" and ours.metrics[columns].equals(theirs.metrics[columns])
    finally:
        plugins.unload(path.name)


def test_every_built_in_is_registered_as_it_is_written():
    for name, cls in ALGORITHMS.items():
        assert retired.old_forms(cls) == [], name
        assert not any(isinstance(v, retired.Retired) for k in cls.__mro__ for v in vars(k).values()), name


class ReadsRetired(FEDAVG):
    def old_engine(self):
        return self.fed

    def old_card(self):
        return self.display_name

    def old_check(self):
        return self.check_models("cnn")


def test_a_retired_name_a_plugin_only_reads_fails_with_one_line_naming_the_new_form(tmp_path):
    cls = _registered(ReadsRetired)
    alg = cls(federation(small_cell(), tmp_path), cls.parse_hyperparams({}))
    for read, new in (
        (alg.old_engine, "self.engine"),
        (alg.old_card, "self.card.display_name"),
        (alg.old_check, "cell_refusal(cls, cell)"),
    ):
        with pytest.raises(AttributeError) as caught:
            read()
        assert "\n" not in str(caught.value) and __file__ in str(caught.value) and new in str(caught.value)
    alg.fed = "its own"  # an attribute of the plugin's own by that name wins (a non-data descriptor)
    assert alg.fed == "its own"


def test_salt_is_refused_by_the_engine_as_an_unexpected_keyword(tmp_path):
    fed = federation(small_cell(), tmp_path)
    with pytest.raises(TypeError, match="salt"):
        step_ids(fed, 1, torch.arange(2), salt=0xD1770)


def test_nothing_in_the_core_imports_the_retired_forms():
    importers = []
    for path in (ROOT / "pflbench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [f"{node.module}.{a.name}" for a in node.names]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n.startswith("pflbench.loader.retired") for n in names):
                importers.append(path.relative_to(ROOT).as_posix())
    assert importers == ["pflbench/loader/plugins.py"]
    assert not (ROOT / "pflbench" / "legacy_hooks.py").exists() and not (ROOT / "pflbench" / "deprecation.py").exists()
