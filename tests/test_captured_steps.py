"""The methods' own steps over static buffers (pflbench.kit.steps.run_steps, pflbench.simulator.captured): pFedMe's inner
solve, Per-FedAvg's meta step (FO and HF) and pFedHN's official inner optimizer. On a CPU the static step runs
eagerly and gives today's eager step bit for bit — rounds (w, theta, BatchNorm statistics and counters,
momentum, weight decay, stragglers' tail steps where some rows sit out, the batched path and the client loop)
and whole cells with `cuda_graphs` on and off; one static step is kept per shape and reused from round to
round; the device flags of `DeviceLossCheck` give `LossCheck`'s answers, so a NaN raises the same `Diverged`;
no step reads the device (pFedHN's official optimizer included, which read its loss at every step). On CUDA
(tests/test_cuda.py) the same steps are captured as CUDA graphs and replayed."""

import pytest
import torch

from cells import received, small_cell
from pflbench.simulator import captured
from pflbench.algorithms.perfedavg import PerFedAvg
from pflbench.algorithms.pfedhn import PFedHN
from pflbench.algorithms.pfedme import PFedMe
from pflbench.simulator.execution import ExecutionOptions
from pflbench.simulator.rounds import run_cell
from pflbench.kit.steps import Active, DeviceLossCheck, LossCheck
from pflbench.simulator.training import Diverged
from test_cell_groups import BN_IMAGES, IMAGES, assert_identical
from test_fused_steps import Reads, assert_same_state, cell, finish_round, make

ALGORITHMS = {  # id: (class, name, hp)
    "pfedme": (PFedMe, "pfedme", {"k": 2, "personal_lr": 0.05, "mu": 0.01}),
    "pfedme-personal": (PFedMe, "pfedme", {"k": 3, "personal_lr": 0.05, "warm_start": "personal"}),
    "perfedavg-fo": (PerFedAvg, "perfedavg", {"variant": "fo", "beta": 0.05}),
    "perfedavg-hf": (PerFedAvg, "perfedavg", {"variant": "hf", "beta": 0.05}),
    "pfedhn-official": (
        PFedHN,
        "pfedhn",
        {"inner_optimizer": "official", "inner_steps": 4, "server_updates": "per_round"},
    ),
}


def own_steps(model) -> list:
    """The static steps a method's own training left in the model's cache."""
    return [step for key, step in model.static_steps.items() if key[0] == "own step"]


def counted_runs(monkeypatch) -> list:
    """Appends each static loop's step (replay or call) to the list returned."""
    runs: list = []
    run = captured.StaticLoop.run
    monkeypatch.setattr(captured.StaticLoop, "run", lambda self: (runs.append(1), run(self))[1])
    return runs


@pytest.mark.parametrize("batching", ["on", "off"])
@pytest.mark.parametrize("data", ["mlp", "bn"])
@pytest.mark.parametrize("case", list(ALGORITHMS))
def test_rounds_over_static_buffers_are_todays_rounds_to_the_bit(tmp_path, monkeypatch, case, data, batching):
    """Two rounds with momentum, weight decay and stragglers (tail steps where some rows sit out), the
    BatchNorm model or not, the batched path (all clients one step) or the loop (one client at a time)."""
    alg_cls, name, hp = ALGORITHMS[case]
    config = cell(name, hp, data)
    eager, static = make(alg_cls, config, tmp_path, batching), make(alg_cls, config, tmp_path, batching)
    static.engine.static_step = True  # what `cuda_graphs: on` sets
    fed = eager.engine
    clients = torch.arange(fed.num_clients)
    counts = [len(p) for p in fed.local_plans(fed.round(1, clients), clients)]
    assert min(counts) < max(counts) or name == "pfedhn"  # some clients sit out the last steps
    runs = counted_runs(monkeypatch)
    for rnd in (1, 2):
        results = []
        for alg in (eager, static):
            context, state = received(alg, rnd, clients)
            trained = alg.local_train(context, state)
            results.append(trained)
            finish_round(alg, context, clients, trained)
        if name == "pfedhn":
            assert_same_state(results[0].state, results[1].state)
            assert_same_state(results[0].started, results[1].started)
        else:
            assert_same_state(results[0], results[1])
        if name == "pfedme":
            assert_same_state(eager.personal_state, static.personal_state)
    assert runs and not own_steps(eager.engine.model)
    assert len(own_steps(static.engine.model)) == 1  # one shape: made once, reused every round (and client)


@pytest.mark.parametrize(
    "algorithm, hp, images",
    [
        ("pfedme", {"k": 2, "personal_lr": 0.01}, BN_IMAGES),
        ("perfedavg", {"variant": "hf"}, BN_IMAGES),
        ("pfedhn", {"inner_optimizer": "official", "inner_steps": 3}, IMAGES),  # per_client: one client at a time
    ],
)
def test_whole_cells_with_static_own_steps_are_the_cells_without(tmp_path, monkeypatch, algorithm, hp, images):
    """The CNNs (BatchNorm for pFedMe and Per-FedAvg), stragglers, momentum; evaluation, uploads, the
    server's steps: the option changes nothing a cell computes on a CPU."""
    config = small_cell(
        algorithm=algorithm, hp=hp, momentum=0.9, system={"stragglers": 0.4, "straggler_work": 0.5}, **images
    )
    off = run_cell(config, data_root=tmp_path, execution=ExecutionOptions(client_batching="on", cuda_graphs="off"))
    runs = counted_runs(monkeypatch)
    on = run_cell(config, data_root=tmp_path, execution=ExecutionOptions(client_batching="on", cuda_graphs="on"))
    assert off.status == on.status == "finished"
    assert_identical(off, on)
    assert len(runs) >= config.rounds


