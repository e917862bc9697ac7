"""Speed machinery: the compiled training step (same parameters as the eager step), its switch and
eager fallback, the per-round timing breakdown, and `pflbench bench`'s FLOP accounting."""

import threading

import numpy as np
import pandas as pd
import pytest
import torch

from pflbench.simulator import training
from pflbench.simulator.execution import ExecutionOptions
from pflbench.simulator.rounds import run_cell
from pflbench.simulator.models import build_model
from pflbench.simulator.client_model import ClientModel, to_channels_last
from pflbench.simulator.training import SGD, batch_plan, evaluate_client_splits, train_clients
from tests.cells import small_cell


def _tiny_problem(clients=2, sizes=(24, 40)):
    torch.manual_seed(0)
    model = ClientModel(build_model("mlp", (6,), 3))
    features = torch.randn(sum(sizes), 6)
    labels = torch.randint(0, 3, (sum(sizes),))
    bounds = np.cumsum((0,) + sizes)
    indices = [torch.arange(bounds[k], bounds[k + 1]) for k in range(clients)]

    def plans():
        return batch_plan(list(sizes), 8, 2, None, [torch.Generator().manual_seed(k) for k in range(clients)])

    return model, model.init(clients, 0), features, labels, indices, plans


def _cnn_problem(channels: int, sizes=(40, 56, 24)):
    torch.manual_seed(0)
    model = ClientModel(build_model("cnn", (channels, 16, 16), 4))
    features = torch.randn(sum(sizes), channels, 16, 16)
    labels = torch.randint(0, 4, (sum(sizes),))
    bounds = np.cumsum((0,) + sizes)
    indices = [torch.arange(bounds[k], bounds[k + 1]) for k in range(len(sizes))]

    def plans():
        return batch_plan(list(sizes), 8, 1, None, [torch.Generator().manual_seed(k) for k in range(len(sizes))])

    return model, model.init(len(sizes), 0), features, labels, indices, plans


@pytest.mark.parametrize("channels", [1, 3])
def test_channels_last_convolutions_train_the_same_parameters(channels, monkeypatch):
    model, state, features, labels, indices, plans = _cnn_problem(channels)
    sgd = SGD(0.05, momentum=0.9)
    reference, reference_loss = train_clients(model, state, features, labels, indices, plans(), sgd, batched=False)
    reference_eval = evaluate_client_splits(model, reference, features, labels, [indices], batched=False)[0]
    layouts = []
    conv2d = torch.nn.functional.conv2d

    def spy(x, weight, *args):  # which memory order the convolutions really get
        layouts.append(weight.stride(1) == 1 and x.is_contiguous(memory_format=torch.channels_last))
        return conv2d(x, weight, *args)

    monkeypatch.setattr(torch.nn.functional, "conv2d", spy)
    model.channels_last = True
    cl_features = to_channels_last(features)
    assert cl_features.stride(1) == 1  # channels-last strides even for one channel (`contiguous` keeps NCHW)
    for batched in (False, True):
        layouts.clear()
        trained, loss = train_clients(model, state, cl_features, labels, indices, plans(), sgd, batched=batched)
        assert layouts and all(layouts)
        for name, tensor in trained.items():
            assert tensor.is_contiguous()  # the rest of the engine gets ordinary tensors back
            torch.testing.assert_close(tensor, reference[name], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(loss, reference_loss, rtol=1e-5, atol=1e-6)
        layouts.clear()
        accuracy, eval_loss = evaluate_client_splits(model, reference, cl_features, labels, [indices], batched=batched)[
            0
        ]
        assert layouts and all(layouts)
        torch.testing.assert_close(accuracy, reference_eval[0])
        torch.testing.assert_close(eval_loss, reference_eval[1], rtol=1e-5, atol=1e-6)
    assert not ClientModel(build_model("mlp", (6,), 3)).has_conv


def test_client_threads_give_the_one_after_another_result_bit_for_bit():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the client threads run one torch thread each: the same arithmetic
    try:
        model, state, features, labels, indices, plans = _cnn_problem(3)
        model.channels_last = True
        features = to_channels_last(features)
        anchor = {f"global.{n}": t.clone() for n, t in state.items()}
        where = []

        def proximal(logits, y, params, aux):  # an algorithm's own objective, as Ditto/FedProx pass one
            where.append(threading.current_thread().name)
            prox = sum(((params[n] - aux[f"global.{n}"]) ** 2).flatten(1).sum(1) for n in model.param_names)
            return training.cross_entropy(logits, y, params, aux) + 0.05 * prox

        sgd = SGD(0.05, momentum=0.9)
        for objective, aux in ((training.cross_entropy, None), (proximal, anchor)):
            one_by_one, loss1 = train_clients(
                model, state, features, labels, indices, plans(), sgd, batched=False, objective=objective, aux=aux
            )
            where.clear()
            side_by_side, loss2 = train_clients(
                model,
                state,
                features,
                labels,
                indices,
                plans(),
                sgd,
                batched=False,
                objective=objective,
                aux=aux,
                threads=2,
            )
            assert all(torch.equal(one_by_one[n], side_by_side[n]) for n in state) and torch.equal(loss1, loss2)
            assert objective is training.cross_entropy or (
                where and all(n.startswith("pflbench-client") for n in where)
            )
        assert not torch.equal(one_by_one["conv1.weight"], state["conv1.weight"])  # it trained
        assert all(
            torch.equal(a, b)
            for a, b in zip(
                evaluate_client_splits(model, one_by_one, features, labels, [indices], batched=False)[0],
                evaluate_client_splits(model, one_by_one, features, labels, [indices], batched=False, threads=2)[0],
            )
        )
        assert torch.get_num_threads() == 1  # the caller's own setting is left as it was
    finally:
        torch.set_num_threads(threads)


def test_client_pool_threads_run_one_torch_thread_each_and_leave_the_callers_setting():
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        pool = training.client_pool(5)
        assert pool is training.client_pool(5)  # made once
        assert torch.get_num_threads() == 3
        assert list(pool.map(lambda _: torch.get_num_threads(), range(10))) == [1] * 10
    finally:
        torch.set_num_threads(threads)


def test_models_that_draw_random_numbers_train_their_clients_one_after_another(monkeypatch):
    # Dropout draws from the global generator: clients side by side would interleave the draws.
    vgg = ClientModel(build_model("vgg8", (3, 32, 32), 10))
    assert vgg.stochastic and not ClientModel(build_model("cnn", (3, 32, 32), 10)).stochastic
    model = ClientModel(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3)))
    _, state, features, labels, indices, plans = _tiny_problem()
    state = model.init(2, 0)
    monkeypatch.setattr(training, "client_pool", lambda workers: pytest.fail("a stochastic model used client threads"))
    torch.manual_seed(1)
    first, _ = train_clients(model, state, features, labels, indices, plans(), SGD(0.1), batched=False, threads=2)
    torch.manual_seed(1)
    again, _ = train_clients(model, state, features, labels, indices, plans(), SGD(0.1), batched=False, threads=2)
    assert all(torch.equal(first[n], again[n]) for n in state)


