"""The batched plain step over static buffers (pflbench.simulator.static_step): on a CPU it runs eagerly and gives
today's eager batched step bit for bit — states, BatchNorm statistics and counters, momenta (through
the trained parameters), mean losses — whatever the plan's tail (stragglers, a client with fewer
samples than a batch, rows of different plan lengths), the layout (channels-last or not), the rule
(momentum, weight decay), per-row learning rates, a trainable subset; its buffers are refilled on
every call (a second call through the cached step gives the same); whole cells with the option on are
the cells with it off; what it cannot take falls back to the eager step with one reason line. On CUDA
(tests/test_cuda.py) the same step is captured as a CUDA graph and replayed."""

import numpy as np
import pytest
import torch

from cells import small_cell
from pflbench.simulator import static_step
from pflbench.simulator.execution import ExecutionOptions, execution_options
from pflbench.simulator.models import build_model
from pflbench.simulator.row_rates import RowRates
from pflbench.simulator.rounds import run_cell
from pflbench.simulator.client_model import ClientModel, to_channels_last
from pflbench.simulator.training import SGD, train_group, batch_plan, cross_entropy
from test_cell_groups import IMAGES, BN_IMAGES, assert_identical
from test_fused_steps import same_bits

BATCH = 8


def clients(name: str, shape: tuple, sizes: list[int], channels_last: bool, seed: int = 0):
    """A model, K clients' distinct states, their data and a 2-epoch batch plan each."""
    gen = torch.Generator().manual_seed(seed)
    model = ClientModel(build_model(name, shape, 10))
    model.channels_last = channels_last
    state = model.init(len(sizes), seed)
    state = {
        n: t + 0.01 * torch.randn(t.shape, generator=gen) if t.is_floating_point() else t for n, t in state.items()
    }
    features = torch.randn(sum(sizes), *shape, generator=gen)
    features = to_channels_last(features) if channels_last else features
    labels = torch.randint(0, 10, (sum(sizes),), generator=gen)
    starts = np.cumsum([0, *sizes])
    indices = [torch.arange(a, b) for a, b in zip(starts[:-1], starts[1:])]
    plans = batch_plan(sizes, BATCH, 2, None, [torch.Generator().manual_seed(seed + k) for k in range(len(sizes))])
    return model, state, features, labels, indices, plans


def both(model, state, features, labels, indices, plans, sgd, trainable=None, rates=None, objective=cross_entropy):
    trainable = set(model.param_names if trainable is None else trainable)
    eager = train_group(model, state, features, labels, indices, plans, sgd, objective, {}, trainable, rates=rates)
    static = train_group(
        model, state, features, labels, indices, plans, sgd, objective, {}, trainable, rates=rates, static=True
    )
    return eager, static


def assert_same(a, b):
    (state_a, loss_a), (state_b, loss_b) = a, b
    assert state_a.keys() == state_b.keys()
    for name in state_a:
        assert state_a[name].dtype == state_b[name].dtype
        if state_a[name].is_floating_point():
            assert same_bits(state_a[name], state_b[name]), name
        else:
            assert torch.equal(state_a[name], state_b[name]), name  # BatchNorm's counters
    assert same_bits(loss_a, loss_b)


CASES = {  # id: (model, input shape, client sample counts, SGD rule)
    "cnn-equal": ("cnn", (1, 28, 28), [20, 20, 20], SGD(0.05)),
    "cnn-tail": ("cnn", (1, 28, 28), [20, 5, 33, 12], SGD(0.05)),
    "cnn-bn-tail": ("cnn-bn", (3, 32, 32), [20, 5, 33], SGD(0.05)),
    "cnn-bn-two-left": ("cnn-bn", (3, 32, 32), [33, 5, 33], SGD(0.05)),
    "cnn-bn-momentum-decay": ("cnn-bn", (3, 32, 32), [20, 5, 33], SGD(0.05, 0.9, 1e-3)),
    "mlp-momentum": ("mlp", (1, 28, 28), [3, 17, 30], SGD(0.1, 0.5)),
}


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels-last", "contiguous"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_static_step_is_the_eager_batched_step_to_the_bit(case, channels_last):
    name, shape, sizes, sgd = CASES[case]
    model, state, features, labels, indices, plans = clients(name, shape, sizes, channels_last)
    eager, static = both(model, state, features, labels, indices, plans, sgd)
    assert_same(eager, static)
    assert len(model.static_steps) == 1
    # a second call through the cached step, from another state: its buffers are refilled
    again = {n: t.flip(0) for n, t in state.items()}
    eager, static = both(model, again, features, labels, indices, plans, sgd)
    assert_same(eager, static)
    assert len(model.static_steps) == 1


