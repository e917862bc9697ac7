"""Preemption on Ray (pflbench/run/runner.py, pflbench/run/preemption.py): SIGTERM to the driver reaches the running
cell on its worker, which writes the checkpoint of the round in progress (through the driver's keeper)
and stops; the run starts no other cell and exits with PREEMPTED_EXIT; the next run resumes there and
gives the in-process result.

Deterministic, whatever the machine's load: the cell's algorithm is FedAvg with a trigger (a plugin
written here). At the start of round SIGNAL_ROUND it sends SIGTERM to the driver (this test's process)
and waits, bounded, until the stop reaches its worker (`pflbench.run.preemption.current()`): the end of that
round is where the cell must stop."""

from __future__ import annotations

import io
import os
import re

from rich.console import Console

from budgets import scaled
from checkpoint_helpers import assert_same_result
from pflbench.loader import plugins
from pflbench.storage.checkpoint import CHECKPOINT, read_header
from pflbench.config import cell_hash
from pflbench.run.preemption import PREEMPTED_EXIT
from pflbench.run.options import RunOptions
from pflbench.run.runner import run_plan
from pflbench.run.spec import parse_spec

ROUNDS = 8
SIGNAL_ROUND = 3
WAIT = scaled(120.0)  # for the driver's stop to reach the worker: a bound on a hang, scaled by the load

SIGNALLING_AVG = '''
"""FedAvg that, while {gate}/armed exists, sends SIGTERM to the process named in it at the start of round
{signal_round} and waits until the stop reaches this worker; results are FedAvg's."""
import os
import signal
import time
from pathlib import Path

from pflbench.algorithm import ALGORITHMS
from pflbench.algorithms.fedavg import FedAvg
from pflbench.run.preemption import current

GATE = Path({gate!r})


@ALGORITHMS.register("signalling-fedavg")
class SignallingFedAvg(FedAvg):
    def configure(self, rnd):
        if rnd.number == {signal_round} and (GATE / "armed").exists():
            os.kill(int((GATE / "armed").read_text()), signal.SIGTERM)
            deadline = time.monotonic() + {wait}
            while not current().requested:
                if time.monotonic() > deadline:
                    raise RuntimeError("the driver's stop never reached this worker")
                time.sleep(0.05)
        return super().configure(rnd)
'''


def test_sigterm_to_the_driver_checkpoints_the_ray_cell_at_the_end_of_its_round_and_the_rerun_resumes(
    local_ray, tmp_path, monkeypatch
):
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    gate = tmp_path / "gate"
    gate.mkdir()
    plugin = tmp_path / "signalling_avg.py"
    plugin.write_text(SIGNALLING_AVG.format(gate=str(gate), signal_round=SIGNAL_ROUND, wait=WAIT))
    before = {p.source.id for p in plugins.loaded()}
    plan = parse_spec(
        {
            "name": "ray-preempt",
            "plugins": [str(plugin)],
            "matrix": {
                "algorithm": ["signalling-fedavg"],
                "dataset": ["synthetic"],
                "partition": [{"scheme": "pathological", "params": {"classes_per_client": 3}}],
                "seed": [0, 1],
            },
            "defaults": {
                "clients": 5,
                "rounds": ROUNDS,
                "lr": 0.05,
                "eval_every": 2,
                "dataset_options": {"num_samples": 600},
            },
            "resources": {"cpus": 2},  # one cell at a time on the two CPUs of this Ray instance
        }
    )
    try:
        common = dict(data_root=tmp_path / "data", checkpoint_minutes=0)
        reference = RunOptions(results=tmp_path / "in-process", use_ray=False, **common)
        assert run_plan(plan, reference, Console(file=io.StringIO())).exit_code == 0

        on_ray = RunOptions(results=tmp_path / "ray", use_ray=True, **common)
        (gate / "armed").write_text(str(os.getpid()))
        output = io.StringIO()
        report = run_plan(plan, on_ray, Console(file=output, width=400))
        (gate / "armed").unlink()
        text = output.getvalue()
        assert report.exit_code == PREEMPTED_EXIT, text
        first, second = plan.cells
        assert re.search(
            rf"preempted \(SIGTERM\) on Ray: cell {cell_hash(first)} \(signalling-fedavg .*\): checkpoint "
            rf"written after round {SIGNAL_ROUND} of {ROUNDS}; the next run resumes at round {SIGNAL_ROUND} "
            rf"of {ROUNDS}; run the same command again to continue$",
            text,
            re.M,
        ), text
        store = on_ray.results
        assert read_header(store / cell_hash(first) / CHECKPOINT)["round"] == SIGNAL_ROUND
        assert not (store / cell_hash(first) / "summary.json").exists()
        assert not (store / cell_hash(second)).exists()  # never started

        again = io.StringIO()
        assert run_plan(plan, on_ray, Console(file=again, width=400)).exit_code == 0, again.getvalue()
        assert f"resumed at round {SIGNAL_ROUND} of {ROUNDS}" in again.getvalue()
        for cell in plan.cells:
            assert_same_result(store / cell_hash(cell), reference.results / cell_hash(cell))
    finally:
        for loaded in plugins.loaded():
            if loaded.source.id not in before:
                plugins.unload(loaded.source.id)