def test_compiled_batched_step_matches_the_eager_batched_step():
    model, state, features, labels, indices, plans = _tiny_problem()
    sgd = SGD(0.1, momentum=0.9)
    eager, eager_loss = train_clients(model, state, features, labels, indices, plans(), sgd, batched=True)
    compiled, compiled_loss = train_clients(
        model, state, features, labels, indices, plans(), sgd, batched=True, compiled=True
    )
    assert [key[2] for key, step in model._compiled.items() if step is not None] == [False]  # the stacked step
    for name in eager:
        torch.testing.assert_close(compiled[name], eager[name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)


def test_compiled_step_matches_eager_and_counts_its_compile_time():
    # One compilation (the loop path of a tiny MLP): compiling is the expensive part of this test.
    model, state, features, labels, indices, plans = _tiny_problem()
    sgd = SGD(0.1, momentum=0.9, weight_decay=1e-3)
    eager, eager_loss = train_clients(model, state, features, labels, indices, plans(), sgd, batched=False)
    compiled, compiled_loss = train_clients(
        model, state, features, labels, indices, plans(), sgd, batched=False, compiled=True
    )
    assert all(step is not None for step in model._compiled.values()) and model._compiled  # really compiled
    assert model.compile_seconds > 0
    for name in eager:
        assert not torch.equal(eager[name], state[name])  # it trained
        torch.testing.assert_close(compiled[name], eager[name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)
    # A second call reuses the compiled step: no new compile time.
    spent = model.compile_seconds
    train_clients(model, state, features, labels, indices, plans(), sgd, batched=False, compiled=True)
    assert model.compile_seconds == spent


def test_without_compilation_the_engine_says_so_once_and_trains_eagerly(monkeypatch, capsys):
    model, state, features, labels, indices, plans = _tiny_problem()
    monkeypatch.setattr(training, "compile_available", lambda: "no compiler here")
    monkeypatch.setattr(training, "_warned", set())
    eager, _ = train_clients(model, state, features, labels, indices, plans(), SGD(0.1), batched=False)
    for _ in range(2):
        fallback, _ = train_clients(
            model, state, features, labels, indices, plans(), SGD(0.1), batched=False, compiled=True
        )
        for name in eager:
            assert torch.equal(fallback[name], eager[name])
    err = capsys.readouterr().err
    assert err.count("compiled training steps unavailable (no compiler here); training eagerly") == 1
    assert model.compile_seconds == 0


def test_batchnorm_models_and_custom_objectives_stay_eager(capsys):
    model = ClientModel(build_model("cnn-bn", (1, 16, 16), 3))
    state = model.init(1, 0)
    features, labels = torch.randn(16, 1, 16, 16), torch.randint(0, 3, (16,))
    plans = batch_plan([16], 8, 1, None, [torch.Generator().manual_seed(0)])
    eager, _ = train_clients(model, state, features, labels, [torch.arange(16)], plans, SGD(0.1), batched=False)
    compiled, _ = train_clients(
        model, state, features, labels, [torch.arange(16)], plans, SGD(0.1), batched=False, compiled=True
    )
    assert all(torch.equal(eager[n], compiled[n]) for n in eager) and not model._compiled
    assert "need a model without buffers" in capsys.readouterr().err


def test_speed_switches_are_execution_options():
    E = ExecutionOptions
    assert E(compiled_training="on").compiled() and not E(compiled_training="off").compiled()
    assert not E().compiled()  # eager: measured faster on CPU with channels-last and client threads
    with pytest.raises(ValueError, match=r"compiled_training must be one of \('auto', 'on', 'off'\)"):
        E(compiled_training="yes")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert E().use_channels_last(cpu, True) and not E().use_channels_last(cuda, True)
    assert not E().use_channels_last(cpu, False) and not E(channels_last="on").use_channels_last(cpu, False)  # no conv
    assert not E(channels_last="off").use_channels_last(cpu, True) and E(channels_last="on").use_channels_last(
        cuda, True
    )
    with pytest.raises(ValueError, match="channels_last must be one of"):
        E(channels_last="yes")
    threads = torch.get_num_threads()
    assert E().side_by_side(cpu, threads) == threads and E(client_threads="off").side_by_side(cpu, threads) == 1
    assert E().side_by_side(cuda, threads) == 1
    with pytest.raises(ValueError, match="client_threads must be one of"):
        E(client_threads="4")
    # Not part of the cell: its hash does not depend on how it is executed.
    from pflbench.config import CellConfig

    assert not {"compiled_training", "channels_last", "client_threads"} & set(CellConfig.model_fields)


def test_rounds_record_where_the_time_went(tmp_path):
    from pflbench.reports.cells import execution_text, timing_breakdown

    result = run_cell(small_cell(rounds=3, eval_every=2), data_root=tmp_path)
    rounds = result.rounds
    for column in ("train_time", "server_time", "eval_time"):
        assert (rounds[column] >= 0).all()
    assert (rounds["train_time"] > 0).all()
    np.testing.assert_allclose(rounds["train_time"] + rounds["server_time"], rounds["wall_time"], rtol=1e-9)
    assert rounds["eval_time"].tolist()[1] > 0 and rounds["eval_time"].tolist()[0] == 0  # round 1 not evaluated
    assert result.summary["train_time_total"] == pytest.approx(rounds["train_time"].sum())
    assert result.summary["compiled_training"] is False and result.summary["compile_seconds"] == 0
    assert result.summary["channels_last"] is False  # an MLP: no convolution to lay out
    assert result.summary["client_threads"] == (
        torch.get_num_threads() if result.summary["client_batching"] == "loop" else 1
    )
    rows = timing_breakdown(rounds, result.summary["compile_seconds"])
    assert [r["part"] for r in rows] == ["local training", "server (configure, receive, send, aggregate)", "evaluation"]
    assert rows[0]["total"] == pytest.approx(rounds["train_time"].sum())
    assert timing_breakdown(pd.DataFrame({"round": [1], "wall_time": [1.0]})) is None  # an older store
    # the cell page says how the cell ran
    assert execution_text(
        {**result.summary, "client_batching": "loop", "client_threads": 2, "channels_last": True}
    ) == (
        "Ran on cpu, a client loop, channels-last convolutions, 2 clients side by side (one torch thread each), "
        "eager training step."
    )
    assert execution_text({"device": "cuda", "client_batching": "batched", "client_threads": 1}) == (
        "Ran on cuda, clients batched."
    )
    assert execution_text({}) is None  # a store from before these were recorded


def test_bench_counts_flops_against_a_measured_peak():
    from pflbench.run.bench import format_bench, matmul_peak, run_bench, training_flops_per_sample

    # By hand for the CNN on 1x28x28: forward 2*(24*24*16*25 + 8*8*32*400 + 512*120 + 120*84 + 84*10)
    # = 2,243,920 FLOPs; backward the same for the weight gradients plus the input gradients of every
    # layer but the first (the images need none): 3 * 2,243,920 - 2*24*24*16*25 = 6,270,960.
    assert training_flops_per_sample("cnn", (1, 28, 28), 10, 32) == pytest.approx(6_270_960)
    assert matmul_peak(size=128, repeats=2, calls=1) > 0
    result = run_bench(clients=2, samples=16, batch_size=8, shape=(6,), model="mlp", repeats=1, compiled=False)
    for way, value in result["samples_per_second"].items():
        assert result["gflops"][way] == pytest.approx(value * result["flops_per_sample"] / 1e9)
        assert result["fraction_of_peak"][way] == pytest.approx(result["gflops"][way] / result["peak_gflops"])
    text = format_bench(result)
    assert "GFLOP/s" in text and "measured peak" in text and "/ peak" in text
