"""Ray: a cell whose worker process is killed (SIGKILL) is retried and resumes from its checkpoint,
ending with the in-process run's result; with no retries left it is recorded as failed.

Deterministic, whatever the machine's load: the cell's algorithm is FedAvg with a gate (a plugin
written here). On its first attempt on a Ray worker it stops at the start of round GATE_ROUND, after
the checkpoint of round GATE_ROUND - 1 was written (the write is synchronous), and says so with a file
naming its process. The test waits for that file (or for the run to end without it: a failure
that says so), checks that the stored checkpoint is
complete (header, size and checksum read back) and is the gated process's round GATE_ROUND - 1,
kills that process with SIGKILL, then opens the gate for the retry. The worker can neither finish
the cell before the kill nor be killed before its checkpoint is whole. (Before the gate, a thread
killed the writer of the first checkpoint it saw; at ~50 ms a round it sometimes saw one only after
the cell had finished, and there was then nothing to retry: the flake of issue 45.)
"""

from __future__ import annotations

import io
import os
import signal
import threading
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from checkpoint_helpers import TIMING_COLUMNS
from pflbench.loader import plugins
from pflbench.storage.checkpoint import read_checkpoint
from pflbench.run.options import RunOptions
from pflbench.run.runner import run_plan
from pflbench.run.spec import parse_spec
from pflbench.storage.store import Store

ROUNDS = 10
GATE_ROUND = 4  # the first attempt stops before this round: it resumes at GATE_ROUND - 1
# No fixed wait for the gated worker: however long a loaded machine takes to start Ray and reach the gate,
# the test waits while the run goes on (pytest's timeout bounds the whole). A worker at the gate is
# killed at once; this bound only ends a worker whose test process died before opening the gate.
ORPHANED_GATE = 900.0  # seconds

GATED_AVG = '''
"""FedAvg that stops at the start of round {gate_round} while {gate}/armed exists and {gate}/open does
not, after writing {gate}/waiting-<pid> (the test kills it there); results are FedAvg's."""
import os
import time
from pathlib import Path

from pflbench.algorithm import ALGORITHMS
from pflbench.algorithms.fedavg import FedAvg

GATE = Path({gate!r})


@ALGORITHMS.register("gated-fedavg")
class GatedFedAvg(FedAvg):
    def configure(self, rnd):
        if rnd.number == {gate_round} and (GATE / "armed").exists():
            (GATE / f"waiting-{{os.getpid()}}").touch()
            deadline = time.monotonic() + {wait}
            while not (GATE / "open").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the test never killed this worker nor opened the gate")
                time.sleep(0.05)
        return super().configure(rnd)
'''


@pytest.fixture
def gated_plan(tmp_path):
    """The plan (a function: a fresh Plan each call) and the gate folder; the plugin is unloaded after."""
    gate = tmp_path / "gate"
    gate.mkdir()
    plugin = tmp_path / "gated_avg.py"
    plugin.write_text(GATED_AVG.format(gate=str(gate), gate_round=GATE_ROUND, wait=ORPHANED_GATE))
    before = {p.source.id for p in plugins.loaded()}

    def plan():
        return parse_spec(
            {
                "name": "ray-retry",
                "plugins": [str(plugin)],
                "matrix": {
                    "algorithm": ["gated-fedavg"],
                    "dataset": ["synthetic"],
                    "partition": [{"scheme": "pathological", "params": {"classes_per_client": 3}}],
                    "seed": [0],
                },
                "defaults": {
                    "clients": 5,
                    "rounds": ROUNDS,
                    "local_epochs": 2,
                    "lr": 0.05,
                    "eval_every": 5,
                    "dataset_options": {"num_samples": 1000},
                },
                "resources": {"cpus": 1},
            }
        )

    yield plan, gate
    for loaded in plugins.loaded():
        if loaded.source.id not in before:
            plugins.unload(loaded.source.id)


def kill_at_the_gate(store_root: Path, gate: Path, killed: list, run_ended: threading.Event) -> None:
    """Wait for the gated worker (until the run ends without one), check its checkpoint is whole, kill -9
    it, open the gate. Opens the gate whatever happens, so that a worker never waits out its bound."""
    try:
        while not (waiting := list(gate.glob("waiting-*"))):
            if run_ended.wait(0.05):
                return
        pid = int(waiting[0].name.split("-", 1)[1])
        [path] = store_root.glob("*/checkpoint.pt")
        header, payload = read_checkpoint(path)  # the whole file: header, size and checksum
        assert pid != os.getpid(), "the cell ran in this process, not on a Ray worker"
        assert header["pid"] == pid and header["round"] == payload["round"] == GATE_ROUND - 1, header
        os.kill(pid, signal.SIGKILL)
        killed.append(header["round"])
    finally:
        (gate / "open").touch()