@pytest.mark.parametrize("case", ["pfedme", "perfedavg-fo", "pfedhn-official"])
def test_a_nan_loss_raises_the_same_diverged_over_static_buffers(tmp_path, case):
    alg_cls, name, hp = ALGORITHMS[case]
    messages = []
    for static in (False, True):
        alg = make(alg_cls, cell(name, hp, "mlp"), tmp_path, "on")
        fed = alg.engine
        fed.static_step = static
        fed.features = fed.features.clone()  # (not the dataset's cached tensor)
        fed.features[fed.splits["train"][3]] = float("nan")  # client 3's training data
        clients = torch.arange(fed.num_clients)
        context, state = received(alg, 1, clients)
        with pytest.raises(Diverged) as raised:
            alg.local_train(context, state)
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
    assert messages[0] in (
        "non-finite pFedMe loss for clients [3]",
        "non-finite Per-FedAvg loss for clients [3] at local step 0",
        "non-finite pFedHN inner loss for clients [3]",
    )


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("case", ["pfedme", "perfedavg-hf", "pfedhn-official"])
def test_the_steps_read_nothing_from_the_device_however_many_there_are(tmp_path, case, static):
    """pFedHN's official optimizer read its loss at every step; now every method's round reads the same
    few values however many steps it makes, eagerly and over static buffers."""
    alg_cls, name, hp = ALGORITHMS[case]
    reads, steps = {}, {}
    for epochs in (1, 3):
        size = {"inner_steps": 2 * epochs} if name == "pfedhn" else {}
        alg = make(alg_cls, cell(name, {**hp, **size}, "mlp", local_epochs=epochs, rounds=1), tmp_path, "on")
        alg.engine.static_step = static
        clients = torch.arange(alg.engine.num_clients)
        context, state = received(alg, 1, clients)
        steps[epochs] = size.get("inner_steps") or max(len(p) for p in alg.engine.local_plans(context, clients))
        with Reads() as counter:
            alg.local_train(context, state)
        reads[epochs] = counter.count
    assert steps[3] >= 2 * steps[1] and reads[1] == reads[3], (steps, reads)


def test_the_device_flags_give_the_loss_checks_answers():
    nan, inf = float("nan"), float("inf")
    everyone = Active(True, torch.ones(3, dtype=torch.bool))
    some = Active(False, torch.tensor([True, False, True]))  # a static step's Active: no rows
    sequences = [
        [],
        [(everyone, [1.0, 2.0, 3.0], [1.0, 1.0, 1.0])],
        [
            (everyone, [1.0, 2.0, 3.0], [1.0, 1.0, 1.0]),
            (some, [1.0, nan, 3.0], [1.0, 1.0, 1.0]),
            (everyone, [1.0, 2.0, 3.0], [inf, 1.0, nan]),
            (everyone, [nan, nan, nan], [1.0, 1.0, 1.0]),
        ],
        [(some, [nan, 1.0, 1.0], [1.0, nan, 1.0])],
    ]
    for sequence in sequences:
        for rows in (None, torch.tensor([True, True, True]), torch.tensor([True, False, True])):
            listed, flagged = LossCheck(), DeviceLossCheck(3, torch.device("cpu"))
            flagged.add(everyone, torch.tensor([nan, nan, nan]), torch.tensor([nan, nan, nan]))
            flagged.reset()  # a previous call's flags are gone
            for active, *losses in sequence:
                listed.add(active, *map(torch.tensor, losses))
                flagged.add(active, *map(torch.tensor, losses))
            (a, ok_a), (b, ok_b) = listed.verdict(rows), flagged.verdict(rows)
            assert ok_a == ok_b and (a is None) == (b is None)
            if a is not None and b is not None:
                assert a[0] == b[0] and torch.equal(a[1], b[1])
    flagged = DeviceLossCheck(3, torch.device("cpu"))
    flagged.add(everyone, torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="a check has 2 losses"):
        flagged.add(everyone, torch.zeros(3))


def test_a_model_that_draws_random_numbers_trains_eagerly_with_one_reason(tmp_path, capsys):
    alg = make(PFedMe, cell("pfedme", {"k": 1}, "mlp"), tmp_path, "on")
    fed = alg.engine
    fed.static_step = True
    fed.model.stochastic = True  # (as a model with dropout)
    clients = torch.arange(fed.num_clients)
    context, state = received(alg, 1, clients)
    alg.local_train(context, state)
    assert not own_steps(fed.model)
    assert "the static (CUDA-graph) step is not used here (the model draws random numbers" in capsys.readouterr().err


def test_a_group_of_cells_with_static_own_steps_gives_each_cell_alone(tmp_path, monkeypatch):
    """Cells of a group run their own steps on their own threads, each over its own model's static buffers:
    per cell, what the cell gives alone with the option off."""
    from pflbench.simulator.groups import run_group

    cells = [small_cell(algorithm="pfedme", hp={"k": 2, "personal_lr": 0.01}, seed=seed, **IMAGES) for seed in (0, 1)]
    cells.append(small_cell(algorithm="perfedavg", hp={"variant": "fo"}, **IMAGES))
    alone = [
        run_cell(c, data_root=tmp_path, execution=ExecutionOptions(client_batching="on", cuda_graphs="off"))
        for c in cells
    ]
    runs = counted_runs(monkeypatch)
    grouped = run_group(cells, data_root=tmp_path, execution=ExecutionOptions(client_batching="on", cuda_graphs="on"))
    assert runs
    for one, member in zip(alone, grouped.results):
        assert one.status == member.status == "finished"
        assert_identical(one, member)
