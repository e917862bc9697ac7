"""The federation engine: batched vs loop training, determinism, accounting, FedAvg/Local/FedBN."""

import numpy as np
import pytest
import torch

from pflbench.simulator.execution import ExecutionOptions
from pflbench.config import CellConfig
from pflbench.simulator.federation import sample_schedule
from pflbench.simulator.rounds import run_cell
from pflbench.simulator.models import build_model
from pflbench.simulator.client_model import ClientModel
from pflbench.simulator.training import SGD, batch_plan, evaluate_client_splits, train_clients


def _clients(sizes):
    starts = np.cumsum([0, *sizes])
    return [torch.arange(a, b) for a, b in zip(starts[:-1], starts[1:])]


@pytest.mark.parametrize(
    "model_name,shape,steps,tolerance",
    [
        ("cnn", (1, 28, 28), None, 1e-5),  # two local epochs, momentum and weight decay
        ("cnn-bn", (3, 32, 32), 3, 1e-4),  # BatchNorm: batch statistics and running buffers
        ("mlp", (60,), None, 1e-5),
    ],
)
def test_batched_path_matches_client_loop_for_unequal_clients(model_name, shape, steps, tolerance):
    torch.manual_seed(0)
    sizes = [70, 33, 129, 5, 64]  # unequal: clients finish after different numbers of steps
    features, labels = torch.randn(sum(sizes), *shape), torch.randint(0, 10, (sum(sizes),))
    model = ClientModel(build_model(model_name, shape, 10))
    start = model.init(len(sizes), seed=1)
    start = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in start.items()}

    def plans():
        return batch_plan(sizes, 32, 2, steps, [torch.Generator().manual_seed(i) for i in range(len(sizes))])

    assert [len(p) for p in plans()][:4] == ([6, 4, 10, 2] if steps is None else [3] * 4)
    sgd = SGD(lr=0.05, momentum=0.9, weight_decay=1e-3)
    idx = _clients(sizes)
    batched, loss_b = train_clients(model, start, features, labels, idx, plans(), sgd, batched=True)
    looped, loss_l = train_clients(model, start, features, labels, idx, plans(), sgd, batched=False)
    for name in model.names:
        assert (
            not torch.equal(batched[name], start[name]) or "num_batches" in name or not start[name].is_floating_point()
        )
        torch.testing.assert_close(batched[name], looped[name], atol=tolerance, rtol=1e-4, msg=name)
    torch.testing.assert_close(loss_b, loss_l, atol=1e-5, rtol=1e-5)
    acc_b, eval_loss_b = evaluate_client_splits(model, batched, features, labels, [idx], batched=True)[0]
    acc_l, eval_loss_l = evaluate_client_splits(model, batched, features, labels, [idx], batched=False)[0]
    torch.testing.assert_close(acc_b, acc_l)
    torch.testing.assert_close(eval_loss_b, eval_loss_l, atol=1e-5, rtol=1e-5)


def test_each_client_gets_exactly_its_own_updates():
    """A client trained alongside others ends where it ends when trained alone."""
    torch.manual_seed(0)
    sizes = [40, 100]
    features, labels = torch.randn(140, 60), torch.randint(0, 10, (140,))
    model = ClientModel(build_model("mlp", (60,), 10))
    start = model.init(2, seed=0)
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(2)]  # noqa: E731
    both, _ = train_clients(
        model,
        start,
        features,
        labels,
        _clients(sizes),
        batch_plan(sizes, 16, 1, None, gens()),
        SGD(0.1, 0.5),
        batched=True,
    )
    alone, _ = train_clients(
        model,
        {k: v[:1] for k, v in start.items()},
        features,
        labels,
        _clients(sizes)[:1],
        batch_plan(sizes, 16, 1, None, gens())[:1],
        SGD(0.1, 0.5),
        batched=True,
    )
    for name in model.names:
        torch.testing.assert_close(both[name][:1], alone[name], atol=1e-6, rtol=1e-5)


def test_batch_plan_covers_every_sample_each_epoch():
    plan = batch_plan([70], 32, 3, None, [torch.Generator().manual_seed(0)])[0]
    assert plan.shape == (9, 32)  # ceil(70 / 32) = 3 full batches per epoch
    for epoch in plan.view(3, -1):
        assert set(epoch.tolist()) == set(range(70))
    small = batch_plan([5], 32, 1, None, [torch.Generator().manual_seed(0)])[0]
    assert small.shape == (1, 32) and set(small.flatten().tolist()) == set(range(5))
    assert batch_plan([70], 32, 1, 7, [torch.Generator().manual_seed(0)])[0].shape == (7, 32)


def test_sampling_schedule_is_fixed_by_the_seed():
    a = sample_schedule(100, 0.1, 50, seed=3)
    assert a.shape == (50, 10) and all(len(set(r)) == 10 for r in a)
    np.testing.assert_array_equal(a, sample_schedule(100, 0.1, 50, seed=3))
    assert not np.array_equal(a, sample_schedule(100, 0.1, 50, seed=4))


