"""Plugins written against the API before the round context keep working for one release
(pflbench/legacy_hooks.py): their old-form hooks are warned about when the class is registered, with the
new form named, and run as before — bit for bit, stragglers, lost uploads, privacy and newcomers
included; old-form calls of new-form hooks (super(), a built-in's) are translated back. Only such
classes are adapted: a current-form class, every built-in among them, is registered as it is."""
from __future__ import annotations

import warnings

import pytest
import torch

from cells import small_cell
from pflbench import legacy_hooks, rounds
from pflbench.algorithm import ALGORITHMS, Algorithm, AlgorithmRegistry, Payload
from pflbench.rounds import run_cell
from pflbench.training import weighted_mean

KNOBS = dict(clients=8, participation=0.6, rounds=4, eval_every=2,
             system={"stragglers": 0.4, "straggler_work": [0.3, 0.8], "dropout": 0.3})


def _registered(cls):
    """`cls` as a plugin's registration gives it to the engine (on a registry of its own)."""
    return AlgorithmRegistry("algorithm").register(cls.__name__.lower())(cls)


def _old_fedavg():
    """FedAvg as a plugin wrote it before the round context: every round hook in the old form."""

    class OldAvg(Algorithm):
        def configure(self, rnd, clients):
            return super().configure(rnd, clients)

        def receive(self, rnd, clients, download):
            return {n: download[n] if n in download else self.client_state[n][clients] for n in self.fed.model.names}

        def local_train(self, rnd, clients, state):
            return self.fed.train(rnd, clients, state).state  # its round number still cuts the stragglers' plans

        def send(self, rnd, clients, state):
            for n, t in state.items():
                self.client_state[n][clients] = t
            return {n: state[n] for n in self.shared_names()}

        def aggregate(self, rnd, clients, upload):
            weights = self.fed.train_sizes[clients].float()
            weights = weights / weights.sum()
            for n, t in upload.items():
                self.global_state[n] = weighted_mean(t, weights).unsqueeze(0)

        def newcomer_models(self, rnd, newcomers):
            return super().newcomer_models(rnd, newcomers)

    return _registered(OldAvg)


def _run(cls, monkeypatch, tmp_path, **cell):
    monkeypatch.setattr(rounds, "get_algorithm", lambda name: cls)
    result = run_cell(small_cell(**cell), data_root=tmp_path)
    monkeypatch.undo()
    return result


def _same(a, b) -> bool:
    columns = [c for c in a.metrics.columns if c != "wall_time"]
    return (a.status == b.status and a.metrics[columns].equals(b.metrics[columns])
            and a.rounds[["bytes_up", "bytes_down"]].equals(b.rounds[["bytes_up", "bytes_down"]]))


def test_each_old_form_hook_is_warned_about_naming_its_new_form():
    with pytest.warns(DeprecationWarning) as caught:
        _old_fedavg()
    messages = [str(w.message) for w in caught]
    for new in ("configure(self, rnd: Round) -> Payload", "receive(self, rnd: Round, download: Payload)",
                "local_train(self, rnd: Round, state)", "send(self, rnd: Round, state) -> Payload",
                "aggregate(self, rnd: Round, upload: Payload) -> None", "newcomer_models(self, serving: Serving)"):
        assert any(new in m and "old form" in m for m in messages), new
    # and, as it extends Algorithm for FedAvg's setup, personalized and shared_names: one line naming FedAvg
    assert any("extend FedAvg" in m and "setup, personalized, shared_names" in m for m in messages)
    assert len(messages) == 7


def test_a_current_form_class_is_registered_unwrapped_and_so_is_every_built_in():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)

        class New(ALGORITHMS.get("fedavg")):
            def local_train(self, rnd, state):
                return super().local_train(rnd, state)

            def evaluate(self, serving, models, splits):
                return super().evaluate(serving, models, splits)

        class Own(Algorithm):  # every hook its own: the base class is only the hooks
            state = ("model",)

            def setup(self):
                self.model = self.engine.init_state(self.engine.num_clients)

            def configure(self, rnd):
                return Payload.empty(rnd.clients)

            def receive(self, rnd, download):
                return {n: t[rnd.clients] for n, t in self.model.items()}

            def send(self, rnd, state):
                return Payload.empty(rnd.clients)

            def aggregate(self, rnd, upload):
                pass

            def personalized(self):
                return self.model

        for cls in (New, Own):
            hooks = dict(vars(cls))
            assert _registered(cls) is cls and dict(vars(cls)).items() >= hooks.items()  # its own functions
    for name, cls in ALGORITHMS.items():
        assert not legacy_hooks.old_forms(cls), name
        assert all(klass.__module__ != "pflbench.legacy_hooks" for klass in cls.__mro__), name
    mirrors = ("display_name", "family", "batched", "refused_knobs", "newcomers_refused", "check_models", "serving")
    assert not any(hasattr(Algorithm, m) or hasattr(ALGORITHMS.get("fedavg"), m) for m in mirrors)


