"""Issue 15, part 2: the defaults and options that follow the papers' official code (FedRep's body
epochs, Ditto's lambda, Per-FedAvg's meta step, pFedMe's all-clients training and mu, pFedHN's
official inner optimizer, FedFomo's L1 distance, APFL's initial alpha). Each test checks behaviour,
not only the default's value: the default run is compared with an explicit computation."""

import pytest
import torch
import torch.nn.functional as F

from pflbench.kit.steps import step_ids
from pflbench.algorithms.apfl import APFL
from pflbench.algorithms.ditto import Ditto
from pflbench.algorithms.fedfomo import MODELS, WEIGHTS, FedFomo, fomo_weights
from pflbench.algorithms.fedrep import FedRep
from pflbench.algorithms.perfedavg import STREAMS, PerFedAvg
from pflbench.algorithms.pfedhn import PFedHN
from pflbench.algorithms.pfedme import PFedMe
from pflbench.simulator.rounds import run_cell, run_round
from pflbench.payload import Payload
from cells import assert_batched_matches_loop, federation as _federation, received, small_cell as _cell


def _make(alg_cls, fed, hp=None):
    alg = alg_cls(fed, alg_cls.parse_hyperparams(hp or {}))
    alg.setup()
    return alg


def _run(alg_cls, fed, hp=None, rounds=None):
    alg = _make(alg_cls, fed, hp)
    sent = [
        run_round(alg, rnd, torch.as_tensor(fed.schedule[rnd - 1])) for rnd in range(1, (rounds or fed.cell.rounds) + 1)
    ]
    return alg, sent


