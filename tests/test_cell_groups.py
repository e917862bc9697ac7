"""Cell groups (pflbench.simulator.groups): a group of cells gives, per cell, what the same cells give run one by
one — bit for bit where the float order is the same (every request of two or more clients, and on
models without BatchNorm every request), within the stated tolerance where it is not (a one-client
request of a BatchNorm model, merged with others, trains stacked instead of unstacked). A cell that
diverges or fails leaves the group and the others go on.

The grouped runs batch across clients (client_batching "on", what CUDA uses by default); the cells run
one by one are run the same way, so the only difference is the group."""

import threading

import numpy as np
import pandas as pd
import pytest
import torch

from budgets import scaled
from cells import small_cell
from gate_plugins import write_gated_fedavg
from pflbench.loader import plugins
from pflbench.simulator.execution import ExecutionOptions
from pflbench.simulator.groups import CellGroup, membership, run_group
from pflbench.simulator.rounds import run_cell
from pflbench.simulator.training import cross_entropy, train_clients

BATCHED = ExecutionOptions(client_batching="on")
PLAIN_ROWS = [
    "local",
    "fedavg",
    "fedbn",
    "pfedla",
    "heurpfedla",
    "fedrep",
    "fedfomo",
    "fedrod",
    "fedala",
    "fedpac",
    "knn-per",
    "fedcac",
]
OWN_STEPS = ["pfedme", "perfedavg", "pfedhn", "feddbe", "gpfl"]
IMAGES = {
    "dataset": "synthetic-images",
    "dataset_options": {"num_samples": 300, "channels": 1, "size": 28},
    "rounds": 2,
}  # the grey CNN, channels-last on a CPU
BN_IMAGES = {**IMAGES, "dataset_options": {"num_samples": 300, "channels": 3, "size": 32}}  # the BatchNorm CNN


def solo_and_grouped(cells, root, execution=BATCHED):
    solo = [run_cell(cell, data_root=root, execution=execution) for cell in cells]
    return solo, run_group(cells, data_root=root, execution=execution)


def assert_same(solo, grouped, *, loss_atol=0.0, accuracy_atol=0.0, artifact_atol=0.0):
    """Everything a cell computed (wall times aside): rounds, clients, test samples, bytes, the rounds table,
    the artifacts' names, shapes and kinds exact; losses, accuracies and float artifacts within the tolerances
    given (0: bit for bit)."""
    assert grouped.status == solo.status and grouped.error == solo.error
    for column in ("round", "client", "test_samples", "bytes_down", "bytes_up"):
        assert np.array_equal(solo.metrics[column].to_numpy(), grouped.metrics[column].to_numpy()), column
    for column, atol in (
        ("loss", loss_atol),
        ("val_loss", loss_atol),
        ("accuracy", accuracy_atol),
        ("val_accuracy", accuracy_atol),
    ):
        np.testing.assert_allclose(
            solo.metrics[column].to_numpy(),
            grouped.metrics[column].to_numpy(),
            rtol=0,
            atol=atol,
            equal_nan=True,
            err_msg=column,
        )
    for column in ("bytes_up", "bytes_down", "clients"):
        assert solo.rounds[column].equals(grouped.rounds[column]), column
    assert solo.artifacts.keys() == grouped.artifacts.keys()
    for key, value in solo.artifacts.items():
        other = grouped.artifacts[key]
        assert value.shape == other.shape and value.dtype == other.dtype, key
        if value.dtype.kind == "f":
            np.testing.assert_allclose(value, other, rtol=0, atol=artifact_atol, equal_nan=True, err_msg=key)
        else:
            assert np.array_equal(value, other), key


def assert_identical(solo, grouped):
    """Everything a cell computed, bit for bit (wall times aside)."""
    assert_same(solo, grouped)


def assert_within_rounding(solo, grouped):
    """pFedHN's one-client calls train unstacked alone and stacked (width 2) when merged. On an Intel Xeon
    (family 6 model 207) the two are bit-identical; on an AMD EPYC (family 26 model 2) the stacked matmuls
    sum in another order: losses differed by at most 9.5e-7 (2 rounds, 15 client evaluations).
    Asserted: losses within 1e-5, accuracies within 0.05 (a near-tie may flip one test sample's
    prediction), float artifacts within 1e-4, everything else exact."""
    assert_same(solo, grouped, loss_atol=1e-5, accuracy_atol=0.05, artifact_atol=1e-4)


@pytest.mark.parametrize("algorithm", PLAIN_ROWS)
def test_a_row_grouped_over_seeds_is_bit_identical_and_every_call_is_merged(tmp_path, algorithm):
    cells = [small_cell(algorithm=algorithm, seed=seed) for seed in (0, 1, 2)]
    solo, group = solo_and_grouped(cells, tmp_path)
    for one, grouped, stats in zip(solo, group.results, group.stats):
        assert one.status == "finished"
        assert_identical(one, grouped)
        # every training call shared its step with the two other seeds' (5 clients each)
        assert stats.calls > 0 and stats.merged == stats.calls and stats.merged_width == 15 * stats.calls
        assert grouped.summary["cell_group_cells"] == 3 and grouped.summary["cell_group_merged_calls"] == stats.calls


