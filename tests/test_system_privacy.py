"""System heterogeneity (stragglers, dropped uploads) and privacy heterogeneity (per-client DP on the
uploads): validation, determinism, what the server sees, and every algorithm coping or refusing."""

import math

import numpy as np
import pytest
import torch

import pflbench.simulator.federation as federation
import pflbench.simulator.rounds as rounds
from cells import federation as make_federation, small_cell
from pflbench.algorithm import ALGORITHMS, get_algorithm
from pflbench.config import cell_hash
from pflbench.simulator.rounds import run_cell
from pflbench.simulator.privacy import ALPHAS, PrivacyParams, PrivacyPlan
from pflbench.run.spec import parse_spec
from pflbench.run.spec_problems import SpecError
from pflbench.simulator.system import SystemParams, SystemPlan

get_algorithm("fedavg")  # registers the built-in algorithms
TINY = dict(dataset_options={"num_samples": 400}, rounds=2, participation=0.6)
SYSTEM = {"dropout": 0.5, "stragglers": 0.4, "straggler_work": 0.2}


def _spec(**defaults):
    return {"matrix": {"algorithm": ["fedavg"], "dataset": "synthetic"}, "defaults": defaults}


def _frames_equal(a, b):
    columns = [c for c in a.metrics.columns if c != "wall_time"]
    assert a.metrics[columns].equals(b.metrics[columns])
    assert a.rounds[["bytes_down", "bytes_up"]].equals(b.rounds[["bytes_down", "bytes_up"]])


# ---- the spec ----------------------------------------------------------------------------------------
def test_defaults_written_out_keep_the_cell_hash_and_only_differences_are_stored():
    plain = parse_spec(_spec()).cells[0]
    explicit = parse_spec(
        _spec(**{"system.dropout": 0, "system.stragglers": 0.0, "privacy.delta": 1e-5, "privacy.clip": 1.0})
    ).cells[0]
    assert cell_hash(explicit) == cell_hash(plain) and explicit.system == {} and explicit.privacy == {}
    on = parse_spec(
        _spec(**{"system.dropout": 0.2, "system.stragglers": 0.5, "privacy.epsilon": [1, 8], "privacy.delta": 1e-5})
    ).cells[0]
    assert on.system == {"dropout": 0.2, "stragglers": 0.5} and on.privacy == {"epsilon": [1.0, 8.0]}
    assert cell_hash(on) != cell_hash(plain)


