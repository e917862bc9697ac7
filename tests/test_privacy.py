"""The privacy knob's guarantees (pflbench/simulator/privacy.py): BatchNorm statistics stay on the clients under
DP, the neighbouring relation, the noise's size, and central DP (DP-FedAvg) with its accounting."""

import numpy as np
import pytest
import torch

from cells import federation as make_federation, small_cell
from pflbench.algorithm import get_algorithm
from pflbench.config import cell_hash
from pflbench.simulator.rounds import run_cell
from pflbench.simulator.privacy import ALPHAS, CentralPrivacyPlan, PrivacyParams, PrivacyPlan
from pflbench.run.spec import parse_spec
from pflbench.run.spec_problems import SpecError
from pflbench.payload import Payload

get_algorithm("fedavg")  # registers the built-in algorithms
# Generated 32x32 RGB images: the reproduction (FedAvg, epsilon 15, clip 1) on a small pool.
IMAGES = dict(
    dataset="synthetic-images",
    dataset_options={"channels": 3, "size": 32, "num_samples": 600},
    partition="iid",
    partition_params={},
    clients=5,
    rounds=3,
    lr=0.05,
    batch_size=16,
    privacy={"epsilon": 15.0, "clip": 1.0},
)
STATISTICS = {
    "bn1.running_mean",
    "bn1.running_var",
    "bn1.num_batches_tracked",
    "bn2.running_mean",
    "bn2.running_var",
    "bn2.num_batches_tracked",
}


def _spec(**defaults):
    return {"matrix": {"algorithm": ["fedavg"], "dataset": "synthetic"}, "defaults": defaults}


# ---- item 2: BatchNorm statistics under DP ------------------------------------------------------------
@pytest.mark.parametrize("mode", ["local", "central"])
def test_batchnorm_statistics_stay_on_the_clients_under_dp(mode, tmp_path, monkeypatch):
    """Before: the noised running_var deltas were averaged, the variance went negative and the cell
    ended "diverged: non-finite test loss" at round 3. Now the statistics never leave a client."""
    fedavg = get_algorithm("fedavg")
    arrived, servers = [], []
    original = fedavg.aggregate

    def aggregate(self, rnd, upload):
        arrived.append(upload.state)
        original(self, rnd, upload)
        servers.append({n: self.global_state[n].clone() for n in STATISTICS})
        clients_own.append({n: self.client_state[n].clone() for n in ("bn1.running_var",)})

    clients_own = []
    monkeypatch.setattr(fedavg, "aggregate", aggregate)
    cell = small_cell(model="cnn-bn", **{**IMAGES, "privacy": {**IMAGES["privacy"], "mode": mode}})
    result = run_cell(cell, data_root=tmp_path)
    assert result.status == "finished", result.error
    assert np.isfinite(result.metrics[["accuracy", "loss", "val_loss"]].to_numpy()).all()
    # what is uploaded: the parameters (BatchNorm's weight and bias included), never its statistics
    names = set(arrived[0])
    assert not names & STATISTICS and {"bn1.weight", "bn1.bias", "conv1.weight"} <= names
    fed = make_federation(cell, tmp_path)
    shared = {n: t[:1] for n, t in fed.init_state(1).items() if n not in STATISTICS}
    per_client = int(Payload.from_state(shared, torch.zeros(1)).nbytes.sum())
    assert (result.rounds["bytes_up"] == per_client * result.rounds["clients"]).all()
    assert sorted(result.summary["privacy_kept_on_clients"]) == sorted(STATISTICS)
    # the server's copy never moves; each client's model keeps the statistics of its own data
    initial = fed.init_state(1)
    assert all(torch.equal(server[n], initial[n]) for server in servers for n in STATISTICS)
    own = clients_own[-1]["bn1.running_var"]
    assert not torch.allclose(own, initial["bn1.running_var"].expand_as(own))
    assert (own > 0).all()


def test_without_batchnorm_the_upload_is_unchanged_by_the_rule(tmp_path):
    cell = small_cell(model="cnn", **IMAGES)
    assert make_federation(cell, tmp_path).privacy.kept_local == frozenset()