@pytest.mark.parametrize("knobs", [KNOBS, dict(KNOBS, privacy={"epsilon": 8.0}),
                                   dict(clients=8, rounds=2, unseen_fraction=0.25, finetune_epochs=1)],
                         ids=["system", "privacy", "newcomers"])
def test_an_old_form_plugin_runs_bit_identical_to_the_built_in_it_restates(knobs, tmp_path, monkeypatch):
    with pytest.warns(DeprecationWarning):
        old = _old_fedavg()
    assert _same(_run(old, monkeypatch, tmp_path, **knobs), run_cell(small_cell(**knobs), data_root=tmp_path))


def test_old_form_evaluation_hooks_serve_the_newcomers_as_before(tmp_path, monkeypatch):
    served = []
    class OldScoring(ALGORITHMS.get("fedavg")):
        def evaluate(self, personal, split):
            served.append(self.fed)
            return self.fed.evaluate_personalized(personal, split)

        def adapt_locally(self, personal, rnd, epochs):
            return self.fed.adapt_locally(personal, rnd, epochs)

    with pytest.warns(DeprecationWarning, match="evaluate|adapt_locally"):
        OldScoring = _registered(OldScoring)

    knobs = dict(clients=8, rounds=2, unseen_fraction=0.25, finetune_epochs=1)
    old = _run(OldScoring, monkeypatch, tmp_path, **knobs)
    new = run_cell(small_cell(**knobs), data_root=tmp_path)
    columns = ["accuracy", "loss", "val_accuracy", "accuracy_adapted", "val_loss_adapted"]
    assert old.metrics["newcomer"].equals(new.metrics["newcomer"]) and old.metrics["client"].equals(new.metrics["client"])
    torch.testing.assert_close(torch.tensor(old.metrics[columns].to_numpy()), torch.tensor(new.metrics[columns].to_numpy()),
                               atol=1e-6, rtol=1e-5)  # split by split (its own) against one pass (the engine's)
    assert len({id(fed) for fed in served}) == 2  # the trained clients' Federation, then the newcomers' for the call


def test_an_old_form_subclass_of_a_built_in_calls_it_in_the_old_form(tmp_path, monkeypatch):
    fedprox = ALGORITHMS.get("fedprox")
    class OldProx(fedprox):
        def local_train(self, rnd, clients, state):
            assert isinstance(rnd, int) and rnd == rnd.round.number
            return super().local_train(rnd, clients, state)  # the built-in's new-form hook

    with pytest.warns(DeprecationWarning, match="local_train"):
        OldProx = _registered(OldProx)

    knobs = dict(KNOBS, hp={"mu": 0.1})
    old = _run(OldProx, monkeypatch, tmp_path, algorithm="fedprox", **knobs)
    assert _same(old, run_cell(small_cell(algorithm="fedprox", **knobs), data_root=tmp_path))


def test_an_old_aggregate_arrived_override_receives_the_arrived_uploads(tmp_path, monkeypatch):
    arrived = []
    class OldArrived(ALGORITHMS.get("fedavg")):
        def aggregate_arrived(self, rnd, clients, upload, positions):
            arrived.append((clients.tolist(), positions.tolist(), sorted(upload)))
            super().aggregate_arrived(rnd, clients, upload, positions)

    with pytest.warns(DeprecationWarning, match="aggregate_arrived is deprecated"):
        OldArrived = _registered(OldArrived)

    result = _run(OldArrived, monkeypatch, tmp_path, **KNOBS)
    assert _same(result, run_cell(small_cell(**KNOBS), data_root=tmp_path))
    assert arrived and all(len(p) < len(c) for c, p, _ in arrived)  # called where uploads were lost
    assert all(names and "fc1.weight" in names for _, _, names in arrived)  # the stacked dict it sent