@pytest.mark.parametrize("algorithm", OWN_STEPS)
def test_rows_with_their_own_steps_are_identical_in_a_group(tmp_path, algorithm):
    """pFedMe, Per-FedAvg, FedDBE and GPFL train through their own steps (on their cell's thread, not merged); pFedHN
    trains one client at a time through the plain step: those one-client calls are merged across the
    seeds; on this model (no BatchNorm) the stacked step is the unstacked one's arithmetic on an Intel Xeon,
    not on an AMD EPYC (assert_within_rounding)."""
    cells = [small_cell(algorithm=algorithm, seed=seed) for seed in (0, 1)]
    solo, group = solo_and_grouped(cells, tmp_path)
    for one, grouped, stats in zip(solo, group.results, group.stats):
        assert one.status == "finished"
        if algorithm == "pfedhn":
            assert_within_rounding(one, grouped)
        else:
            assert_identical(one, grouped)
        if algorithm == "pfedhn":
            assert stats.calls > 0 and stats.merged == stats.calls and stats.merged_width == 2 * stats.calls
        else:
            assert stats.merged == 0


def test_rows_mixing_their_own_steps_with_the_engines_are_identical_in_a_group(tmp_path):
    """FedAS aligns through its own steps (not merged) and trains through the plain step (merged across
    the seeds): every cell is what it is alone."""
    cells = [small_cell(algorithm="fedas", seed=seed) for seed in (0, 1)]
    solo, group = solo_and_grouped(cells, tmp_path)
    for one, grouped, stats in zip(solo, group.results, group.stats):
        assert one.status == "finished"
        assert_identical(one, grouped)
        assert stats.calls > 0 and stats.merged == stats.calls


def test_a_group_mixing_algorithms_and_datasets(tmp_path):
    """Rows of several algorithms (own steps among them), two partitions, CNN cells beside MLP cells:
    each request merges with those of its kind (same model, objective, trainable set, SGD structure),
    the rest run alone; every cell is what it is alone."""
    cells = [
        small_cell(algorithm="fedavg"),
        small_cell(algorithm="local", seed=1),
        small_cell(algorithm="fedrep"),
        small_cell(algorithm="pfedme"),
        small_cell(algorithm="fedavg", partition="dirichlet", partition_params={"alpha": 0.5}, seed=3),
        small_cell(algorithm="fedavg", **IMAGES),
        small_cell(algorithm="fedrep", seed=1, **IMAGES),
        small_cell(algorithm="local", seed=2, **IMAGES),
        small_cell(algorithm="fedavg", lr=0.02),  # another learning rate: merged, its rows' own rate
        small_cell(algorithm="fedavg", momentum=0.9),
    ]  # another SGD structure (momentum): never merged
    solo, group = solo_and_grouped(cells, tmp_path)
    for one, grouped in zip(solo, group.results):
        assert one.status == "finished"
        assert_identical(one, grouped)
    stats = group.stats
    assert stats[0].merged == stats[0].calls  # with local and the other partition's fedavg
    assert stats[3].calls == 0  # pFedMe: its own steps
    assert stats[5].merged == stats[5].calls  # the CNN fedavg with the CNN local (fedrep trains parts)
    assert stats[8].calls == 3 and stats[8].merged == 3
    assert stats[9].calls == 3 and stats[9].merged == 0


@pytest.mark.parametrize("images", [IMAGES, BN_IMAGES], ids=["cnn", "cnn-bn"])
def test_rows_with_different_learning_rates_share_a_step_bit_for_bit(tmp_path, images):
    """A column's rows train at their own learning rates (and momenta, weight decays): the merged step
    carries them per row (pflbench.simulator.row_rates), and each cell is what it is alone, to the bit."""
    cells = [
        small_cell(algorithm="fedavg", lr=0.05, **images),
        small_cell(algorithm="local", lr=0.013, **images),
        small_cell(algorithm="fedbn", lr=0.1, seed=1, **images),
        small_cell(algorithm="fedavg", lr=0.02, momentum=0.9, weight_decay=1e-3, **images),
        small_cell(algorithm="local", lr=0.07, momentum=0.5, weight_decay=5e-4, seed=2, **images),
    ]
    solo, group = solo_and_grouped(cells, tmp_path)
    for one, grouped, stats in zip(solo, group.results, group.stats):
        assert one.status == "finished"
        assert_identical(one, grouped)
        assert stats.merged == stats.calls > 0
    assert group.stats[0].merged_width == 15 * group.stats[0].calls  # three plain rules at three rates
    assert group.stats[3].merged_width == 10 * group.stats[3].calls  # two with momentum and weight decay