def _cell(**overrides):
    base = dict(
        algorithm="fedavg",
        dataset="synthetic",
        dataset_options={"num_samples": 1500},
        partition="iid",
        clients=5,
        rounds=3,
        local_epochs=1,
        batch_size=16,
        lr=0.05,
        seed=0,
    )
    return CellConfig(**{**base, **overrides})


def test_same_seed_same_metrics_different_seed_different_partition(tmp_path):
    first = run_cell(_cell(), data_root=tmp_path)
    again = run_cell(_cell(), data_root=tmp_path)
    other = run_cell(_cell(seed=1), data_root=tmp_path)
    cols = ["round", "client", "accuracy", "loss", "bytes_up", "bytes_down"]
    assert first.status == "finished"
    assert first.metrics[cols].equals(again.metrics[cols])
    assert not first.metrics["accuracy"].equals(other.metrics["accuracy"])
    from pflbench.simulator.rounds import prepare_cell

    _, splits0 = prepare_cell(_cell(), tmp_path)
    _, splits1 = prepare_cell(_cell(seed=1), tmp_path)
    assert not all(np.array_equal(a, b) for a, b in zip(splits0.train, splits1.train))


def test_client_batching_on_and_off_give_the_same_run(tmp_path):
    cell = _cell(
        dataset="synthetic-images",
        dataset_options={"num_samples": 600},
        partition="pathological",
        partition_params={"classes_per_client": 2},
        participation=0.6,
        rounds=2,
        algorithm="fedbn",
        model="cnn-bn",
    )
    on = run_cell(cell, data_root=tmp_path, execution=ExecutionOptions(client_batching="on"))
    off = run_cell(cell, data_root=tmp_path, execution=ExecutionOptions(client_batching="off"))
    assert on.summary["client_batching"] == "batched" and off.summary["client_batching"] == "loop"
    # a near-tie may flip one test sample (1/36 of a client) between the paths
    np.testing.assert_allclose(on.metrics["accuracy"], off.metrics["accuracy"], atol=0.05)
    np.testing.assert_allclose(on.metrics["loss"], off.metrics["loss"], rtol=1e-2)


def test_fedavg_beats_local_on_iid_data_and_reaches_stated_accuracy(tmp_path):
    # 1000 generated images over 10 clients: 70 training images each, too few for a CNN alone.
    common = dict(
        dataset="synthetic-images",
        dataset_options={"num_samples": 1000},
        clients=10,
        rounds=10,
        local_epochs=2,
        lr=0.02,
        momentum=0.9,
    )
    fedavg = run_cell(_cell(algorithm="fedavg", **common), data_root=tmp_path)
    local = run_cell(_cell(algorithm="local", **common), data_root=tmp_path)
    # measured: FedAvg 0.51, Local 0.41 after 10 rounds; chance is 0.10
    assert fedavg.summary["final_accuracy"] > local.summary["final_accuracy"] + 0.05
    assert fedavg.summary["final_accuracy"] >= 0.45
    assert local.summary["bytes_up_total"] == 0 and local.summary["bytes_down_total"] == 0


def test_communication_accounting_fedavg_and_fedbn(tmp_path):
    cell = _cell(
        dataset="synthetic-images",
        dataset_options={"num_samples": 400, "channels": 3, "size": 32},
        model="cnn-bn",
        rounds=2,
        participation=0.6,
    )
    fedavg = run_cell(cell, data_root=tmp_path)
    fedbn = run_cell(cell.model_copy(update={"algorithm": "fedbn"}), data_root=tmp_path)
    model = ClientModel(build_model("cnn-bn", (3, 32, 32), 10))
    full = sum(4 * model.numel([n]) if "num_batches" not in n else 8 for n in model.names)
    bn = sum(4 * model.numel([n]) if "num_batches" not in n else 8 for n in model.batchnorm_names)
    assert bn > 0 and model.batchnorm_names == {
        f"bn{i}.{k}" for i in (1, 2) for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    }
    per_round = 3  # 60% of 5 clients
    assert (fedavg.rounds["bytes_up"] == per_round * full).all()
    assert (fedavg.rounds["bytes_down"] == per_round * full).all()
    # FedBN never sends BatchNorm parameters or statistics, either way.
    assert (fedbn.rounds["bytes_up"] == per_round * (full - bn)).all()
    assert (fedbn.rounds["bytes_down"] == per_round * (full - bn)).all()
    # Per client: only the sampled ones exchanged anything in a round.
    last = fedavg.metrics[fedavg.metrics["round"] == 2]
    assert sorted(last["bytes_up"].unique().tolist()) == [0, full] and (last["bytes_up"] > 0).sum() == per_round


def test_divergence_is_a_result_not_a_crash(tmp_path):
    result = run_cell(_cell(lr=1e12, rounds=3), data_root=tmp_path)
    assert result.status == "diverged" and result.summary["diverged_round"] == 1
    assert "non-finite" in result.error


def test_bad_hyperparameter_is_named():
    with pytest.raises(ValueError, match="bad hyperparameters for algorithm 'fedavg'.*mu"):
        run_cell(_cell(hp={"mu": 0.1}))


