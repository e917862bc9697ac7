"""Speed machinery: the compiled training step (same parameters as the eager step), its switch and
eager fallback, the per-round timing breakdown, and `pflbench bench`'s FLOP accounting."""
import numpy as np
import pandas as pd
import pytest
import torch

from pflbench import training
from pflbench.federation import COMPILE_MIN_STEPS, choose_compiled, run_cell
from pflbench.models import build_model
from pflbench.training import SGD, ClientModel, batch_plan, train_clients
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


def test_compiled_step_matches_eager_and_counts_its_compile_time():
    # One compilation (the loop path of a tiny MLP): compiling is the expensive part of this test.
    model, state, features, labels, indices, plans = _tiny_problem()
    sgd = SGD(0.1, momentum=0.9, weight_decay=1e-3)
    eager, eager_loss = train_clients(model, state, features, labels, indices, plans(), sgd, batched=False)
    compiled, compiled_loss = train_clients(model, state, features, labels, indices, plans(), sgd,
                                            batched=False, compiled=True)
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
        fallback, _ = train_clients(model, state, features, labels, indices, plans(), SGD(0.1), batched=False,
                                    compiled=True)
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
    compiled, _ = train_clients(model, state, features, labels, [torch.arange(16)], plans, SGD(0.1), batched=False,
                                compiled=True)
    assert all(torch.equal(eager[n], compiled[n]) for n in eager) and not model._compiled
    assert "need a model without buffers" in capsys.readouterr().err


def test_compiled_training_switch_is_an_execution_option():
    cell = small_cell(rounds=2)
    assert choose_compiled("on", cell, [100] * 5) and not choose_compiled("off", cell, [100] * 5)
    assert not choose_compiled("auto", cell, [100] * 5)  # 2 rounds x 5 clients x 7 steps: not worth it
    big = small_cell(rounds=COMPILE_MIN_STEPS)
    assert choose_compiled("auto", big, [16] * 5)
    with pytest.raises(ValueError, match=r"compiled_training must be one of \('auto', 'on', 'off'\)"):
        choose_compiled("yes", cell, [100])
    # Not part of the cell: its hash does not depend on how it is executed.
    from pflbench.config import CellConfig
    assert "compiled_training" not in CellConfig.model_fields


def test_rounds_record_where_the_time_went(tmp_path):
    from pflbench.reports.cells import timing_breakdown

    result = run_cell(small_cell(rounds=3, eval_every=2), data_root=tmp_path)
    rounds = result.rounds
    for column in ("train_time", "server_time", "eval_time"):
        assert (rounds[column] >= 0).all()
    assert (rounds["train_time"] > 0).all()
    np.testing.assert_allclose(rounds["train_time"] + rounds["server_time"], rounds["wall_time"], rtol=1e-9)
    assert rounds["eval_time"].tolist()[1] > 0 and rounds["eval_time"].tolist()[0] == 0  # round 1 not evaluated
    assert result.summary["train_time_total"] == pytest.approx(rounds["train_time"].sum())
    assert result.summary["compiled_training"] is False and result.summary["compile_seconds"] == 0
    rows = timing_breakdown(rounds, result.summary["compile_seconds"])
    assert [r["part"] for r in rows] == ["local training", "server (configure, receive, send, aggregate)",
                                         "evaluation"]
    assert rows[0]["total"] == pytest.approx(rounds["train_time"].sum())
    assert timing_breakdown(pd.DataFrame({"round": [1], "wall_time": [1.0]})) is None  # an older store


def test_bench_counts_flops_against_a_measured_peak():
    from pflbench.bench import format_bench, matmul_peak, run_bench, training_flops_per_sample

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