def test_batchnorm_cells_grouped_are_bit_identical(tmp_path):
    cells = [
        small_cell(algorithm=algorithm, seed=seed, **BN_IMAGES)
        for algorithm in ("fedbn", "local", "pfedla")
        for seed in (0, 1)
    ]
    solo, group = solo_and_grouped(cells, tmp_path)
    for one, grouped, stats in zip(solo, group.results, group.stats):
        assert one.status == "finished"
        assert_identical(one, grouped)
        assert stats.merged == stats.calls > 0


def test_cells_on_the_client_loop_run_their_own_calls_identically(tmp_path):
    """The loop path (a CPU's default) is never merged: each call is the cell's own, as outside a group."""
    cells = [small_cell(algorithm="fedavg", seed=seed) for seed in (0, 1)]
    solo, group = solo_and_grouped(cells, tmp_path, ExecutionOptions())
    for one, grouped, stats in zip(solo, group.results, group.stats):
        assert one.summary["client_batching"] == "loop"
        assert_identical(one, grouped)
        assert stats.calls == 3 and stats.merged == 0


def test_a_one_client_batchnorm_request_merged_is_within_float_rounding(tmp_path):
    """The one case whose float order changes: a one-client request trains unstacked alone and stacked
    when merged. Measured here (5 epochs, 10 steps of the BatchNorm CNN, two cells' client 0): the
    largest difference of any tensor 9.4e-7 and 2.5e-6 (bn2's running mean; the weights 1e-7 or less),
    of the mean losses 2.4e-7 and 1.2e-7; asserted below 1e-5 and 1e-6."""
    from cells import federation

    feds = [federation(small_cell(seed=seed, **BN_IMAGES), tmp_path) for seed in (0, 1)]
    one = torch.tensor([0])

    def request(fed):
        return (
            fed.model,
            fed.init_state(1),
            fed.features,
            fed.labels,
            [fed.splits["train"][0]],
            fed.local_plans(1, one, epochs=5),
            fed.sgd,
        )

    alone = [train_clients(*request(fed), batched=True) for fed in feds]
    group = CellGroup()
    members = [group.member(str(i)) for i in range(2)]
    merged: list = [None, None]

    def run(i):
        with members[i].joined():
            assert membership() is members[i]
            merged[i] = members[i].train_clients(*request(feds[i]), objective=cross_entropy, batched=True)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert membership() is None
    assert all(m.stats.merged == 1 and m.stats.merged_width == 2 for m in members)
    for (state, loss), (state_merged, loss_merged) in zip(alone, merged):
        torch.testing.assert_close(loss_merged, loss, rtol=0, atol=1e-6)
        for name, tensor in state.items():
            torch.testing.assert_close(state_merged[name], tensor, rtol=0, atol=1e-5)


# ---- cells leaving the group ---------------------------------------------------------------------

FAULTY = '''
from pflbench.algorithm import ALGORITHMS
from pflbench.algorithms.fedavg import FedAvg


@ALGORITHMS.register("test-poisoned-fedavg")
class PoisonedFedAvg(FedAvg):
    """FedAvg whose client 2 gets NaN features from round 2 on: its cell diverges in round 2."""

    def configure(self, rnd):
        if rnd.number == 2:
            features = self.engine.features.clone()
            features[self.engine.splits["train"][2]] = float("nan")
            self.engine.features = features
        return super().configure(rnd)


@ALGORITHMS.register("test-crashing-fedavg")
class CrashingFedAvg(FedAvg):
    """FedAvg whose server crashes in round 2."""

    def aggregate(self, rnd, upload):
        if rnd.number == 2:
            raise RuntimeError("the server of this cell crashed")
        return super().aggregate(rnd, upload)
'''


@pytest.fixture
def faulty_algorithms(tmp_path, fresh_plugins):
    """Two FedAvg variants that diverge or crash in round 2, as a plugin (unloaded after the test)."""
    plugin = tmp_path / "faulty_fedavg.py"
    plugin.write_text(FAULTY)
    plugins.load([str(plugin)])


def test_a_diverging_cell_leaves_the_group_and_the_others_go_on(tmp_path, faulty_algorithms):
    """The poisoned cell's requests merge with the others' (same model, objective and SGD rule): its
    non-finite losses are its own Diverged, the others' clients in the same step are untouched, and
    round 3 runs without it."""
    cells = [
        small_cell(algorithm="fedavg", rounds=4),
        small_cell(algorithm="test-poisoned-fedavg", rounds=4),
        small_cell(algorithm="local", seed=1, rounds=4),
    ]
    solo, group = solo_and_grouped(cells, tmp_path)
    assert [r.status for r in solo] == ["finished", "diverged", "finished"]
    assert solo[1].summary["diverged_round"] == 2 and "non-finite local loss for clients [2]" in solo[1].error
    for one, grouped in zip(solo, group.results):
        assert_identical(one, grouped)
    assert group.results[1].summary["diverged_round"] == 2
    assert group.stats[1].calls == group.stats[1].merged == 2
    assert group.stats[0].merged == group.stats[0].calls == 4
    assert group.stats[0].merged_width == 3 * 5 * 2 + 2 * 5 * 2  # rounds 1-2 three cells wide, then two


