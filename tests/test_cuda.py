"""The engine on a GPU (marker `cuda`): what `benchmarks/gpu/check.sh` runs on a lent device.

Skipped where torch sees no CUDA device, with that reason. `PFLBENCH_TEST_DEVICE=cpu` runs the same
tests on the CPU: the GPU check's rehearsal (`check.sh --rehearse`) does, so that a test that cannot
run at all fails here rather than on the device's few minutes.

- the batched path against the client loop on the device, for an algorithm of every family;
- a BatchNorm model (cnn-bn) batched and looped;
- the compiled training step against the eager one;
- the batched step captured as a CUDA graph (pflbench.simulator.static_step) against the eager one, a whole
  BatchNorm cell with stragglers with `cuda_graphs` on and off;
- the methods' own steps (pFedMe, Per-FedAvg, pFedHN's official inner optimizer: pflbench.kit.steps.run_steps)
  captured against the eager ones, whole BatchNorm cells with stragglers and momentum;
- a whole cell through the CLI (`pflbench run --no-ray --device ...`), with its result in the store;
- a checkpoint written on the device, read back on the CPU (tensors on the CPU), and set aside there
  with its reason (another execution path) by a CPU run of the same cell, which then finishes.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from pflbench.storage.checkpoint import Checkpointer, CheckpointPolicy, read_checkpoint
from pflbench.simulator.execution import ExecutionOptions
from pflbench.simulator.rounds import run_cell
from pflbench.storage.store import Store
from cells import assert_batched_matches_loop, small_cell

DEVICE = os.environ.get("PFLBENCH_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        DEVICE == "cuda" and not torch.cuda.is_available(),
        reason="torch sees no CUDA device (PFLBENCH_TEST_DEVICE=cpu runs these tests on the CPU)",
    ),
]


@pytest.fixture(autouse=True)
def full_float32():
    """Convolutions in full float32: PyTorch runs cuDNN convolutions in TF32 by default on Ampere and
    later GPUs, and the batched path (grouped convolutions) and the loop (one convolution per client)
    then round differently, by about 1e-3 (measured on an H100: docs/howto/gpu.md; measured: docs/measurements/gpu.md). The tests compare the
    paths' arithmetic, so they turn TF32 off; cells run with PyTorch's default."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


# One algorithm of each family (pflbench.algorithm.FAMILIES), and the loop-only FedMN.
FAMILIES = ["fedavg", "local", "fedrep", "fedbn", "pfedme", "perfedavg", "ditto", "pfedhn", "pfedla", "fedfomo"]


@pytest.mark.parametrize("algorithm", FAMILIES)
def test_batched_path_matches_the_client_loop_on_the_device(tmp_path, algorithm):
    cell = small_cell(algorithm=algorithm, rounds=2, val_fraction=0.1 if algorithm == "fedfomo" else 0.0)
    assert_batched_matches_loop(cell, tmp_path, device=DEVICE)


def test_batchnorm_model_batched_matches_the_loop_on_the_device(tmp_path):
    cell = small_cell(
        algorithm="fedbn",
        model="cnn-bn",
        dataset="synthetic-images",
        dataset_options={"channels": 3, "size": 32, "num_samples": 600},
        rounds=2,
    )
    assert_batched_matches_loop(cell, tmp_path, device=DEVICE)


def test_convolution_model_batched_matches_the_loop_on_the_device(tmp_path):
    cell = small_cell(
        algorithm="fedavg",
        model="cnn",
        dataset="synthetic-images",
        dataset_options={"channels": 1, "size": 28, "num_samples": 600},
        rounds=2,
    )
    assert_batched_matches_loop(cell, tmp_path, device=DEVICE)


def test_compiled_step_matches_the_eager_step_on_the_device(tmp_path):
    cell = small_cell(rounds=2)
    eager = run_cell(cell, data_root=tmp_path, execution=ExecutionOptions(device=DEVICE, client_batching="on"))
    compiled = run_cell(
        cell,
        data_root=tmp_path,
        execution=ExecutionOptions(device=DEVICE, client_batching="on", compiled_training="on"),
    )
    assert compiled.summary["compiled_training"] is True, compiled.summary
    torch.testing.assert_close(
        torch.tensor(compiled.metrics["loss"].to_numpy()),
        torch.tensor(eager.metrics["loss"].to_numpy()),
        rtol=1e-3,
        atol=1e-4,
    )