@pytest.mark.parametrize("retries", [1, 0])
def test_a_lost_ray_worker_is_retried_and_resumes_from_its_checkpoint(tmp_path, monkeypatch, retries, gated_plan):
    plan, gate = gated_plan
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    data = tmp_path / "data"
    reference = RunOptions(results=tmp_path / "in-process", data_root=data, use_ray=False)
    if retries:
        assert run_plan(plan(), reference, Console(file=io.StringIO())).exit_code == 0  # the gate is not armed
    (gate / "armed").touch()
    options = RunOptions(
        results=tmp_path / "ray",
        data_root=data,
        use_ray=True,
        workers=2,
        checkpoint_every=1,
        checkpoint_minutes=0,
        retries=retries,
    )
    killed: list = []
    errors: list = []
    run_ended = threading.Event()

    def killer():
        try:
            kill_at_the_gate(tmp_path / "ray", gate, killed, run_ended)
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(error)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    output = io.StringIO()
    try:
        report = run_plan(plan(), options, Console(file=output, width=300))
    finally:
        run_ended.set()
        thread.join()
    text = output.getvalue()
    assert not errors, f"{errors[0]!r}\n{text}"
    assert killed == [GATE_ROUND - 1], f"the gated worker never arrived: {text}"
    cell = plan().cells[0]
    store = Store(tmp_path / "ray")
    if not retries:
        assert report.exit_code == 1 and store.status(cell) == "failed", text
        assert "after 0 retries" in store.summary(cell)["error"]
        assert store.checkpoint_path(cell).exists()  # kept: the next run continues the cell
        return
    assert report.exit_code == 0, text
    assert store.summary(cell)["resumed_from_round"] == GATE_ROUND - 1
    assert "retry 1 of 1" in text and f"resumed at round {GATE_ROUND - 1} of {ROUNDS}" in text, text
    for name in ("metrics.parquet", "rounds.parquet"):
        a = pd.read_parquet(store.cell_dir(cell) / name)
        b = pd.read_parquet(Store(reference.results).cell_dir(cell) / name)
        columns = [c for c in a.columns if c not in TIMING_COLUMNS]
        pd.testing.assert_frame_equal(a[columns], b[columns], check_exact=True)
    assert not store.checkpoint_path(cell).exists()


# ---- the keeper (pflbench/run/checkpoint_relay.py), as a plain object: what it writes and what it refuses ----


def test_the_keeper_writes_only_the_open_attempt_of_a_cell_and_only_whole_checkpoints(tmp_path):
    from pflbench.storage.checkpoint import CheckpointProblem, encode_checkpoint, read_header
    from pflbench.run.checkpoint_relay import CheckpointKeeper, StaleAttempt

    keeper = CheckpointKeeper(str(tmp_path / "store"))
    data = encode_checkpoint({"hash": "cell", "round": 2}, {"round": 2, "weights": list(range(1000))})
    with pytest.raises(StaleAttempt, match="attempt 0 is not the cell's current one \\(closed\\)"):
        keeper.write("cell", 0, data)
    keeper.open("cell", 0)
    keeper.write("cell", 0, data)
    path = tmp_path / "store" / "cell" / "checkpoint.pt"
    assert path.read_bytes() == data and read_header(path)["round"] == 2 and keeper.read("cell") == data
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint.pt"]  # no temporary file left
    with pytest.raises(CheckpointProblem, match="arrived damaged: checksum differs; nothing written"):
        keeper.write("cell", 0, data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CheckpointProblem, match="arrived damaged: 5 bytes of payload"):
        keeper.write("cell", 0, data[: data.index(b"\n") + 6])
    keeper.open("other", 0)
    with pytest.raises(CheckpointProblem, match="a checkpoint of cell cell sent as cell other's"):
        keeper.write("other", 0, data)
    keeper.open("cell", 1)  # a retry: the lost attempt 0 may write no more
    with pytest.raises(StaleAttempt, match="attempt 0 is not the cell's current one \\(1\\)"):
        keeper.write("cell", 0, data)
    copy = keeper.keep("cell", 1, 2, data)  # a kept copy (--keep-checkpoints-from), on the driver's node
    assert copy.split(":", 1)[1] == str(tmp_path / "store" / "_kept" / "cell" / "round-0002.pt")
    assert (tmp_path / "store" / "_kept" / "cell" / "round-0002.pt").read_bytes() == data
    with pytest.raises(StaleAttempt, match="attempt 0 is not the cell's current one"):
        keeper.keep("cell", 0, 2, data)
    kept = keeper.set_aside("cell", 1, "damaged: for the test")
    assert kept.split(":", 1)[1].startswith(str(tmp_path / "store" / "_damaged" / "cell-checkpoint-"))
    assert keeper.read("cell") is None
    keeper.close("cell")  # the result is being recorded: nothing may land after it
    with pytest.raises(StaleAttempt, match="closed"):
        keeper.write("cell", 1, data)
    assert not path.exists()


def test_the_code_version_names_source_files_without_the_checkouts_place():
    """A retry on another node resumes only if that node's code version is the writer's: the hash covers
    the files' names inside the checkout and their contents, never where the checkout lives."""
    from pflbench.algorithm import ALGORITHMS
    from pflbench.storage.code_version import source_files

    names = source_files(ALGORITHMS.get("fedavg"))
    assert {"pflbench/simulator/rounds.py", "pflbench/storage/checkpoint.py", "pflbench/fedavg.py"} <= set(names)
    assert not any(name.startswith("/") or "reports/" in name for name in names), sorted(names)