def test_a_failing_cell_leaves_the_group_with_its_traceback(tmp_path, faulty_algorithms):
    cells = [
        small_cell(algorithm="fedavg"),
        small_cell(algorithm="test-crashing-fedavg"),
        small_cell(algorithm="fedavg", seed=1),
    ]
    group = run_group(cells, data_root=tmp_path, execution=BATCHED)
    failed = group.results[1]
    assert failed.status == "failed"
    assert "RuntimeError: the server of this cell crashed" in failed.error and "Traceback" in failed.error
    for i in (0, 2):
        assert_identical(run_cell(cells[i], data_root=tmp_path, execution=BATCHED), group.results[i])
    assert group.stats[1].calls == 2 and group.stats[0].calls == 3


# ---- the runner: `pflbench run --cell-groups` ------------------------------------------------------


def test_cell_groups_option_auto_is_cuda_only():
    assert ExecutionOptions().grouped("cuda") and ExecutionOptions().grouped(torch.device("cuda", 1))
    assert not ExecutionOptions().grouped("cpu") and not ExecutionOptions(cell_groups="off").grouped("cuda")
    assert ExecutionOptions(cell_groups="on").grouped("cpu")
    with pytest.raises(ValueError, match="cell_groups must be one of"):
        ExecutionOptions(cell_groups="always")


def test_form_groups_by_architecture_in_order():
    from pflbench.simulator.groups import form_groups

    cells = [
        small_cell(seed=0),
        small_cell(**IMAGES),
        small_cell(algorithm="local"),
        small_cell(seed=1, **IMAGES),
        small_cell(dataset_options={"num_samples": 500}),
    ]
    assert form_groups(cells) == [[cells[0], cells[2]], [cells[1], cells[3]], [cells[4]]]
    assert form_groups(cells[:1] * 5, limit=2) == [cells[:1] * 2, cells[:1] * 2, cells[:1]]


def test_the_runner_records_grouped_cells_as_it_records_cells_alone(tmp_path, faulty_algorithms):
    """`pflbench run --no-ray` with groups: one group of 8 cells (a failing and a diverging one among
    them), each cell's result in the store as the ungrouped run writes it, the group recorded."""
    from pflbench.run.options import RunOptions
    from pflbench.run.runner import run_plan
    from pflbench.run.spec import parse_spec
    from pflbench.storage.store import Store
    from rich.console import Console

    the_plan = parse_spec(
        {
            "name": "t",
            "plugins": [str(tmp_path / "faulty_fedavg.py")],
            "matrix": {
                "algorithm": ["fedavg", "test-crashing-fedavg", "test-poisoned-fedavg", "local"],
                "dataset": ["synthetic"],
                "partition": [{"scheme": "pathological", "params": {"classes_per_client": 3}}],
                "seed": [0, 1],
            },
            "defaults": {
                "clients": 5,
                "rounds": 3,
                "lr": 0.05,
                "batch_size": 16,
                "dataset_options": {"num_samples": 1000},
            },
        }
    )
    runs = {}
    for groups in ("off", "on"):
        options = RunOptions(
            results=tmp_path / groups,
            data_root=tmp_path / "data",
            use_ray=False,
            execution=ExecutionOptions(client_batching="on", cell_groups=groups),
        )
        report = run_plan(the_plan, options, Console(file=open("/dev/null", "w"), width=160))
        assert report.exit_code == 1 and report.ran == 8
        runs[groups] = Store(options.results)
    for alone, grouped in same_results(the_plan.cells, runs["off"], runs["on"]):
        assert "cell_group_cells" not in alone
        if grouped["status"] != "failed":
            assert grouped["cell_group_cells"] == 8 and grouped["peak_host_bytes"] > 0