@pytest.mark.parametrize("name, shape", [("cnn", (1, 28, 28)), ("cnn-bn", (3, 32, 32))])
def test_per_row_learning_rates_and_a_trainable_subset(name, shape):
    model, state, features, labels, indices, plans = clients(name, shape, [20, 5, 33, 16], True, seed=3)
    rules = [SGD(lr, 0.9, 1e-3) for lr in (0.005, 0.05, 0.1, 0.013)]
    rates = RowRates.of(rules, "cpu")
    assert_same(*both(model, state, features, labels, indices, plans, rules[0], rates=rates))
    head = {n for n in model.param_names if n.startswith(("fc3", "fc2"))}
    assert head and head != set(model.param_names)
    eager, static = both(model, state, features, labels, indices, plans, rules[0], trainable=head, rates=rates)
    assert_same(eager, static)
    for n in set(model.param_names) - head:  # the frozen body is where it was
        assert torch.equal(static[0][n], state[n])


def test_the_cache_is_bounded_and_each_width_has_its_own_buffers():
    model, state, features, labels, indices, plans = clients("cnn", (1, 28, 28), [16] * 7, True)
    trainable = set(model.param_names)
    for width in range(2, 8):
        rows = {n: t[:width] for n, t in state.items()}
        train_group(
            model,
            rows,
            features,
            labels,
            indices[:width],
            plans[:width],
            SGD(0.05),
            cross_entropy,
            {},
            trainable,
            static=True,
        )
    assert len(model.static_steps) == static_step.CACHED
    assert sorted(key[1] for key in model.static_steps) == list(range(8 - static_step.CACHED, 8))


def test_what_cannot_be_captured_trains_eagerly_with_one_reason(capsys):
    model, state, features, labels, indices, plans = clients("cnn", (1, 28, 28), [20, 9], True)

    def own_objective(logits, y, state, aux):  # a method's own objective: not captured
        return cross_entropy(logits, y, state, aux) * 2

    eager, static = both(model, state, features, labels, indices, plans, SGD(0.05), objective=own_objective)
    assert_same(eager, static)
    assert not model.static_steps
    err = capsys.readouterr().err
    assert "the static (CUDA-graph) step is not used here (the method's own objective" in err
    one = {n: t[:1] for n, t in state.items()}
    assert_same(*both(model, one, features, labels, indices[:1], plans[:1], SGD(0.05)))
    assert "one client trains unstacked" in capsys.readouterr().err
    assert not model.static_steps


@pytest.mark.parametrize("algorithm, images", [("fedavg", BN_IMAGES), ("fedrep", IMAGES), ("local", BN_IMAGES)])
def test_whole_cells_with_the_static_step_are_the_cells_without(tmp_path, monkeypatch, algorithm, images):
    """Rounds with stragglers (a cut plan: rows sitting out the tail), FedRep's two phases (a trainable
    subset each), BatchNorm statistics: the option changes nothing a cell computes on a CPU."""
    cell = small_cell(algorithm=algorithm, system={"stragglers": 0.4, "straggler_work": 0.5}, **images)
    off = run_cell(cell, data_root=tmp_path, execution=ExecutionOptions(client_batching="on", cuda_graphs="off"))
    steps = []
    run = static_step.StaticStep.run
    monkeypatch.setattr(static_step.StaticStep, "run", lambda self: (steps.append(len(self.active)), run(self))[1])
    on = run_cell(cell, data_root=tmp_path, execution=ExecutionOptions(client_batching="on", cuda_graphs="on"))
    assert off.status == on.status == "finished"
    assert off.summary["system_stragglers"]
    assert_identical(off, on)
    assert len(steps) >= cell.rounds and set(steps) == {5}  # every round, its 5 clients through the static step


def test_the_option_auto_is_off_until_verified_and_on_is_any_device(monkeypatch):
    assert not ExecutionOptions().static_step("cpu") and not ExecutionOptions().static_step("cuda")
    assert ExecutionOptions(cuda_graphs="on").static_step("cpu")
    assert not ExecutionOptions(cuda_graphs="off").static_step("cuda")
    monkeypatch.setattr("pflbench.simulator.execution.CUDA_GRAPHS_VERIFIED", True)
    assert ExecutionOptions().static_step("cuda:0") and not ExecutionOptions().static_step("cpu")
    with pytest.raises(ValueError, match="cuda_graphs must be one of"):
        ExecutionOptions(cuda_graphs="always")
    from pflbench.cli import build_parser

    args = build_parser().parse_args(["run", "benchmarks/demo.yaml", "--cuda-graphs", "on"])
    assert execution_options(args).cuda_graphs == "on"