def test_a_whole_cell_through_the_cli_on_the_device(tmp_path):
    results = tmp_path / "results"
    command = [
        sys.executable,
        "-m",
        "pflbench.cli",
        "run",
        "benchmarks/ci.yaml",
        "--no-ray",
        "--device",
        DEVICE,
        "--results",
        str(results),
        "--root",
        str(tmp_path / "data"),
        "--set",
        "algorithm=fedavg",
        "--set",
        "rounds=2",
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summaries = [json.loads(path.read_text()) for path in results.glob("*/summary.json")]
    assert summaries and all(s["status"] == "finished" for s in summaries), done.stdout
    assert all(s["device"] == torch.device(DEVICE).type for s in summaries), summaries


def test_a_device_checkpoint_reads_on_the_cpu_and_a_cpu_run_sets_it_aside(tmp_path):
    cell = small_cell(rounds=4)
    store = Store(tmp_path / "store")
    policy = CheckpointPolicy(every=1, minutes=0)
    on_device = Checkpointer(store.cell_dir(cell), cell, policy)
    run_cell(
        cell,
        data_root=tmp_path,
        execution=ExecutionOptions(device=DEVICE, client_batching="on"),
        checkpointer=on_device,
        stop_after=2,
    )
    path = store.checkpoint_path(cell)
    header, payload = read_checkpoint(path, device="cpu")
    assert header["round"] == 2 and header["execution"]["device"] == torch.device(DEVICE).type
    tensors = [t for t in _tensors(payload)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    # The CPU run of the same cell: a device checkpoint is another execution path (other float
    # rounding), so it is set aside with its reason and the cell runs from round 1 to the end.
    on_cpu = Checkpointer(store.cell_dir(cell), cell, policy)
    result = run_cell(
        cell, data_root=tmp_path, execution=ExecutionOptions(device="cpu", client_batching="on"), checkpointer=on_cpu
    )
    if torch.device(DEVICE).type == "cpu":  # the rehearsal: the same path, so it resumes instead
        assert result.summary.get("resumed_from_round") == 2
    else:
        assert result.summary.get("resumed_from_round") is None
        reasons = list(store.root.glob("_*/*"))
        assert reasons, "the device checkpoint was not set aside"
    assert len(result.metrics) > 0


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def test_the_captured_step_matches_the_eager_step_on_the_device(tmp_path):
    """On CUDA the static step is captured once (a CUDA graph) and replayed: the same kernels as the eager
    step, so the same numbers up to the update's form (a tensor learning rate: `addcmul`); on the CPU
    (the rehearsal) it runs eagerly and gives the eager step's bits."""
    from pflbench.simulator.models import build_model
    from pflbench.simulator.client_model import ClientModel
    from pflbench.simulator.training import SGD, train_group, batch_plan, cross_entropy

    gen = torch.Generator().manual_seed(0)
    model = ClientModel(build_model("cnn-bn", (3, 32, 32), 10))
    sizes = [64, 40, 64, 20]  # rows ending at different steps: the graph's mask, then one row eagerly
    features = torch.randn(sum(sizes), 3, 32, 32, generator=gen).to(DEVICE)
    labels = torch.randint(0, 10, (sum(sizes),), generator=gen).to(DEVICE)
    starts = torch.tensor([0, *sizes]).cumsum(0).tolist()
    indices = [torch.arange(a, b, device=DEVICE) for a, b in zip(starts[:-1], starts[1:])]
    plans = batch_plan(sizes, 16, 2, None, [torch.Generator().manual_seed(k) for k in range(len(sizes))])
    state = model.init(len(sizes), 0, DEVICE)
    trainable = set(model.param_names)
    eager = train_group(model, state, features, labels, indices, plans, SGD(0.05, 0.9), cross_entropy, {}, trainable)
    for _ in range(2):  # the first call captures, the second replays the cached graph
        static = train_group(
            model, state, features, labels, indices, plans, SGD(0.05, 0.9), cross_entropy, {}, trainable, static=True
        )
        for name in state:
            torch.testing.assert_close(static[0][name], eager[0][name], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(static[1], eager[1], rtol=1e-5, atol=1e-6)
    [step] = model.static_steps.values()
    assert (step.graph is not None) == (DEVICE == "cuda")
    if DEVICE == "cpu":
        assert all(torch.equal(static[0][n], eager[0][n]) for n in state) and torch.equal(static[1], eager[1])

    cell = small_cell(
        algorithm="fedbn",
        model="cnn-bn",
        dataset="synthetic-images",
        rounds=2,
        dataset_options={"channels": 3, "size": 32, "num_samples": 600},
        system={"stragglers": 0.4, "straggler_work": 0.5},
    )
    off, on = (
        run_cell(
            cell,
            data_root=tmp_path,
            execution=ExecutionOptions(device=DEVICE, client_batching="on", cuda_graphs=graphs),
        )
        for graphs in ("off", "on")
    )
    assert off.status == on.status == "finished"
    torch.testing.assert_close(
        torch.tensor(on.metrics["loss"].to_numpy()), torch.tensor(off.metrics["loss"].to_numpy()), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize(
    "algorithm, hp",
    [
        ("pfedme", {"k": 2, "personal_lr": 0.01}),
        ("perfedavg", {"variant": "hf"}),
        ("pfedhn", {"inner_optimizer": "official", "inner_steps": 5}),
    ],
)
def test_the_methods_own_steps_captured_match_the_eager_ones_on_the_device(tmp_path, monkeypatch, algorithm, hp):
    """On CUDA each method's own step is captured once per shape and replayed (the eager step's kernels, but
    for the SGD update of the rows that sit out, kept by `torch.where`); on the CPU it runs eagerly and the
    cells are equal to the bit."""
    import numpy as np

    from pflbench.simulator import captured

    captures = []
    capture = captured.capture
    monkeypatch.setattr(captured, "capture", lambda fn: (captures.append(1), capture(fn))[1])
    cell = small_cell(
        algorithm=algorithm,
        hp=hp,
        model="cnn-bn",
        dataset="synthetic-images",
        rounds=2,
        momentum=0.9,
        dataset_options={"channels": 3, "size": 32, "num_samples": 400},
        system={"stragglers": 0.4, "straggler_work": 0.5},
    )
    off, on = (
        run_cell(
            cell,
            data_root=tmp_path,
            execution=ExecutionOptions(device=DEVICE, client_batching="on", cuda_graphs=graphs),
        )
        for graphs in ("off", "on")
    )
    assert off.status == on.status == "finished"
    assert bool(captures) == (DEVICE == "cuda")
    torch.testing.assert_close(
        torch.tensor(on.metrics["loss"].to_numpy()), torch.tensor(off.metrics["loss"].to_numpy()), rtol=1e-4, atol=1e-5
    )
    if DEVICE == "cpu":
        assert np.array_equal(on.metrics["loss"].to_numpy(), off.metrics["loss"].to_numpy(), equal_nan=True)