def same_results(cells, alone, grouped):
    """Each cell's summary (timings and run records aside) and metrics (wall time aside) in store `grouped`
    equal to those in store `alone`; the four faulty-plugin matrix's statuses: 2 diverged, 2 failed, 4
    finished. Returns (alone's, grouped's) summary per cell, for the caller's own checks."""
    from pflbench.simulator.metrics import RUN_RECORD_KEYS

    volatile = RUN_RECORD_KEYS | {"train_time_total", "server_time_total", "eval_time_total"}
    pairs = []
    for cell in cells:
        one, many = alone.summary(cell), grouped.summary(cell)
        assert {k: v for k, v in one.items() if k not in volatile} == {
            k: v for k, v in many.items() if k not in volatile
        }
        if many["status"] != "failed":
            metrics = [
                pd.read_parquet(store.cell_dir(cell) / "metrics.parquet").drop(columns="wall_time")
                for store in (alone, grouped)
            ]
            pd.testing.assert_frame_equal(*metrics)
        pairs.append((one, many))
    assert sorted(many["status"] for _, many in pairs) == ["diverged"] * 2 + ["failed"] * 2 + ["finished"] * 4
    return pairs


def test_a_cell_drawing_from_the_global_generator_runs_alone_before_the_group(tmp_path):
    """VGG8 has dropout layers, which draw from torch's global generator: that cell runs alone, in its
    own generator as run_cell runs it, and gives run_cell's numbers; the others are grouped."""
    cells = [
        small_cell(model="vgg8", rounds=1, **{k: v for k, v in IMAGES.items() if k != "rounds"}),
        small_cell(seed=0),
        small_cell(seed=1),
    ]
    solo, group = solo_and_grouped(cells, tmp_path)
    assert group.alone == [True, False, False] and group.stats[0] is None
    for one, grouped in zip(solo, group.results):
        assert one.status == "finished"
        assert_identical(one, grouped)
    assert group.stats[1].merged == group.stats[1].calls == 3


# ---- groups on Ray --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance of 2 CPUs for this module's tests on Ray (conftest's starts one per test),
    stopped when the module ends: later modules find Ray not initialized."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_group_resources_one_cells_cpus_and_the_gpu_fractions_summed_up_to_one_gpu():
    from pflbench.simulator.groups import group_resources
    from pflbench.run.spec_schema import Resources

    assert group_resources(Resources(cpus=2, gpus=0), 8) == Resources(cpus=2, gpus=0)
    assert group_resources(Resources(cpus=1, gpus=0.125), 4) == Resources(cpus=1, gpus=0.5)
    assert group_resources(Resources(cpus=1, gpus=0.1), 3).gpus == 0.3  # rounded: Ray's resolution
    assert group_resources(Resources(cpus=1, gpus=0.25), 10) == Resources(cpus=1, gpus=1.0)
    assert group_resources(Resources(cpus=1, gpus=2), 3) == Resources(cpus=1, gpus=2)


def test_groups_on_ray_give_the_one_by_one_summaries(tmp_path, faulty_algorithms, local_ray, monkeypatch):
    """`pflbench run` on Ray with cell groups: two groups (two dataset shapes), a failing and a diverging
    cell in one of them; every cell's summary and metrics are those of the in-process run one by one,
    and each grouped cell records its group."""
    from pflbench.run.options import RunOptions
    from pflbench.run.runner import run_plan
    from pflbench.run.spec import parse_spec
    from pflbench.storage.store import Store
    from rich.console import Console

    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    the_plan = parse_spec(
        {
            "name": "t",
            "plugins": [str(tmp_path / "faulty_fedavg.py")],
            "matrix": {
                "algorithm": ["fedavg", "test-crashing-fedavg", "test-poisoned-fedavg", "local"],
                "dataset": [
                    {"name": "synthetic", "options": {"num_samples": 1000}},
                    {"name": "synthetic-images", "options": IMAGES["dataset_options"]},
                ],
                "partition": [{"scheme": "pathological", "params": {"classes_per_client": 3}}],
                "seed": [0],
            },
            "defaults": {"clients": 5, "rounds": 3, "lr": 0.05, "batch_size": 16},
        }
    )
    runs = {}
    for where, groups, ray in (("alone", "off", False), ("ray", "on", True)):
        options = RunOptions(
            results=tmp_path / where,
            data_root=tmp_path / "data",
            use_ray=ray,
            workers=2 if ray else 1,
            execution=ExecutionOptions(client_batching="on", cell_groups=groups),
        )
        report = run_plan(the_plan, options, Console(file=open("/dev/null", "w"), width=160))
        assert report.exit_code == 1 and report.ran == 8
        runs[where] = Store(options.results)
    for _, grouped in same_results(the_plan.cells, runs["alone"], runs["ray"]):
        if grouped["status"] != "failed":
            assert grouped["cell_group_cells"] == 4 and grouped["cell_group_merged_calls"] > 0


GATE_ROUND = 4  # the first attempt of the gated group stops before this round: it resumes at GATE_ROUND - 1


