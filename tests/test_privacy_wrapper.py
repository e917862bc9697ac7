"""The privacy knob's wrapper is itself an algorithm (pflbench/simulator/privacy.py: `DifferentiallyPrivate`): every
hook of `Algorithm` delegated to the wrapped method by name, uploads privatized where they leave the
clients, the wrapping done once where the cell's method is built (pflbench/simulator/cell_method.py), and the
round driver (pflbench/simulator/rounds.py) free of privacy code. Its runs are the runs of the code before it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch
from torch import nn

from cells import federation as make_federation, small_cell
from pflbench.simulator import rounds
from pflbench.algorithm import Algorithm, get_algorithm
from pflbench.simulator.cell_method import cell_method
from pflbench.simulator.groups import draws_global_generator
from pflbench.simulator.privacy import DifferentiallyPrivate, with_privacy
from pflbench.simulator.rounds import run_cell

get_algorithm("fedavg")  # registers the built-in algorithms
PRIVATE = dict(privacy={"epsilon": 8.0, "clip": 0.05})


def _public(cls: type) -> dict[str, object]:
    return {name: value for name, value in vars(cls).items() if not name.startswith("_")}


def _wrapped(tmp_path, method: type[Algorithm], **cell) -> tuple[Algorithm, DifferentiallyPrivate]:
    fed = make_federation(small_cell(**{**PRIVATE, **cell}), tmp_path)
    inner = method(fed, method.parse_hyperparams({}))
    wrapper = with_privacy(inner, fed)
    assert isinstance(wrapper, DifferentiallyPrivate)
    return inner, wrapper


# ---- the wrapper is an Algorithm, and every hook of the base is delegated ------------------------------
SENTINEL = object()


def _spy(calls: list) -> type[Algorithm]:
    """FedAvg whose every hook records its call and returns SENTINEL: what the wrapper delegates."""
    fedavg = get_algorithm("fedavg")
    own: dict[str, object] = {
        "dp_upload": "update",
        "updates_per_client": True,
        "search_space": {"lr": ("uniform", 0.0, 1.0)},
        "quick_hp": {"x": 1},
    }
    for name, value in _public(Algorithm).items():
        if inspect.isfunction(value) and name not in ("local_train", "send", "facts"):

            def hook(self, *args, _name=name):
                calls.append((_name, args))
                return SENTINEL

            own[name] = hook

    def cell_refusal(cls, cell):
        calls.append(("cell_refusal", (cell,)))
        return None

    own["cell_refusal"] = classmethod(cell_refusal)
    own["facts"] = lambda self: {"own_fact": 1}
    return type("Spy", (fedavg,), own)


def test_the_wrapper_is_an_algorithm_and_every_hook_of_the_base_is_delegated_by_name(tmp_path):
    calls: list = []
    spy = _spy(calls)
    inner, wrapper = _wrapped(tmp_path, spy)
    assert isinstance(wrapper, Algorithm) and not isinstance(wrapper, spy)
    base = _public(Algorithm)
    # Every public name of the base is either one of the method's class-level declarations, taken over
    # by the wrapper's class, or the wrapper's own checkpoint declaration (none), or defined on the
    # wrapper itself: a hook added to Algorithm and not to the wrapper fails here.
    declared = set(DifferentiallyPrivate.WRAPPED_DECLARATIONS)
    own_state = {"state", "state_objects", "state_rebuilt"}
    defined = set(vars(DifferentiallyPrivate))
    assert not set(base) - declared - own_state - defined, "hooks of Algorithm the wrapper does not delegate"
    hooks = {
        name for name, value in base.items() if inspect.isfunction(value) or isinstance(value, (property, classmethod))
    }
    assert hooks <= defined and len(hooks) >= 20  # 15 methods, 2 properties, 3 class methods today
    for name in declared:
        assert getattr(type(wrapper), name) is getattr(spy, name), name
    assert type(wrapper).card.as_dict() == spy.card.as_dict() and type(wrapper).name == "fedavg"
    assert wrapper.state_objects == () and wrapper.state_rebuilt == ()
    assert wrapper.hp is inner.hp and wrapper.engine is inner.engine
    # each plain hook hands its arguments to the method's and returns what it returns
    checked = set()
    for name, value in base.items():
        if not inspect.isfunction(value) or name in ("local_train", "send", "facts"):
            continue
        signature = inspect.signature(value)
        arguments = tuple(object() for _ in list(signature.parameters)[1:])
        calls.clear()
        returned = getattr(wrapper, name)(*arguments)
        assert calls == [(name, arguments)], name
        assert returned is (None if signature.return_annotation == "None" else SENTINEL), name
        checked.add(name)
    assert checked >= {
        "setup",
        "configure",
        "receive",
        "aggregate",
        "aggregate_client",
        "personalized",
        "evaluate",
        "adapt_locally",
        "newcomer_models",
        "state_dict",
        "load_state_dict",
        "artifacts",
    }
    # the properties, the class's contract and the facts
    assert wrapper.dp_upload == "update" and wrapper.updates_per_client is True
    assert wrapper.engine is inner.engine
    calls.clear()
    cell = small_cell(**PRIVATE)
    type(wrapper).check_cell(cell)
    assert type(wrapper).cell_refusal(cell) is None and [c[0] for c in calls] == ["cell_refusal", "cell_refusal"]
    assert type(wrapper).parse_hyperparams({}) == spy.parse_hyperparams({})
    facts = wrapper.facts()
    assert facts["own_fact"] == 1 and facts["privacy_mode"] == "local" and facts["privacy_releases"] == [0] * 5


def test_one_wrapper_class_per_method_and_a_wrapper_wraps_only_its_method(tmp_path):
    fedavg, fedprox = get_algorithm("fedavg"), get_algorithm("fedprox")
    assert DifferentiallyPrivate.wrapping(fedavg) is DifferentiallyPrivate.wrapping(fedavg)
    assert DifferentiallyPrivate.wrapping(fedprox).card is fedprox.card
    fed = make_federation(small_cell(**PRIVATE), tmp_path)
    with pytest.raises(TypeError, match=r"wraps a FedAvg, not a FedProx"):
        DifferentiallyPrivate.wrapping(fedavg)(fedprox(fed, fedprox.parse_hyperparams({})), fed)
    with pytest.raises(TypeError, match=r"build it with with_privacy\(algorithm, fed\)"):
        DifferentiallyPrivate(fedavg(fed, fedavg.parse_hyperparams({})), fed)
    off = make_federation(small_cell(), tmp_path)
    with pytest.raises(ValueError, match="privacy knob is off"):
        DifferentiallyPrivate.wrapping(fedavg)(fedavg(off, fedavg.parse_hyperparams({})), off)


# ---- where it is built, and what is not wrapped --------------------------------------------------------
def test_the_cells_method_is_wrapped_once_where_it_is_built_and_only_under_the_knob(tmp_path):
    fedavg = get_algorithm("fedavg")
    on = make_federation(small_cell(**PRIVATE), tmp_path)
    method = cell_method(fedavg, on.cell, on)
    assert isinstance(method, DifferentiallyPrivate) and type(method.algorithm) is fedavg
    assert with_privacy(method, on) is method  # never twice
    off = make_federation(small_cell(), tmp_path)
    assert type(cell_method(fedavg, off.cell, off)) is fedavg


def test_a_method_that_privatizes_itself_is_not_wrapped(tmp_path):
    class PrivatizesItself(get_algorithm("fedavg")):
        dp_upload = "self"

    fed = make_federation(small_cell(**PRIVATE), tmp_path)
    method = PrivatizesItself(fed, PrivatizesItself.parse_hyperparams({}))
    assert with_privacy(method, fed) is method
    assert cell_method(PrivatizesItself, fed.cell, fed) is not method
    assert type(cell_method(PrivatizesItself, fed.cell, fed)) is PrivatizesItself


def test_the_round_driver_refuses_a_hand_built_method_of_a_cell_with_privacy(tmp_path):
    """A method built by hand (`cls(fed, hp)`) for a cell with privacy would upload unprivatized: the
    driver refuses it before the method is set up or any round runs, naming what to call instead; the
    same method built as the cell runs it (`cell_method`) runs, and so does the hand-built one where the
    knob is off or the method privatizes its uploads itself."""
    from pflbench.simulator.cell_method import NotTheCellsMethod, check_cell_method

    fedavg = get_algorithm("fedavg")
    fed = make_federation(small_cell(rounds=1, **PRIVATE), tmp_path)
    by_hand = fedavg(fed, fedavg.parse_hyperparams({}))
    expected = (
        r"the cell has privacy on \(privacy\.clip=0\.05, privacy\.epsilon=8\.0\), but its method FedAvg was "
        r"built without the privacy wrapper, so its uploads would leave the clients unprivatized: build the "
        r"method with pflbench\.simulator\.cell_method\.cell_method\(FedAvg, cell, fed\)"
    )
    with pytest.raises(NotTheCellsMethod, match=expected):
        rounds.run_rounds(fed, by_hand)
    assert not hasattr(by_hand, "global_state")  # refused before its setup
    with pytest.raises(
        NotTheCellsMethod, match=r"or wrap this one with pflbench\.simulator\.privacy\.with_privacy\(method, fed\)"
    ):
        rounds.run_round(by_hand, 1, torch.as_tensor(fed.schedule[0]))  # one round, driven by hand
    result = rounds.run_rounds(fed, cell_method(fedavg, fed.cell, fed))
    assert result.status == "finished" and result.summary["privacy_epsilon_max"] is not None

    class PrivatizesItself(fedavg):
        dp_upload = "self"

    check_cell_method(PrivatizesItself(fed, PrivatizesItself.parse_hyperparams({})), fed)  # not refused
    off = make_federation(small_cell(rounds=1), tmp_path)
    assert rounds.run_rounds(off, fedavg(off, fedavg.parse_hyperparams({}))).status == "finished"


def test_the_round_driver_imports_nothing_of_privacy():
    """rounds.py names no privacy (not even in a docstring); its imports, at any depth of its code, do
    not include pflbench.simulator.privacy; the method it drives comes built (cell_method), which does."""
    source = Path(rounds.__file__).read_text()
    assert "privacy" not in source.lower()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
            imported |= {f"{node.module}.{alias.name}" for alias in node.names}
    assert "pflbench.simulator.cell_method" in imported and not any("privacy" in name for name in imported)
    assert inspect.getsource(rounds.build_cell).count("cell_method(") == 1


def test_cell_groups_see_the_modules_of_a_wrapped_method(tmp_path):
    """A cell whose method holds a module that draws from torch's global generator runs alone, not in a
    group (pflbench.simulator.groups), wrapped or not."""

    class WithDropout(get_algorithm("fedavg")):
        def setup(self):
            super().setup()
            self.head = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))

    inner, wrapper = _wrapped(tmp_path, WithDropout)
    wrapper.setup()
    assert draws_global_generator(inner.engine, inner) and draws_global_generator(inner.engine, wrapper)
    plain, plain_wrapper = _wrapped(tmp_path, get_algorithm("fedavg"))
    plain_wrapper.setup()
    assert not draws_global_generator(plain.engine, plain_wrapper)


# ---- the same runs as the code before it --------------------------------------------------------------
# Recorded at 9d64998 (before the wrapper was an Algorithm; the rounds wrapped the method themselves,
# through the `__getattr__` proxy PrivateUploads), one torch thread: each client's test loss at the last
# round, the releases and the epsilon spent. The noise and the uploads' order are the same named streams
# drawn in the same order, so the values are those, up to float rounding across machines.
BEFORE = {
    "fedavg-local": (
        dict(
            algorithm="fedavg",
            clients=6,
            participation=0.5,
            rounds=3,
            system={"dropout": 0.3},
            privacy={"epsilon": [1.0, 8.0, None], "clip": 0.05},
        ),
        [
            3.6498847007751465,
            4.125150680541992,
            3.016303539276123,
            2.614396810531616,
            1.6761285066604614,
            4.731672286987305,
        ],
        [0, 0, 2, 2, 2, 1],
        [0.0, 0.0, None, 0.7994003575632785, None, 7.997786769569139],
    ),
    "fedavg-central": (
        dict(
            algorithm="fedavg",
            clients=6,
            participation=0.5,
            rounds=3,
            system={"dropout": 0.3},
            privacy={"epsilon": 4.0, "mode": "central", "relation": "replace", "clip": 0.05},
        ),
        [
            2.676319122314453,
            3.488834857940674,
            2.7858238220214844,
            2.845176935195923,
            3.7532918453216553,
            3.1295108795166016,
        ],
        3,
        3.9992720953246255,
    ),
    "pfedla-update": (
        dict(algorithm="pfedla", clients=6, participation=0.5, rounds=2, privacy={"epsilon": 8.0, "clip": 0.05}),
        [
            2.3420305252075195,
            2.2631592750549316,
            2.2700695991516113,
            2.296541452407837,
            2.354154348373413,
            2.289320707321167,
        ],
        [0, 1, 1, 2, 1, 1],
        [0.0, 7.997786769569139, 7.997786769569139, 7.996834449864593, 7.997786769569139, 7.997786769569139],
    ),
    "pfedhn-per-client": (
        dict(
            algorithm="pfedhn",
            clients=6,
            participation=0.5,
            rounds=2,
            system={"dropout": 0.3},
            hp={"server_updates": "per_client", "inner_steps": 2},
            privacy={"epsilon": 8.0, "clip": 0.05},
        ),
        [
            2.21525239944458,
            2.2985761165618896,
            2.3317370414733887,
            2.2729554176330566,
            2.27105450630188,
            2.3305561542510986,
        ],
        [0, 1, 1, 1, 0, 1],
        [0.0, 7.997786769569139, 7.997786769569139, 5.3247977133865545, 0.0, 7.997786769569139],
    ),
}


@pytest.mark.parametrize("key", sorted(BEFORE))
def test_a_wrapped_built_in_runs_as_the_code_before_it(key, tmp_path):
    """Local DP (budgets per group, a group without DP), central DP (replace), an "update" upload and a
    server that updates after each client, each with lost uploads: the same losses, releases and epsilons."""
    cell, losses, releases, epsilons = BEFORE[key]
    result = run_cell(small_cell(**cell), data_root=tmp_path)
    assert result.status == "finished", result.error
    last = result.metrics[result.metrics["round"] == cell["rounds"]]
    assert last["loss"].tolist() == pytest.approx(losses, rel=1e-5)
    assert result.summary["privacy_releases"] == releases
    assert result.summary["privacy_epsilon"] == pytest.approx(epsilons)
    assert result.card == get_algorithm(cell["algorithm"]).card.as_dict()  # the method's card, not the wrapper's