def test_worked_example_in_algorithms_readme_runs(tmp_path, monkeypatch):
    """The README's example algorithm is real code: with mu = 0 it is FedAvg, bit for bit."""
    import re
    from pathlib import Path

    from pflbench.algorithm import ALGORITHMS, get_algorithm

    text = (Path(__file__).parents[1] / "pflbench" / "algorithms" / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    get_algorithm("fedavg")  # the built-ins first, so the copy below holds them
    monkeypatch.setattr(ALGORITHMS, "_entries", dict(ALGORITHMS._entries))  # registration undone after the test
    exec(compile(code, "pflbench/algorithms/README.md", "exec"), {})
    fedavg = run_cell(_cell(rounds=2), data_root=tmp_path)
    prox0 = run_cell(_cell(rounds=2, algorithm="myprox", hp={"mu": 0.0}), data_root=tmp_path)
    prox = run_cell(_cell(rounds=2, algorithm="myprox", hp={"mu": 10.0}), data_root=tmp_path)
    assert prox0.metrics["loss"].equals(fedavg.metrics["loss"])
    assert not prox.metrics["loss"].equals(fedavg.metrics["loss"])


@pytest.mark.parametrize("native", [True, False])
def test_native_twin_and_vmap_fallback_both_match_the_loop(native):
    torch.manual_seed(0)
    sizes = [40, 17, 64]
    features, labels = torch.randn(sum(sizes), 3, 32, 32), torch.randint(0, 10, (sum(sizes),))
    model = ClientModel(build_model("cnn-bn", (3, 32, 32), 10), native=native)
    assert (model._twins[False] is not None) == native
    start = model.init(3, seed=0)
    plans = lambda: batch_plan(sizes, 16, 1, None, [torch.Generator().manual_seed(i) for i in range(3)])  # noqa: E731
    batched, _ = train_clients(model, start, features, labels, _clients(sizes), plans(), SGD(0.05, 0.9), batched=True)
    looped, _ = train_clients(model, start, features, labels, _clients(sizes), plans(), SGD(0.05, 0.9), batched=False)
    for name in model.names:
        torch.testing.assert_close(batched[name], looped[name], atol=1e-4, rtol=1e-4, msg=name)


def test_grouped_convolution_twin_equals_convolution_loop():
    """The CUDA twin (grouped convolutions) computes what the CPU twin (a loop) computes."""
    from torch.func import functional_call

    from pflbench.simulator.batching import stacked_twin

    module = build_model("cnn-bn", (3, 32, 32), 10)
    state = ClientModel(module).init(4, seed=0)
    state = {k: v + 0.1 * torch.randn_like(v) if v.is_floating_point() else v for k, v in state.items()}
    x = torch.randn(4 * 8, 3, 32, 32)
    outputs, grads = [], []
    for grouped in (False, True):
        twin = stacked_twin(module, grouped)
        params = {k: v.clone().requires_grad_(v.is_floating_point() and "running" not in k) for k, v in state.items()}
        out = functional_call(twin, params, (x,))
        out.square().sum().backward()
        outputs.append(out.detach())
        grads.append(params["conv1.weight"].grad)
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-3, rtol=1e-3)


def test_the_stacked_twin_evaluates_a_global_model_broadcast_over_the_clients():
    """FedAvg's personalized models are its global model `expand`ed over the clients (stride 0): the
    BatchNorm twin reads such running statistics in evaluation (it used to refuse them: `view` of a
    broadcast), and gives each client the one model's output."""
    from torch.func import functional_call

    from pflbench.simulator.batching import stacked_twin

    module = build_model("cnn-bn", (3, 32, 32), 10)
    one = ClientModel(module).init(1, seed=0)
    one = {k: v + 0.1 * torch.rand_like(v) if v.is_floating_point() else v for k, v in one.items()}
    broadcast = {k: v.expand(4, *v.shape[1:]) for k, v in one.items()}
    x = torch.randn(8, 3, 32, 32)
    for grouped in (False, True):
        twin = stacked_twin(module, grouped).eval()
        with torch.no_grad():
            out = functional_call(twin, broadcast, (x.repeat(4, 1, 1, 1),))
            alone = functional_call(module.eval(), {k: v[0] for k, v in one.items()}, (x,))
        for k in range(4):
            torch.testing.assert_close(out[8 * k : 8 * (k + 1)], alone, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "algorithm,hp,field",
    [
        ("l2gd", {"p": 1.5}, "p"),
        ("ditto", {"lam": -1}, "lam"),
        ("apfl", {"alpha": 2.0}, "alpha"),
        ("fedprox", {"mu": -0.1}, "mu"),
    ],
)
def test_out_of_range_hyperparameter_is_refused_before_any_work(algorithm, hp, field):
    from pflbench.algorithm import get_algorithm

    with pytest.raises(ValueError, match=f"bad hyperparameters for algorithm '{algorithm}': {field}:"):
        get_algorithm(algorithm).parse_hyperparams(hp)