def test_a_killed_group_on_ray_resumes_each_cell_from_its_own_checkpoint(
    tmp_path, local_ray, monkeypatch, fresh_plugins
):
    """A group of two cells on one Ray worker, killed (SIGKILL) once both wrote their checkpoint of round
    3 and wait at round 4: the group is retried, each cell resumes from its own checkpoint, and both end
    with the results of the uninterrupted in-process run one by one."""
    import io
    import os
    import signal
    import time

    from checkpoint_helpers import TIMING_COLUMNS
    from pflbench.storage.checkpoint import read_checkpoint
    from pflbench.run.options import RunOptions
    from pflbench.run.runner import run_plan
    from pflbench.run.spec import parse_spec
    from pflbench.storage.store import Store
    from rich.console import Console

    gate = tmp_path / "gate"
    plugin = write_gated_fedavg(tmp_path / "gated_group.py", gate, "test-gated-group-fedavg", GATE_ROUND)
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))

    def plan():
        return parse_spec(
            {
                "name": "group-retry",
                "plugins": [str(plugin)],
                "matrix": {
                    "algorithm": ["test-gated-group-fedavg"],
                    "dataset": ["synthetic"],
                    "partition": [{"scheme": "pathological", "params": {"classes_per_client": 3}}],
                    "seed": [0, 1],
                },
                "defaults": {
                    "clients": 5,
                    "rounds": 6,
                    "lr": 0.05,
                    "eval_every": 3,
                    "dataset_options": {"num_samples": 1000},
                },
            }
        )

    batched = ExecutionOptions(client_batching="on")
    reference = RunOptions(results=tmp_path / "alone", data_root=tmp_path / "data", use_ray=False, execution=batched)
    assert run_plan(plan(), reference, Console(file=io.StringIO())).exit_code == 0  # the gate is not armed
    (gate / "armed").touch()
    options = RunOptions(
        results=tmp_path / "ray",
        data_root=tmp_path / "data",
        use_ray=True,
        workers=2,
        checkpoint_every=1,
        checkpoint_minutes=0,
        retries=1,
        execution=ExecutionOptions(client_batching="on", cell_groups="on"),
    )
    killed: list = []
    errors: list = []

    def killer():
        try:
            deadline = time.monotonic() + scaled(180)  # Ray's workers start first: a bound scaled by the load
            while len(waiting := list(gate.glob("waiting-*"))) < 2:
                assert time.monotonic() < deadline, "the gated group never arrived"
                time.sleep(0.05)
            [pid] = {int(path.name.split("-")[1]) for path in waiting}  # one process: the group's
            assert pid != os.getpid(), "the group ran in this process, not on a Ray worker"
            rounds = []
            for path in (tmp_path / "ray").glob("*/checkpoint.pt"):
                header, payload = read_checkpoint(path)  # whole: header, size and checksum
                assert header["pid"] == pid, header
                rounds.append(payload["round"])
            assert rounds == [GATE_ROUND - 1] * 2, rounds
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(error)
        finally:
            (gate / "open").touch()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    output = io.StringIO()
    report = run_plan(plan(), options, Console(file=output, width=300))
    thread.join(timeout=scaled(200))
    text = output.getvalue()
    assert not errors, f"{errors[0]!r}\n{text}"
    assert killed and report.exit_code == 0, text
    assert "retry 1 of 1" in text and "its group of 2 cells again" in text, text
    store, alone = Store(tmp_path / "ray"), Store(reference.results)
    for cell in plan().cells:
        summary = store.summary(cell)
        assert summary["resumed_from_round"] == GATE_ROUND - 1 and summary["cell_group_cells"] == 2
        for name in ("metrics.parquet", "rounds.parquet"):
            a = pd.read_parquet(store.cell_dir(cell) / name)
            b = pd.read_parquet(alone.cell_dir(cell) / name)
            columns = [c for c in a.columns if c not in TIMING_COLUMNS]
            pd.testing.assert_frame_equal(a[columns], b[columns], check_exact=True)
        assert not store.checkpoint_path(cell).exists()


SIGNALLING = '''
import os
import signal
import time
from pathlib import Path

from pflbench.algorithm import ALGORITHMS
from pflbench.algorithms.fedavg import FedAvg
from pflbench.run.preemption import current

GATE = Path({gate!r})


@ALGORITHMS.register("test-signalling-group-fedavg")
class SignallingFedAvg(FedAvg):
    """FedAvg whose seed-0 cell, while GATE/armed exists, sends SIGTERM to the process named in it at the
    start of round {round} and waits until the stop reaches this worker; results are FedAvg's."""

    def configure(self, rnd):
        if rnd.number == {round} and self.engine.cell.seed == 0 and (GATE / "armed").exists():
            os.kill(int((GATE / "armed").read_text()), signal.SIGTERM)
            deadline = time.monotonic() + {wait:.0f}
            while not current().requested:
                if time.monotonic() > deadline:
                    raise RuntimeError("the driver's stop never reached this worker")
                time.sleep(0.05)
        return super().configure(rnd)
'''