def test_the_old_methods_still_answer_with_a_warning(tmp_path):
    from cells import federation

    class Calls(ALGORITHMS.get("fedavg")):
        """Current-form hooks, and calls of the old methods: adapted for them."""

        def scores(self, personal):
            return self.evaluate_splits(personal, ("test",))

        def newcomers(self, newcomers):
            return self.serving(newcomers)

    fed = federation(small_cell(clients=8, unseen_fraction=0.25), tmp_path)
    cls = _registered(Calls)
    alg = cls(fed, cls.parse_hyperparams({}))
    alg.setup()
    personal = alg.personalized()
    with pytest.warns(DeprecationWarning, match=r"evaluate_splits.*evaluate\(self, serving: Serving"):
        scores = alg.scores(personal)
    assert torch.equal(scores["test"][0], fed.evaluate_personalized(personal, "test")[0])
    with pytest.warns(DeprecationWarning, match=r"serving\(newcomers\)"), alg.newcomers(fed.newcomers) as newcomers:
        assert alg.fed is newcomers is fed.newcomers
    assert alg.fed is fed
    old_call = alg.evaluate(personal, "test")  # an old-form call of the new hook
    assert torch.equal(old_call[1], scores["test"][1])


def test_an_old_evaluate_splits_override_still_scores_the_models(tmp_path, monkeypatch):
    asked = []
    class OldSplits(ALGORITHMS.get("fedavg")):
        def evaluate_splits(self, personal, splits):
            asked.append(splits)
            return self.fed.evaluate_personalized_splits(personal, splits)

    with pytest.warns(DeprecationWarning, match="evaluate_splits is deprecated"):
        OldSplits = _registered(OldSplits)

    result = _run(OldSplits, monkeypatch, tmp_path, rounds=2)
    assert asked == [("test", "val")] * 2 and _same(result, run_cell(small_cell(rounds=2), data_root=tmp_path))


def test_an_old_form_round_number_cuts_the_stragglers_plans_in_local_train_only(tmp_path, monkeypatch):
    """As the old engine did (a field set around local_train): elsewhere the same number plans in full."""
    plans = {}
    class OldPlans(ALGORITHMS.get("fedavg")):
        def configure(self, rnd, clients):
            plans.setdefault("configure", [len(p) for p in self.fed.local_plans(rnd, clients)])
            return super().configure(rnd, clients)

        def local_train(self, rnd, clients, state):
            plans.setdefault("local_train", [len(p) for p in self.fed.local_plans(rnd, clients)])
            plans.setdefault("full", [len(p) for p in self.fed.local_plans(int(rnd), clients)])
            return super().local_train(rnd, clients, state)

    with pytest.warns(DeprecationWarning):
        OldPlans = _registered(OldPlans)

    cell = dict(participation=1.0, rounds=1, local_epochs=2, system={"stragglers": 0.4, "straggler_work": 0.3})
    assert _same(_run(OldPlans, monkeypatch, tmp_path, **cell), run_cell(small_cell(**cell), data_root=tmp_path))
    assert plans["configure"] == plans["full"] != plans["local_train"]
    assert all(cut <= full for cut, full in zip(plans["local_train"], plans["full"]))


# The old-form FedAvg above as a user's plugin file, registered with a class attribute of the form before cards.
OLD_PLUGIN = '''from pflbench.algorithm import ALGORITHMS, Algorithm
from pflbench.training import weighted_mean


@ALGORITHMS.register("old-avg")
class OldAvg(Algorithm):
    display_name = "OldAvg"

    def configure(self, rnd, clients):
        return super().configure(rnd, clients)

    def local_train(self, rnd, clients, state):
        return self.fed.train(rnd, clients, state).state

    def aggregate(self, rnd, clients, upload):
        weights = self.fed.train_sizes[clients].float()
        weights = weights / weights.sum()
        for n, t in upload.items():
            self.global_state[n] = weighted_mean(t, weights).unsqueeze(0)
'''