@pytest.mark.parametrize(
    "defaults, message",
    [
        ({"system.dropout": 1.5}, r"system.dropout: .*probability in \[0, 1\].*allowed: stragglers"),
        ({"system.speed": 2}, r"system.speed: Extra inputs are not permitted .*allowed: stragglers"),
        ({"system.straggler_work": [0.5, 0.1], "system.stragglers": 0.5}, r"low <= high"),
        ({"system.straggler_work": 0.3}, r"straggler_work is set but stragglers is 0"),
        ({"system.dropout": [0.1, 0.2]}, r"one probability per client \(10\), got 2"),
        ({"privacy.clip": 2.0}, r"privacy.epsilon is required"),
        ({"privacy.epsilon": 0}, r"privacy.epsilon: .*positive finite"),
        ({"privacy.epsilon": 1, "privacy.sigma": 1}, r"privacy.sigma: Extra inputs"),
        ({"system.dropout": True}, r"dropout: expected a number, got the boolean True"),
        ({"privacy.epsilon": [1, True]}, r"epsilon: expected a number, got the boolean True"),
    ],
)
def test_bad_knob_values_are_one_clear_error_before_any_work(defaults, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(_spec(**defaults))


def test_an_algorithm_that_cannot_honour_a_knob_is_refused_at_the_spec_and_in_run_cell(monkeypatch):
    spec = {"matrix": {"algorithm": ["l2gd"], "dataset": "synthetic"}, "defaults": {"system.dropout": 0.1}}
    with pytest.raises(
        SpecError, match=r"algorithm 'l2gd' cannot run with system.dropout: .*algorithms that can: .*fedavg"
    ):
        parse_spec(spec)
    assert parse_spec({**spec, "defaults": {"system.stragglers": 0.5}}).cells[0].system == {"stragglers": 0.5}

    def no_work(*args, **kwargs):
        raise AssertionError("the cell started loading data")

    monkeypatch.setattr(rounds, "prepare_cell", no_work)
    with pytest.raises(ValueError, match="'centralized' cannot run with privacy"):
        run_cell(small_cell(algorithm="centralized", privacy={"epsilon": 1.0}))


# ---- system heterogeneity ---------------------------------------------------------------------------
def test_draws_come_from_the_seed_alone_and_leave_the_schedule_unchanged(tmp_path):
    params = SystemParams(**SYSTEM)
    a, b = SystemPlan(params, 10, 5, seed=3), SystemPlan(params, 10, 5, seed=3)
    assert np.array_equal(a.dropped, b.dropped) and np.array_equal(a.work, b.work)
    assert a.straggler.sum() == 4 and set(np.unique(a.work)) == {0.2, 1.0}
    assert not np.array_equal(a.dropped, SystemPlan(params, 10, 5, seed=4).dropped)
    more = SystemPlan(SystemParams(dropout=0.8), 10, 5, seed=3)
    assert (more.dropped >= SystemPlan(SystemParams(dropout=0.3), 10, 5, seed=3).dropped).all()  # nested
    off, on = small_cell(), small_cell(system=SYSTEM)
    assert np.array_equal(make_federation(off, tmp_path).schedule, make_federation(on, tmp_path).schedule)


def test_every_algorithm_loses_the_same_uploads(tmp_path):
    dropped = []
    for name in ("fedavg", "fedper", "pfedla"):
        result = run_cell(small_cell(algorithm=name, system={"dropout": 0.5}, **TINY), data_root=tmp_path)
        dropped.append((result.metrics.groupby("round")["bytes_up"].apply(lambda b: tuple(b > 0))).tolist())
        assert result.summary["system_dropped_uploads"] > 0
    assert dropped[0] == dropped[1] == dropped[2]


def test_knobs_that_change_nothing_leave_the_run_bit_identical(tmp_path):
    cell = small_cell(**TINY)
    off = run_cell(cell, data_root=tmp_path)
    idle = cell.model_copy(
        update={
            "system": {"dropout": [0.0] * 5, "stragglers": 1.0, "straggler_work": 1.0},
            "privacy": {"epsilon": [None]},
        }
    )
    on = run_cell(idle, data_root=tmp_path)  # through the dropout, straggler and privacy paths
    _frames_equal(off, on)
    assert on.summary["privacy_epsilon"] == [None] * 5 and on.summary["system_dropped_uploads"] == 0


def test_a_client_that_always_drops_never_reaches_the_server(tmp_path, monkeypatch):
    seen = []
    fedavg = get_algorithm("fedavg")
    original = fedavg.aggregate
    monkeypatch.setattr(
        fedavg,
        "aggregate",
        lambda self, rnd, upload: (seen.append(upload.clients.tolist()), original(self, rnd, upload)),
    )
    cell = small_cell(system={"dropout": [1.0, 0, 0, 0, 0]}, rounds=4, participation=0.6)
    result = run_cell(cell, data_root=tmp_path)
    sampled = make_federation(cell, tmp_path).schedule
    assert (sampled == 0).any()  # client 0 was sampled, trained, and its upload was lost
    assert all(0 not in clients for clients in seen) and len(seen) == 4
    mine = result.metrics[result.metrics["client"] == 0]
    assert (mine["bytes_up"] == 0).all() and (mine["bytes_down"] > 0).any()
    assert (result.metrics[result.metrics["client"] != 0]["bytes_up"] > 0).any()


def test_nothing_arrives_and_the_server_keeps_its_model(tmp_path):
    cell = small_cell(system={"dropout": 1.0}, rounds=2, **{k: v for k, v in TINY.items() if k != "rounds"})
    result = run_cell(cell, data_root=tmp_path)
    assert result.status == "finished" and result.rounds["bytes_up"].sum() == 0
    first, last = (result.metrics[result.metrics["round"] == r]["accuracy"].to_numpy() for r in (1, 2))
    assert np.array_equal(first, last)  # the global model never moved


def test_stragglers_take_their_share_of_the_local_steps(tmp_path, monkeypatch):
    steps = []
    original = federation.train_clients
    monkeypatch.setattr(
        federation,
        "train_clients",
        lambda *args, **kw: (steps.append([len(p) for p in args[5]]), original(*args, **kw))[1],
    )
    cell = small_cell(participation=1.0, rounds=1, local_epochs=2)
    run_cell(cell, data_root=tmp_path)
    full = list(steps[0])
    steps.clear()
    slow = cell.model_copy(update={"system": {"stragglers": 0.4, "straggler_work": 0.2}})
    run_cell(slow, data_root=tmp_path)
    stragglers = SystemPlan(SystemParams(**slow.system), 5, 1, seed=0).straggler
    expected = [math.ceil(0.2 * n - 1e-9) if s else n for n, s in zip(full, stragglers)]
    assert steps[0] == expected and sum(expected) < sum(full)
    assert steps[1:] == [] or all(len(s) for s in steps)  # evaluation's adaptation is never cut


def test_the_registry_cells_meet_a_round_where_every_upload_is_lost(tmp_path):
    cell = small_cell(system=SYSTEM, **TINY)
    fed = make_federation(cell, tmp_path)
    lost = [bool(fed.system.dropped[r, fed.schedule[r]].all()) for r in range(cell.rounds)]
    assert lost == [False, True]  # round 1 aggregates some uploads, round 2 none
    assert fed.system.straggler[fed.schedule[0]].any()


@pytest.mark.parametrize("name", sorted(name for name, _ in ALGORITHMS.items()))
def test_every_algorithm_copes_with_stragglers_and_dropout_or_refuses(name, tmp_path):
    cell = small_cell(algorithm=name, system=SYSTEM, **TINY)
    refusal = get_algorithm(name).capabilities.refused_knobs
    if any(k in refusal for k in ("system", "system.dropout")):
        with pytest.raises(ValueError, match=f"algorithm '{name}' cannot run with system"):
            run_cell(cell, data_root=tmp_path)
        return
    result = run_cell(cell, data_root=tmp_path)
    assert result.status in ("finished", "diverged"), result.error
    assert result.status == "finished" or "non-finite" in result.error


@pytest.mark.parametrize("name", sorted(name for name, _ in ALGORITHMS.items()))
def test_every_algorithm_privatizes_its_uploads_or_refuses(name, tmp_path):
    cell = small_cell(algorithm=name, privacy={"epsilon": 8.0}, system={"dropout": 0.3}, **TINY)
    refusal = get_algorithm(name).capabilities.refused_knobs
    if any(k in refusal for k in ("privacy", "system", "system.dropout")):
        with pytest.raises(ValueError, match=f"algorithm '{name}' cannot run with"):
            run_cell(cell, data_root=tmp_path)
        return
    result = run_cell(cell, data_root=tmp_path)
    assert result.status in ("finished", "diverged"), result.error
    spent = [e for e in result.summary["privacy_epsilon"] if e is not None]
    assert spent and max(spent) <= 8.0 + 1e-9


# ---- privacy heterogeneity --------------------------------------------------------------------------
def test_the_reported_epsilon_is_the_accountants_and_within_each_budget(tmp_path):
    from opacus.accountants import RDPAccountant
    from opacus.accountants.utils import get_noise_multiplier

    cell = small_cell(privacy={"epsilon": [1, 8], "clip": 0.5}, system={"dropout": 0.3}, rounds=4, participation=0.6)
    result = run_cell(cell, data_root=tmp_path)
    s = result.summary
    schedule = make_federation(cell, tmp_path).schedule
    assert sorted(set(s["privacy_budget"])) == [1.0, 8.0]
    for c in range(5):
        n = int((schedule == c).sum())
        z = (
            get_noise_multiplier(
                target_epsilon=s["privacy_budget"][c],
                target_delta=1e-5,
                sample_rate=1.0,
                steps=n,
                accountant="rdp",
                alphas=ALPHAS,
            )
            if n
            else 0.0
        )
        assert s["privacy_noise_multiplier"][c] == pytest.approx(z)
        accountant = RDPAccountant()
        for _ in range(s["privacy_releases"][c]):
            accountant.step(noise_multiplier=z, sample_rate=1.0)
        expected = accountant.get_epsilon(1e-5, alphas=ALPHAS) if s["privacy_releases"][c] else 0.0
        assert s["privacy_epsilon"][c] == pytest.approx(expected)
        assert s["privacy_epsilon"][c] <= s["privacy_budget"][c] + 1e-9
        assert s["privacy_releases"][c] <= n
    uploads = (result.metrics.groupby(["round", "client"])["bytes_up"].first() > 0).groupby("client").sum()
    assert uploads.tolist() == s["privacy_releases"]  # a release is an upload that arrived
    assert s["privacy_epsilon_max"] == max(s["privacy_epsilon"])


@pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")  # the absurd budget below
def test_updates_are_clipped_and_the_noise_is_the_same_for_the_same_seed():
    schedule = np.array([[0, 1], [0, 1]])
    plan = PrivacyPlan(PrivacyParams(epsilon=1e6, clip=0.5), 2, schedule, seed=0)  # almost no noise
    update = {"w": torch.full((10, 10), 1.0), "steps": torch.tensor(7)}
    out = plan.privatize(1, 0, update)
    assert float(out["w"].norm()) == pytest.approx(0.5, rel=1e-3) and int(out["steps"]) == 7
    noisy = PrivacyPlan(PrivacyParams(epsilon=1.0), 2, schedule, seed=0)
    again = PrivacyPlan(PrivacyParams(epsilon=1.0), 2, schedule, seed=0)
    assert torch.equal(noisy.privatize(1, 0, update)["w"], again.privatize(1, 0, update)["w"])
    assert not torch.equal(noisy.privatize(2, 0, update)["w"], noisy.privatize(1, 0, update)["w"])


def test_a_tiny_budget_costs_accuracy(tmp_path):
    cell = small_cell(rounds=4, participation=1.0)
    plain = run_cell(cell, data_root=tmp_path)
    private = run_cell(cell.model_copy(update={"privacy": {"epsilon": 0.5}}), data_root=tmp_path)
    assert private.summary["final_accuracy"] < plain.summary["final_accuracy"] - 0.2
    assert max(private.summary["privacy_epsilon"]) <= 0.5