def _grad(fed, params, ids):
    """Gradient of the mean cross-entropy of one client's unstacked model on samples `ids`."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in params.items()}
    loss = F.cross_entropy(fed.model.forward_single(leaves, fed.features[ids], train=True), fed.labels[ids])
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def _distance(a, b, names):
    return torch.sqrt(sum(((a[n] - b[n]) ** 2).flatten(1).sum(1) for n in names))


def _start(alg, rnd, clients):
    """What the clients train from in round `rnd` (`receive`'s state)."""
    return received(alg, rnd, clients)[1]


def _local_train(alg, rnd, clients):
    """Round `rnd`'s local training of `clients`, from what they received."""
    return alg.local_train(*received(alg, rnd, clients))


# ---- FedRep: 10 head epochs, then 1 body epoch (lgcollins/FedRep --local_rep_ep 1) -------------------
def test_fedrep_trains_the_body_one_epoch_whatever_the_cells_local_epochs(tmp_path):
    assert (FedRep.Hyperparams().head_epochs, FedRep.Hyperparams().body_epochs) == (10, 1)
    fed = _federation(_cell(algorithm="fedrep", rounds=1, local_epochs=3), tmp_path)
    alg = _make(FedRep, fed)
    clients = torch.as_tensor(fed.schedule[0])
    start = _start(alg, 1, clients)
    calls = []
    train = fed.train

    def counting(*args, **kwargs):
        result = train(*args, **kwargs)
        calls.append((kwargs.get("epochs"), len(kwargs.get("trainable") or [])))
        return result

    fed.train = counting
    got = alg.local_train(fed.round(1, clients), start)
    fed.train = train
    head = ["fc3.weight", "fc3.bias"]
    body = [n for n in fed.model.param_names if n not in head]
    assert calls == [(10, len(head)), (1, len(body))]  # 10 head epochs, then 1 body epoch (not the cell's 3)
    after_head = fed.train(1, clients, start, trainable=head, epochs=10, stream=FedRep.HEAD_STREAM).state
    one = fed.train(1, clients, after_head, trainable=body, epochs=1).state
    three = fed.train(1, clients, after_head, trainable=body, epochs=3).state
    for n in fed.model.param_names:
        assert torch.equal(got[n], one[n]), n
    assert not torch.equal(got[body[0]], three[body[0]])
    # body_epochs: null gives the body the cell's local_epochs (the old default)
    old = _make(FedRep, fed, {"body_epochs": None}).local_train(fed.round(1, clients), start)
    assert all(torch.equal(old[n], three[n]) for n in fed.model.param_names)


# ---- Ditto: lambda = 1 (official fmnist scripts, FedRep's and FL-bench's re-implementations) ---------
def test_ditto_default_lambda_is_one_and_pulls_harder_than_the_old_default(tmp_path):
    assert Ditto.Hyperparams().lam == 1.0
    fed = _federation(_cell(algorithm="ditto", rounds=2), tmp_path)
    params = fed.model.param_names
    default, sent = _run(Ditto, fed)
    explicit, _ = _run(Ditto, fed, {"lam": 1.0})
    old, sent_old = _run(Ditto, fed, {"lam": 0.1})
    for n in fed.model.names:
        assert torch.equal(default.personal_state[n], explicit.personal_state[n]), n
    # v_k ends closer to the w^t it downloaded than with lambda = 0.1 (all clients sampled every round)
    near = _distance(default.personal_state, sent[-1][0].state, params)
    far = _distance(old.personal_state, sent_old[-1][0].state, params)
    assert (near < far).all(), (near, far)


# ---- Per-FedAvg: beta = 1e-3, independent of the cell's lr -----------------------------------------
def test_perfedavg_meta_step_is_beta_1e_3_and_not_the_cells_lr(tmp_path):
    assert PerFedAvg.Hyperparams().beta == 1e-3
    trained = {}
    for lr, hp in ((0.05, {}), (0.5, {}), (0.05, {"beta": None})):
        # 200 samples over 5 clients: one batch per client, so a round is one meta step
        cell = _cell(algorithm="perfedavg", dataset_options={"num_samples": 200}, batch_size=32, rounds=1, lr=lr)
        fed = _federation(cell, tmp_path)
        alg = _make(PerFedAvg, fed, hp)
        clients = torch.arange(fed.num_clients)
        trained[(lr, "beta" in hp)] = _local_train(alg, 1, clients)
    ids = [step_ids(fed, 1, clients, stream=s) for s in STREAMS[:2]]
    assert all((counts == 1).all() for _, counts in ids)
    w0 = {n: t[0] for n, t in fed.init_state(1).items()}
    names = fed.model.param_names
    alpha = PerFedAvg.Hyperparams().alpha
    for c in range(fed.num_clients):
        g1 = _grad(fed, w0, ids[0][0][c, 0])
        g = _grad(fed, {n: w0[n] - alpha * g1[n] for n in names}, ids[1][0][c, 0])
        for n in names:  # w - 1e-3 * grad f(w - alpha grad f(w; D); D'), at lr 0.05 and at lr 0.5
            for lr in (0.05, 0.5):
                torch.testing.assert_close(trained[(lr, False)][n][c], w0[n] - 1e-3 * g[n], atol=1e-7, rtol=1e-5)
            # beta: null is the old default, the cell's lr
            torch.testing.assert_close(trained[(0.05, True)][n][c], w0[n] - 0.05 * g[n], atol=1e-6, rtol=1e-5)


# ---- pFedMe: the official code's all-clients training and inner L2 term, as options --------------
def test_pfedme_trains_only_sampled_clients_by_default_and_every_client_with_the_option(tmp_path):
    assert PFedMe.Hyperparams().train_all_clients is False and PFedMe.Hyperparams().mu == 0.0
    cell = _cell(algorithm="pfedme", participation=0.4, rounds=1, hp={"personal_lr": 0.05})
    fed = _federation(cell, tmp_path)
    init = fed.init_state(fed.num_clients)
    sampled = torch.as_tensor(fed.schedule[0])
    others = [c for c in range(fed.num_clients) if c not in sampled.tolist()]
    assert len(sampled) == 2 and len(others) == 3
    first = fed.model.param_names[0]
    off, sent_off = _run(PFedMe, fed, cell.hp)
    on, sent_on = _run(PFedMe, fed, {**cell.hp, "train_all_clients": True})
    for c in sampled.tolist():  # sampled clients trained in both
        assert not torch.equal(off.personal_state[first][c], init[first][c])
    for c in others:  # unsampled: untouched by default, trained (from the global model) with the option
        assert torch.equal(off.personal_state[first][c], init[first][c])
        assert not torch.equal(on.personal_state[first][c], init[first][c])
    # the sampled clients' training and uploads do not depend on the option (same start, same batches)
    for n in fed.model.names:
        torch.testing.assert_close(on.personal_state[n][sampled], off.personal_state[n][sampled], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(sent_on[0][1].state[n], sent_off[0][1].state[n], atol=1e-6, rtol=1e-5)
    # an unsampled client's theta is what a sampled client's would be: train it alone, sampled
    solo = PFedMe(fed, PFedMe.parse_hyperparams(cell.hp))
    solo.setup()
    row = torch.tensor([others[0]])
    _local_train(solo, 1, row)
    for n in fed.model.names:
        torch.testing.assert_close(
            on.personal_state[n][others[0]], solo.personal_state[n][others[0]], atol=1e-6, rtol=1e-5
        )

    # honest communication: the option downloads to every client, uploads from the sampled ones only
    model_bytes = int(Payload.from_state(fed.init_state(1), torch.zeros(1)).nbytes[0])
    res_off = run_cell(cell.model_copy(update={"rounds": 2}), data_root=tmp_path)
    res_on = run_cell(
        cell.model_copy(update={"rounds": 2, "hp": {**cell.hp, "train_all_clients": True}}), data_root=tmp_path
    )
    assert (res_off.rounds["bytes_down"] == 2 * model_bytes).all()
    assert (res_on.rounds["bytes_down"] == 5 * model_bytes).all()
    assert (res_on.rounds["bytes_up"] == 2 * model_bytes).all() and res_on.rounds["bytes_up"].equals(
        res_off.rounds["bytes_up"]
    )


def test_pfedme_mu_adds_the_official_l2_term_to_the_inner_step(tmp_path):
    # one batch per client, K = 1, theta starting at w: theta = w - plr * (grad f(w) + mu * w)
    cell = _cell(algorithm="pfedme", dataset_options={"num_samples": 200}, batch_size=32, rounds=1)
    fed = _federation(cell, tmp_path)
    clients = torch.arange(fed.num_clients)
    w0 = {n: t[0] for n, t in fed.init_state(1).items()}
    ids, counts = step_ids(fed, 1, clients)
    assert (counts == 1).all()
    for mu in (0.0, 0.5):
        alg = _make(PFedMe, fed, {"k": 1, "personal_lr": 0.05, "mu": mu})
        _local_train(alg, 1, clients)
        for c in range(fed.num_clients):
            g = _grad(fed, w0, ids[c, 0])
            for n in fed.model.param_names:
                torch.testing.assert_close(
                    alg.personal_state[n][c], w0[n] - 0.05 * (g[n] + mu * w0[n]), atol=1e-6, rtol=1e-5
                )


# ---- pFedHN: the official inner optimizer as an option ---------------------------------------------
def _official_by_hand(fed, rnd, client, start, steps, clip):
    """torch.optim.SGD(lr 5e-3, momentum 0.9, weight decay 5e-5) with clip_grad_norm_(clip), as the
    official trainer, on the engine's batch plan for `client`."""
    ids, _ = step_ids(fed, rnd, torch.tensor([client]), steps=steps)
    params = {n: start[n][0].detach().clone().requires_grad_(True) for n in fed.model.param_names}
    opt = torch.optim.SGD(list(params.values()), lr=5e-3, momentum=0.9, weight_decay=5e-5)
    for step in range(steps):
        opt.zero_grad()
        batch = ids[0, step]
        F.cross_entropy(fed.model.forward_single(params, fed.features[batch], train=True), fed.labels[batch]).backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        opt.step()
    return {n: p.detach() for n, p in params.items()}


@pytest.mark.parametrize("clip", [50.0, 0.05])  # 0.05: the clip acts on every step
def test_pfedhn_official_inner_optimizer_matches_torch_sgd_with_clipping(tmp_path, clip):
    assert PFedHN.Hyperparams().inner_optimizer == "cell"
    fed = _federation(_cell(algorithm="pfedhn", lr=0.5, momentum=0.0), tmp_path)  # the cell's optimizer is ignored
    alg = _make(PFedHN, fed, {"inner_optimizer": "official", "inner_steps": 4})
    alg.OFFICIAL_INNER_CLIP = clip
    row = torch.tensor([2])
    start = _start(alg, 1, row)
    got = alg.inner_train(1, row, start)
    expected = _official_by_hand(fed, 1, 2, start, 4, clip)
    for n in fed.model.param_names:
        torch.testing.assert_close(got[n][0], expected[n], atol=1e-6, rtol=1e-5)
        assert not torch.equal(got[n], start[n])
    # the default ("cell") is the engine's SGD with the cell's optimizer
    cell_alg = _make(PFedHN, fed, {"inner_steps": 4})
    default = cell_alg.inner_train(1, row, start)
    reference = fed.train(1, row, start, steps=4).state
    assert all(torch.equal(default[n], reference[n]) for n in fed.model.names)
    assert not torch.allclose(default[fed.model.param_names[0]], got[fed.model.param_names[0]])


def test_pfedhn_official_inner_optimizer_runs_in_both_server_update_modes(tmp_path):
    for mode in ("per_client", "per_round"):
        result = run_cell(
            _cell(
                algorithm="pfedhn",
                rounds=2,
                participation=0.6,
                hp={"inner_optimizer": "official", "inner_steps": 10, "server_updates": mode},
            ),
            data_root=tmp_path,
        )
        assert result.status == "finished", result.error


# ---- FedFomo: L1 distance (NVlabs/FedFomo --model_delta_norm l1) -------------------------------------
def test_fedfomo_weights_divide_by_the_l1_distance_by_default(tmp_path):
    assert FedFomo.Hyperparams().norm == "l1"
    fed = _federation(_cell(algorithm="fedfomo", rounds=2, hp={"models": 2}), tmp_path)
    alg, _ = _run(FedFomo, fed, {"models": 2}, rounds=1)  # everyone has uploaded once
    clients = torch.as_tensor(fed.schedule[1])
    own = {n: t[clients].clone() for n, t in alg.client_state.items()}
    rnd, state = received(alg, 2, clients)
    download, raw = rnd.download.state, state[WEIGHTS]
    k, count = rnd.download.header[MODELS].shape
    assert count == 2
    _, own_loss = fed.evaluate(own, alg.eval_split, clients)
    l1 = torch.zeros(k, count, dtype=torch.float64)
    l2 = torch.zeros(k, count, dtype=torch.float64)
    cand_loss = torch.zeros(k, count)
    for m in range(count):
        cand = {n: download[f"model{m}.{n}"] for n in fed.model.names}
        _, cand_loss[:, m] = fed.evaluate(cand, alg.eval_split, clients)
        for n in fed.model.param_names:
            diff = (cand[n] - own[n]).flatten(1).double()
            l1[:, m] += diff.abs().sum(1)
            l2[:, m] += (diff**2).sum(1)
    expected = fomo_weights(own_loss, cand_loss, l1.to(own_loss.dtype))
    torch.testing.assert_close(raw, expected.cpu(), atol=1e-6, rtol=1e-4)
    assert (raw != 0).any()
    # and not the L2 weights (the old default), which are larger by ||d||_1 / ||d||_2 > 1
    with_l2 = fomo_weights(own_loss, cand_loss, l2.sqrt().to(own_loss.dtype))
    assert not torch.allclose(raw, with_l2.cpu())


# ---- APFL: alpha starts at 0.5 (FedTorch, FL-bench) --------------------------------------------------
def test_apfl_starts_from_alpha_one_half_and_evaluates_that_mixture(tmp_path):
    assert APFL.Hyperparams().alpha == 0.5
    fed = _federation(_cell(algorithm="apfl", rounds=2), tmp_path)
    fixed, _ = _run(APFL, fed, {"learn_alpha": False})
    assert torch.equal(fixed.alpha, torch.full((fed.num_clients,), 0.5))
    personal = fixed.personalized()
    for n in fed.model.param_names:  # the evaluated model is (v_i + w) / 2
        glob = fixed.global_state[n].expand_as(fixed.local_state[n])
        torch.testing.assert_close(personal[n], 0.5 * fixed.local_state[n] + 0.5 * glob)
    learned, _ = _run(APFL, fed)  # the adaptive default moves alpha away from 0.5
    assert not torch.allclose(learned.alpha, torch.full_like(learned.alpha, 0.5))


# ---- the new options, batched and looped ------------------------------------------------------------
@pytest.mark.parametrize(
    "algorithm,hp",
    [
        ("pfedme", {"train_all_clients": True, "mu": 1e-3}),
        ("pfedhn", {"inner_optimizer": "official", "inner_steps": 5, "server_updates": "per_round"}),
    ],
)
def test_options_batched_path_matches_client_loop(tmp_path, algorithm, hp):
    cell = _cell(
        algorithm=algorithm, hp=hp, rounds=2, participation=0.6, partition="dirichlet", partition_params={"alpha": 0.5}
    )
    assert_batched_matches_loop(cell, tmp_path)