# ---- item 4: the neighbouring relation -----------------------------------------------------------------
def test_relation_and_mode_at_their_defaults_keep_the_cell_hash():
    plain = parse_spec(_spec(**{"privacy.epsilon": 8})).cells[0]
    explicit = parse_spec(
        _spec(**{"privacy.epsilon": 8, "privacy.relation": "add_remove", "privacy.mode": "local"})
    ).cells[0]
    assert cell_hash(explicit) == cell_hash(plain) and explicit.privacy == {"epsilon": 8.0}
    replace = parse_spec(_spec(**{"privacy.epsilon": 8, "privacy.relation": "replace"})).cells[0]
    central = parse_spec(_spec(**{"privacy.epsilon": 8, "privacy.mode": "central"})).cells[0]
    assert replace.privacy == {"epsilon": 8.0, "relation": "replace"} and central.privacy["mode"] == "central"
    assert len({cell_hash(plain), cell_hash(replace), cell_hash(central)}) == 3


@pytest.mark.parametrize(
    "defaults, message",
    [
        (
            {"privacy.epsilon": 8, "privacy.relation": "swap"},
            r"privacy.relation: Input should be 'add_remove' or 'replace' .*allowed: .*relation \(add_remove \| replace",
        ),
        ({"privacy.epsilon": 8, "privacy.mode": "server"}, r"privacy.mode: Input should be 'local' or 'central'"),
        ({"privacy.epsilon": [1, 8], "privacy.mode": "central"}, r"central DP has one budget for the whole population"),
        (
            {"privacy.epsilon": 8, "privacy.relation": True},
            r"privacy.relation: Input should be 'add_remove' or 'replace'",
        ),
        ({"privacy.relation": "replace"}, r"privacy.epsilon is required"),
    ],
)
def test_bad_relation_or_mode_is_one_clear_error(defaults, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(_spec(**defaults))


@pytest.mark.parametrize("relation, factor", [("add_remove", 1.0), ("replace", 2.0)])
def test_local_noise_has_standard_deviation_z_times_the_sensitivity(relation, factor):
    """A zero update (nothing to clip) comes back as pure noise: per coordinate N(0, (z S)^2), S = clip
    under add/remove and 2 clip under replace, z the accountant's for the budget."""
    schedule = np.array([[0], [0], [0]])
    plan = PrivacyPlan(PrivacyParams(epsilon=4.0, clip=0.5, relation=relation), 1, schedule, seed=0)
    z = plan.z[0]
    assert 0.5 < z < 5
    zero = {"w": torch.zeros(400, 500), "b": torch.zeros(1000)}
    noise = torch.cat([t.flatten() for t in plan.privatize(1, 0, zero).values()]).double()
    # 201,000 draws: the sample std is within 0.5% of the true one with probability > 0.99
    assert float(noise.std()) == pytest.approx(z * 0.5 * factor, rel=0.005)
    assert abs(float(noise.mean())) < 4 * z * 0.5 * factor / noise.numel() ** 0.5
    # the same budget and clip: `replace` is calibrated to the same z and adds twice the noise
    assert plan.params.sensitivity == pytest.approx(0.5 * factor)


def test_the_summary_states_the_relation_and_the_mode(tmp_path):
    cell = small_cell(rounds=2, privacy={"epsilon": 8.0, "relation": "replace"})
    summary = run_cell(cell, data_root=tmp_path).summary
    assert summary["privacy_relation"] == "replace" and summary["privacy_mode"] == "local"
    assert summary["privacy_sensitivity"] == pytest.approx(2.0)
    default = run_cell(cell.model_copy(update={"privacy": {"epsilon": 8.0}}), data_root=tmp_path).summary
    assert default["privacy_relation"] == "add_remove" and default["privacy_sensitivity"] == pytest.approx(1.0)


# ---- item 5: central DP --------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")  # the absurd budget below
@pytest.mark.parametrize("relation, factor", [("add_remove", 1.0), ("replace", 2.0)])
def test_central_noise_is_on_the_sum(relation, factor):
    schedule = np.zeros((10, 4), dtype=int)
    plan = CentralPrivacyPlan(
        PrivacyParams(epsilon=4.0, clip=0.5, mode="central", relation=relation), schedule, population=8, seed=0
    )
    assert plan.sample_rate == 0.5
    zeros = [{"w": torch.zeros(400, 500)} for _ in range(4)]
    mean = plan.noised_mean(1, zeros)["w"].double()
    assert float(mean.std()) == pytest.approx(plan.z * 0.5 * factor / 4, rel=0.005)  # z S on the sum, / K
    big = [{"w": torch.full((10,), 3.0 * k)} for k in range(1, 5)]  # norms > clip: each clipped to 0.5
    # Clipping does not depend on sampling: every client sampled (rate 1) calibrates this absurd budget's
    # z in seconds, where rate 0.5's subsampled accountant took ~40 s on a loaded machine.
    quiet = CentralPrivacyPlan(PrivacyParams(epsilon=1e7, clip=0.5, mode="central"), schedule, 4, seed=0)
    assert quiet.sample_rate == 1.0
    clipped = quiet.noised_mean(1, big)["w"]
    assert float(clipped.norm()) == pytest.approx(0.5, rel=1e-3)  # the mean of four updates of norm 0.5


def test_central_dp_accounts_the_subsampled_gaussian_and_every_client_receives_one_mean(tmp_path, monkeypatch):
    from opacus.accountants import RDPAccountant
    from opacus.accountants.utils import get_noise_multiplier

    fedavg = get_algorithm("fedavg")
    uploads = []
    original = fedavg.aggregate
    monkeypatch.setattr(
        fedavg, "aggregate", lambda self, rnd, upload: (uploads.append(upload.state), original(self, rnd, upload))
    )
    cell = small_cell(rounds=4, participation=0.6, privacy={"epsilon": 3.0, "mode": "central"}, system={"dropout": 0.3})
    result = run_cell(cell, data_root=tmp_path)
    s = result.summary
    assert result.status == "finished" and s["privacy_mode"] == "central"
    assert s["privacy_sampling_rate"] == pytest.approx(3 / 5)
    z = get_noise_multiplier(
        target_epsilon=3.0, target_delta=1e-5, sample_rate=0.6, steps=4, accountant="rdp", alphas=ALPHAS
    )
    assert s["privacy_noise_multiplier"] == pytest.approx(z)
    accountant = RDPAccountant()
    for _ in range(s["privacy_releases"]):
        accountant.step(noise_multiplier=z, sample_rate=0.6)
    assert s["privacy_epsilon"] == pytest.approx(accountant.get_epsilon(1e-5, alphas=ALPHAS))
    assert s["privacy_epsilon"] <= 3.0 + 1e-9
    assert s["privacy_releases"] == len(uploads) == int((result.rounds["bytes_up"] > 0).sum())
    for upload in uploads:  # one noised mean, whatever the clients' data sizes
        for t in upload.values():
            assert all(torch.equal(t[0], row) for row in t)


def test_the_servers_model_gets_the_noise_of_one_mechanism_not_of_every_client(tmp_path, monkeypatch):
    """One round at a vanishing learning rate (updates ~ 0): the aggregated model moves by the noise
    alone: under local DP z C sqrt(sum of squared aggregation weights), under central DP z C / K."""
    fedavg = get_algorithm("fedavg")
    moved = {}
    original = fedavg.aggregate

    def aggregate(self, rnd, upload):
        before = {n: t.clone() for n, t in self.global_state.items()}
        original(self, rnd, upload)
        moved[self.engine.privacy.mode] = torch.cat(
            [(self.global_state[n] - before[n]).flatten() for n in upload.state if before[n].is_floating_point()]
        )
        weights = self.engine.train_sizes[upload.clients].double()
        moved["weights"] = weights / weights.sum()

    monkeypatch.setattr(fedavg, "aggregate", aggregate)
    cell = small_cell(rounds=1, participation=1.0, clients=10, lr=1e-9, privacy={"epsilon": 4.0, "clip": 0.5})
    z = run_cell(cell, data_root=tmp_path).summary["privacy_noise_multiplier"][0]
    run_cell(cell.model_copy(update={"privacy": {"epsilon": 4.0, "clip": 0.5, "mode": "central"}}), data_root=tmp_path)
    local_std = z * 0.5 * float((moved["weights"] ** 2).sum().sqrt())
    assert float(moved["local"].std()) == pytest.approx(local_std, rel=0.05)
    assert float(moved["central"].std()) == pytest.approx(z * 0.5 / 10, rel=0.05)
    assert float(moved["local"].std()) > 3 * float(moved["central"].std())


@pytest.mark.parametrize("name", ["pfedla", "heurpfedla", "pfedhn", "pfedhn-pc", "mh-pfedhn"])
def test_algorithms_whose_server_needs_each_update_refuse_central_dp(name):
    spec = {
        "matrix": {"algorithm": [name], "dataset": "synthetic"},
        "defaults": {"privacy.epsilon": 8, "privacy.mode": "central"},
    }
    with pytest.raises(
        SpecError,
        match=rf"algorithm '{name}' cannot run with privacy.mode: central DP hands "
        r"the server one noised sum.*algorithms that can: .*fedavg",
    ):
        parse_spec(spec)
    parse_spec({**spec, "defaults": {"privacy.epsilon": 8}})  # local DP: still runs


# ---- the numbers the documents quote, and the report's caption ----------------------------------------
def test_the_noise_multiplier_for_epsilon_8_over_20_uploads_and_its_replace_equivalent():
    from pflbench.simulator.privacy import epsilon_spent, noise_multiplier

    z = noise_multiplier(8.0, 1e-5, 20)
    assert z == pytest.approx(2.85, abs=0.01)  # heterogeneity.yaml's comment (it said "about 2")
    # the same noise read under `replace` (sensitivity 2 clip: multiplier z / 2) spends about 19
    assert epsilon_spent(z / 2, 20, 1e-5) == pytest.approx(18.8, abs=0.1)


def test_report_captions_state_the_relation_where_privacy_columns_are_shown():
    from pflbench.reports.heterogeneity import CopeTable

    caption = CopeTable("ctx", ["off", "privacy.epsilon=8.0"], []).caption
    assert "neighbouring relation add/remove (sensitivity = clip)" in caption and "privacy.mode=central" in caption
    assert "neighbouring" not in CopeTable("ctx", ["off", "system.dropout=0.3"], []).caption


def test_privacy_is_a_wrapper_and_the_round_driver_has_no_privacy_branch(tmp_path):
    """The rounds drive `DifferentiallyPrivate(algorithm)` under the knob; run_round never names privacy."""
    import inspect

    from pflbench.simulator import rounds
    from pflbench.algorithm import get_algorithm
    from pflbench.simulator.privacy import DifferentiallyPrivate, with_privacy

    assert "privacy" not in inspect.getsource(rounds.run_round)
    on = make_federation(small_cell(privacy={"epsilon": 8.0}), tmp_path)
    off = make_federation(small_cell(), tmp_path)
    fedavg, pfedhn = get_algorithm("fedavg"), get_algorithm("pfedhn")
    wrapped = with_privacy(fedavg(on, fedavg.parse_hyperparams({})))
    assert isinstance(wrapped, DifferentiallyPrivate) and wrapped.dp_upload == "model"
    assert not isinstance(with_privacy(fedavg(off, fedavg.parse_hyperparams({}))), DifferentiallyPrivate)
    per_client = pfedhn(on, pfedhn.parse_hyperparams({"server_updates": "per_client"}))
    assert per_client.updates_per_client and isinstance(with_privacy(per_client), DifferentiallyPrivate)
    assert "privacy" not in inspect.getsource(rounds.with_server)  # each upload delivered mid-round too