def test_sigterm_stops_a_group_on_ray_at_the_end_of_its_round_and_the_rerun_resumes_each_cell(
    tmp_path, local_ray, monkeypatch, fresh_plugins
):
    """SIGTERM to the driver while a group of two cells runs on a Ray worker: both cells end the round in
    progress with a checkpoint, the run exits with PREEMPTED_EXIT naming each, and the next run resumes
    each from its checkpoint, equal to the in-process run one by one."""
    import io
    import os
    import re

    from checkpoint_helpers import assert_same_result
    from pflbench.storage.checkpoint import CHECKPOINT, read_header
    from pflbench.config import cell_hash
    from pflbench.run.preemption import PREEMPTED_EXIT
    from pflbench.run.options import RunOptions
    from pflbench.run.runner import run_plan
    from pflbench.run.spec import parse_spec
    from rich.console import Console

    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    gate, rounds, at = tmp_path / "gate", 6, 3
    gate.mkdir()
    plugin = tmp_path / "signalling_group.py"
    plugin.write_text(SIGNALLING.format(gate=str(gate), round=at, wait=scaled(120)))  # a bound scaled by the load
    plan = parse_spec(
        {
            "name": "group-preempt",
            "plugins": [str(plugin)],
            "matrix": {
                "algorithm": ["test-signalling-group-fedavg"],
                "dataset": ["synthetic"],
                "partition": [{"scheme": "pathological", "params": {"classes_per_client": 3}}],
                "seed": [0, 1],
            },
            "defaults": {
                "clients": 5,
                "rounds": rounds,
                "lr": 0.05,
                "eval_every": 2,
                "dataset_options": {"num_samples": 600},
            },
        }
    )
    common = dict(data_root=tmp_path / "data", checkpoint_minutes=0)
    reference = RunOptions(
        results=tmp_path / "alone", use_ray=False, execution=ExecutionOptions(client_batching="on"), **common
    )
    assert run_plan(plan, reference, Console(file=io.StringIO())).exit_code == 0
    on_ray = RunOptions(
        results=tmp_path / "ray",
        use_ray=True,
        workers=2,
        execution=ExecutionOptions(client_batching="on", cell_groups="on"),
        **common,
    )
    (gate / "armed").write_text(str(os.getpid()))
    output = io.StringIO()
    report = run_plan(plan, on_ray, Console(file=output, width=600))
    (gate / "armed").unlink()
    text = output.getvalue()
    assert report.exit_code == PREEMPTED_EXIT, text
    for cell in plan.cells:
        assert re.search(
            rf"cell {cell_hash(cell)} \(test-signalling-group-fedavg [^)]*\): checkpoint written after "
            rf"round {at} of {rounds}; the next run resumes at round {at} of {rounds}",
            text,
        ), text
        assert read_header(on_ray.results / cell_hash(cell) / CHECKPOINT)["round"] == at
        assert not (on_ray.results / cell_hash(cell) / "summary.json").exists()
    again = io.StringIO()
    assert run_plan(plan, on_ray, Console(file=again, width=400)).exit_code == 0, again.getvalue()
    assert again.getvalue().count(f"resumed at round {at} of {rounds}") == 2, again.getvalue()
    for cell in plan.cells:
        assert_same_result(on_ray.results / cell_hash(cell), reference.results / cell_hash(cell))


# ---- in-process groups record each cell as it finishes -------------------------------------------

RECORDED_GATE_ROUND = 3  # the slow cell waits at the start of this round (its last checkpoint: the round before)