def test_an_old_form_plugins_warnings_name_its_file_and_line_not_pflbenchs(tmp_path):
    from pflbench import plugins

    path = tmp_path / "old_avg.py"
    path.write_text(OLD_PLUGIN)
    with pytest.warns(DeprecationWarning) as caught:
        plugins.load([str(path)])
    try:
        assert {w.filename for w in caught} == {str(path)}
        lines = OLD_PLUGIN.splitlines()
        for w in caught:  # the hook's `def`, or the class's registration
            assert lines[w.lineno - 1].lstrip().startswith(("def ", "@ALGORITHMS.register")), (w.lineno, w.message)
        assert len(caught) == 5  # display_name, three hooks, and FedAvg's setup, receive, send, personalized
        assert any("extend FedAvg" in str(w.message) for w in caught)
    finally:
        plugins.unload(path.name)


@pytest.mark.slow
def test_an_old_form_plugin_runs_on_the_command_line_with_one_line_naming_its_file(tmp_path):
    """Python's default filters hide DeprecationWarnings outside __main__: the command prints its own line."""
    import subprocess
    import sys

    path = tmp_path / "old_avg.py"
    path.write_text(OLD_PLUGIN)
    done = subprocess.run([sys.executable, "-m", "pflbench.cli", "run", "quickstart", "--plugin", path.name,
                           "--set", "algorithm=[old-avg]", "--set", "seed=0", "--set", "rounds=1", "--no-ray",
                           "--results", str(tmp_path / "results")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    notices = [line for line in done.stderr.splitlines() if "old form" in line or "eprecat" in line]
    assert len(notices) == 1, done.stderr
    line = notices[0]
    assert line.startswith(f"pflbench: {path} uses the method API's old form")
    for new in ("configure(self, rnd: Round) -> Payload", "local_train(self, rnd: Round, state) -> state",
                "aggregate(self, rnd: Round, upload: Payload) -> None", "card=Card(display_name='OldAvg')",
                "class OldAvg(FedAvg)"):
        assert new in line, new
    assert "pflbench/" not in line.replace("docs/howto/own-method.md", "")  # none of pflbench's own files
    assert "1 finished" in done.stdout


# A plugin that still asks for batch orders with the deprecated salt= (now a named stream, pflbench.streams).
SALTED_PLUGIN = '''from pflbench.algorithm import ALGORITHMS
from pflbench.fedavg import FedAvg
from pflbench.steps import step_ids


@ALGORITHMS.register("salted-avg")
class SaltedAvg(FedAvg):
    def orders(self, clients):
        return (step_ids(self.fed, 1, clients, salt=0xD1770)[0], step_ids(self.fed, 1, clients, salt=0x1234)[0],
                self.fed.batch_generators(1, clients, 0x1234), self.fed.train(1, clients, self.fed.init_state(3),
                                                                                salt=0xD1770).state)
'''


def test_the_deprecated_salt_still_works_and_names_the_stream(tmp_path):
    import hashlib

    from cells import federation
    from pflbench import plugins
    from pflbench.algorithms.ditto import Ditto
    from pflbench.steps import step_ids

    path = tmp_path / "salted_avg.py"
    path.write_text(SALTED_PLUGIN)
    plugins.load([str(path)])
    try:
        fed = federation(small_cell(), tmp_path)
        cls = ALGORITHMS.get("salted-avg")
        alg = cls(fed, cls.parse_hyperparams({}))
        clients = torch.arange(3)
        with pytest.warns(DeprecationWarning) as caught:
            salted, own, generators, trained = alg.orders(clients)
        messages = " ".join(str(w.message) for w in caught)
        assert "stream='ditto.personal'" in messages and "batches.<purpose>" in messages
        assert {w.filename for w in caught} == {str(path)}
        assert torch.equal(salted, step_ids(fed, 1, clients, stream=Ditto.PERSONAL_STREAM)[0])
        sha = lambda text: int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")  # noqa: E731
        assert [g.initial_seed() for g in generators] == [sha(f"0/1/{int(fed.client_ids[c])}/{0x1234}") for c in range(3)]
        assert not torch.equal(own, salted)
        named = fed.train(1, clients, fed.init_state(3), stream=Ditto.PERSONAL_STREAM).state
        assert all(torch.equal(trained[n], named[n]) for n in named)
        with pytest.raises(TypeError, match="salt"):  # the engine's API has no salt= (a current-form class)
            step_ids(fed, 1, clients, salt=0xD1770)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            step_ids(fed, 1, clients)  # the default stream warns nothing
    finally:
        plugins.unload(path.name)
