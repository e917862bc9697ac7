"""An algorithm's card and capabilities (pflbench/card.py, pflbench/capabilities.py): data registered
once with the class, the card stored with each cell's result (a report from the store alone shows a
plugin's method by its card), capabilities checked by one function; the API before cards still works
for one release, with a DeprecationWarning naming the new form."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pflbench.loader import plugins
from pflbench.algorithm import ALGORITHMS, Capabilities, Card, Refusal
from pflbench.cli import main
from pflbench.fedavg import FedAvg
from pflbench.config import CellConfig
from pflbench.registry import Registry

ROOT = Path(__file__).resolve().parents[1]

NEW_API = """
from pflbench.algorithm import ALGORITHMS, Capabilities, Card
from pflbench.fedavg import FedAvg


@ALGORITHMS.register("heldout-prox", card=Card(display_name="Heldout Prox", family="my family", paper="Me, 2026"))
class HeldoutProx(FedAvg):
    capabilities = Capabilities(refused_knobs={"privacy": "not yet"})
"""

pytestmark = pytest.mark.usefixtures("fresh_plugins")


def _registry() -> Registry:
    from pflbench.algorithm import AlgorithmRegistry

    return AlgorithmRegistry("algorithm")


def test_register_sets_the_name_and_the_card_which_is_never_inherited():
    registry = _registry()

    @registry.register("mine", card=Card(display_name="Mine", family="f", row_order=3))
    class Mine(FedAvg):
        pass

    @registry.register("derived")
    class Derived(Mine):
        pass

    assert Mine.name == "mine" and Mine.card == Card(display_name="Mine", family="f", row_order=3)
    assert Derived.name == "derived" and Derived.card == Card(display_name="derived")


def test_capabilities_are_inherited_and_checked_by_one_function():
    registry = _registry()

    @registry.register("looped")
    class Looped(FedAvg):
        capabilities = Capabilities(batched=False, refused_knobs={"privacy": "no update to clip"})

    @registry.register("child")
    class Child(Looped):
        pass

    assert Child.capabilities.batched is False
    cell = CellConfig(algorithm="fedmn", dataset="synthetic", privacy={"epsilon": 8.0})
    with pytest.raises(Refusal, match="cannot run with privacy: its upload") as refused:
        ALGORITHMS.get("fedmn").check_cell(cell)
    assert refused.value.fields == ("algorithm", "system", "privacy")
    with pytest.raises(Refusal, match="heterogeneous models: local, mh-pfedhn, mh-pfedhngd") as refused:
        ALGORITHMS.get("fedavg").check_cell(
            cell.model_copy(update={"algorithm": "fedavg", "privacy": {}, "model": "hetero5"})
        )
    assert refused.value.fields == ("algorithm", "model")
    ALGORITHMS.get("fedavg").check_cell(cell.model_copy(update={"algorithm": "fedavg"}))


def test_the_api_before_cards_is_refused_naming_the_new_form():
    from pflbench.loader.retired import OldFormError

    registry = _registry()
    with pytest.raises(OldFormError, match=r"register\(name, card=Card\(display_name='Old', family='f'\)\)"):

        @registry.register("old")
        class Old(FedAvg):
            display_name = "Old"
            family = "f"

    assert "old" not in registry
    assert not hasattr(ALGORITHMS.get("fedavg"), "check_knobs")  # a current-form class has no old method


def test_every_quick_hp_is_a_valid_setting_of_its_algorithm():
    for _name, cls in ALGORITHMS.items():
        cls.parse_hyperparams(cls.quick_hp)  # a ValueError names the algorithm and the bad field


def test_the_built_ins_use_the_card_and_name_themselves_once():
    for path in sorted((ROOT / "pflbench" / "algorithms").glob("[!_]*.py")):
        text = path.read_text()
        assert not re.search(r"^    (name|display_name|family|paper|row_order|batched|refused_knobs) = ", text, re.M), (
            path
        )


def test_the_card_is_stored_with_the_result_and_a_report_from_the_store_alone_shows_it(tmp_path):
    plugin = tmp_path / "outside" / "heldout_prox.py"
    plugin.parent.mkdir()
    plugin.write_text(NEW_API)
    results, out = tmp_path / "results", tmp_path / "report"
    spec = tmp_path / "outside" / "mine.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "mine",
                "plugins": ["heldout_prox.py"],
                "matrix": {
                    "algorithm": ["fedavg", "heldout-prox"],
                    "dataset": [{"name": "synthetic", "options": {"num_samples": 400}}],
                    "seed": [0],
                },
                "defaults": {"clients": 4, "rounds": 2, "batch_size": 16, "lr": 0.05, "eval_every": 1},
            }
        )
    )
    assert main(["run", str(spec), "--no-ray", "--results", str(results), "--root", str(tmp_path / "data")]) == 0
    stored = [json.loads(p.read_text()) for p in results.glob("*/config.json")]
    cards = {c["cell"]["algorithm"]: c["card"] for c in stored}
    assert cards["heldout-prox"]["display_name"] == "Heldout Prox" and cards["fedavg"]["family"] == "baselines"
    for loaded in plugins.loaded():  # the report runs where the plugin is not loaded
        plugins.unload(loaded.source.id)
    assert "heldout-prox" not in ALGORITHMS
    assert main(["report", "--results", str(results), "--out", str(out), "--no-figures", "--quiet"]) == 0
    report = (out / "report.md").read_text()
    assert "Heldout Prox" in report
    from pflbench.reports.cells import family

    assert family("heldout-prox") == "my family"