def test_an_in_process_group_records_a_finished_cell_before_its_slower_cell_and_a_kill_loses_nothing(
    tmp_path, fresh_plugins, monkeypatch
):
    """`pflbench run --no-ray --cell-groups on`, a 2-round and a 5-round cell in one group: the 2-round
    cell's result is in the store while the 5-round one still runs; the process killed (SIGKILL) there,
    the next run computes only the 5-round cell, from its checkpoint; the finished cell's summary is the
    one written before the kill, and both cells' numbers are those of the cells run one by one."""
    import io
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from checkpoint_helpers import TIMING_COLUMNS
    from pflbench.simulator.groups import SUMMARY_KEYS
    from pflbench.simulator.metrics import RUN_RECORD_KEYS
    from pflbench.run.options import RunOptions
    from pflbench.run.runner import run_plan
    from pflbench.run.spec import load_spec
    from pflbench.storage.store import Store
    from rich.console import Console

    gate = tmp_path / "gate"
    plugin = write_gated_fedavg(
        tmp_path / "fast_and_slow.py", gate, "test-in-process-fast-and-slow-fedavg", RECORDED_GATE_ROUND, seconds=120
    )
    spec = tmp_path / "spec.json"  # JSON is YAML
    spec.write_text(
        json.dumps(
            {
                "name": "fast-and-slow",
                "plugins": [str(plugin)],
                "matrix": {
                    "algorithm": ["test-in-process-fast-and-slow-fedavg"],
                    "dataset": ["synthetic"],
                    "partition": [{"scheme": "pathological", "params": {"classes_per_client": 3}}],
                    "seed": [0, 1],
                },
                "defaults": {
                    "clients": 4,
                    "rounds": 5,
                    "lr": 0.05,
                    "eval_every": 2,
                    "dataset_options": {"num_samples": 600},
                },
                "overrides": [{"when": {"seed": 0}, "set": {"rounds": 2}}],
            }
        )
    )
    env = {
        **os.environ,
        "PFLBENCH_DATA": str(tmp_path / "data"),
        "PFLBENCH_DATA_MIRROR": str(tmp_path / "no-mirror"),
        "OMP_NUM_THREADS": "1",
    }
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", env["PFLBENCH_DATA_MIRROR"])  # the in-process runs: no mirror either
    plan = load_spec(spec)
    fast, slow = sorted(plan.cells, key=lambda cell: cell.seed)
    assert (fast.rounds, slow.rounds) == (2, 5)
    reference = RunOptions(
        results=tmp_path / "alone",
        data_root=tmp_path / "data",
        use_ray=False,
        execution=ExecutionOptions(client_batching="on", cell_groups="off"),
    )
    assert run_plan(plan, reference, Console(file=io.StringIO())).exit_code == 0  # the gate is not armed
    for ran in gate.glob("ran-*"):
        ran.unlink()

    (gate / "armed").touch()
    grouped = tmp_path / "grouped"
    store = Store(grouped)
    arguments = [
        "run",
        str(spec),
        "--results",
        str(grouped),
        "--root",
        str(tmp_path / "data"),
        "--no-ray",
        "--cell-groups",
        "on",
        "--client-batching",
        "on",
        "--checkpoint-every",
        "1",
        "--checkpoint-minutes",
        "0",
    ]
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pflbench.cli import main; sys.exit(main(sys.argv[1:]))", *arguments],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # The fast cell's result arrives after the process's start-up and its first cell: a bound scaled by the
    # load (tests/budgets.py), judged by whether it arrived, not by the clock after the kill.
    deadline = time.monotonic() + scaled(90)
    arrived = False
    try:
        while not list(gate.glob("waiting-*")) or store.status(fast) != "finished":
            if time.monotonic() > deadline or process.poll() is not None:
                break
            time.sleep(0.05)
        else:
            arrived = True
            [waiting] = gate.glob("waiting-*")
            assert int(waiting.name.split("-")[1]) == process.pid
            fast_summary = (store.cell_dir(fast) / "summary.json").read_bytes()
            assert store.status(slow) is None and not store.checkpoint_path(fast).exists()
            ran = sorted(path.name for path in gate.glob("ran-*"))
            assert ran == [f"ran-{fast.rounds}-{process.pid}", f"ran-{slow.rounds}-{process.pid}"]
    finally:
        process.send_signal(signal.SIGKILL)  # no chance to clean up (a no-op where it has ended)
        printed = process.communicate()[0]
    if not arrived or process.returncode != -signal.SIGKILL:
        pytest.fail(f"the fast cell's result never reached the store while the slow cell waited:\n{printed}")
    (gate / "armed").unlink()

    again = RunOptions(
        results=grouped,
        data_root=tmp_path / "data",
        use_ray=False,
        checkpoint_every=1,
        checkpoint_minutes=0,
        execution=ExecutionOptions(client_batching="on", cell_groups="on"),
    )
    output = io.StringIO()
    report = run_plan(load_spec(spec), again, Console(file=output, width=300))
    assert report.exit_code == 0 and report.ran == 1, output.getvalue()
    assert sorted(path.name for path in gate.glob("ran-*")) == ran  # nothing computed from round 1 again
    assert (store.cell_dir(fast) / "summary.json").read_bytes() == fast_summary  # written once
    assert store.summary(slow)["resumed_from_round"] == RECORDED_GATE_ROUND - 1
    alone = Store(reference.results)
    volatile = RUN_RECORD_KEYS | {"train_time_total", "server_time_total", "eval_time_total"} | set(SUMMARY_KEYS)
    for cell in (fast, slow):
        assert store.status(cell) == "finished" and not store.checkpoint_path(cell).exists()
        one, grouped_summary = alone.summary(cell), store.summary(cell)
        assert {k: v for k, v in one.items() if k not in volatile} == {
            k: v for k, v in grouped_summary.items() if k not in volatile | {"resumed_from_round"}
        }
        for name in ("metrics.parquet", "rounds.parquet"):
            a = pd.read_parquet(store.cell_dir(cell) / name)
            b = pd.read_parquet(alone.cell_dir(cell) / name)
            columns = [c for c in a.columns if c not in TIMING_COLUMNS]
            pd.testing.assert_frame_equal(a[columns], b[columns], check_exact=True)
    assert store.summary(fast)["cell_group_cells"] == 2
