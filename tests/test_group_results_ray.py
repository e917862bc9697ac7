"""A cell group on Ray records each cell as it finishes (pflbench/run/result_relay.py): a fast cell's result is
in the driver's store while a slower cell of its group still runs, and a worker lost after that does not
make the finished cell run again; the slow one resumes from its checkpoint, and both give what the
cells give run one by one in this process."""

import io
import os
import signal
import threading
import time

import pandas as pd

from budgets import scaled
from gate_plugins import write_gated_fedavg
from pflbench.simulator.execution import ExecutionOptions

SLOW_ROUND = 3  # the slow cell waits at the start of this round (its checkpoint: the round before)


def test_a_finished_cell_is_recorded_while_its_group_runs_and_not_recomputed_after_a_lost_worker(
    tmp_path, local_ray, monkeypatch, fresh_plugins
):
    from checkpoint_helpers import TIMING_COLUMNS
    from pflbench.config import cell_hash
    from pflbench.run.options import RunOptions
    from pflbench.run.runner import run_plan
    from pflbench.run.spec import parse_spec
    from pflbench.storage.store import Store
    from rich.console import Console

    gate = tmp_path / "gate"
    plugin = write_gated_fedavg(tmp_path / "fast_and_slow.py", gate, "test-fast-and-slow-fedavg", SLOW_ROUND)
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    plan = parse_spec(
        {
            "name": "fast-and-slow",
            "plugins": [str(plugin)],
            "matrix": {
                "algorithm": ["test-fast-and-slow-fedavg"],
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
    fast, slow = sorted(plan.cells, key=lambda cell: cell.seed)
    assert (fast.rounds, slow.rounds) == (2, 5)
    reference = RunOptions(
        results=tmp_path / "alone",
        data_root=tmp_path / "data",
        use_ray=False,
        execution=ExecutionOptions(client_batching="on"),
    )
    assert run_plan(plan, reference, Console(file=io.StringIO())).exit_code == 0  # the gate is not armed
    for ran in gate.glob("ran-*"):
        ran.unlink()
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
    store = Store(options.results)
    seen: dict = {}
    errors: list = []

    def killer():
        try:
            deadline = time.monotonic() + scaled(180)  # Ray's workers start first: a bound scaled by the load
            while not list(gate.glob("waiting-*")):
                assert time.monotonic() < deadline, "the slow cell never reached its gate"
                time.sleep(0.05)
            [waiting] = gate.glob("waiting-*")
            pid = int(waiting.name.split("-")[1])
            assert pid != os.getpid(), "the group ran in this process, not on a Ray worker"
            # the slow cell waits at its gate, so it still runs: the fast one's result must reach the store
            while store.status(fast) != "finished":
                assert time.monotonic() < deadline, "the fast cell's result never reached the store"
                time.sleep(0.05)
            seen["fast_summary"] = (store.cell_dir(fast) / "summary.json").read_bytes()
            seen["slow_status"] = store.status(slow)
            seen["ran"] = sorted(path.name for path in gate.glob("ran-*"))
            os.kill(pid, signal.SIGKILL)
            seen["killed"] = pid
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(error)
        finally:
            (gate / "open").touch()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    output = io.StringIO()
    report = run_plan(plan, options, Console(file=output, width=300))
    thread.join(timeout=scaled(200))
    text = output.getvalue()
    assert not errors, f"{errors[0]!r}\n{text}"
    assert "killed" in seen and report.exit_code == 0, text
    # while the slow cell ran, the fast one was in the store, computed once, by the group's worker
    assert seen["slow_status"] not in ("finished", "diverged", "failed")
    pid = seen["killed"]
    assert seen["ran"] == [f"ran-{fast.rounds}-{pid}", f"ran-{slow.rounds}-{pid}"]
    # the lost worker's retry ran the slow cell alone, from its checkpoint; the fast one not again
    assert "retry 1 of 1" in text and "its group of" not in text, text
    assert sorted(path.name for path in gate.glob("ran-*")) == seen["ran"]
    assert (store.cell_dir(fast) / "summary.json").read_bytes() == seen["fast_summary"]
    assert store.summary(fast)["cell_group_cells"] == 2
    assert store.summary(slow)["resumed_from_round"] == SLOW_ROUND - 1
    alone = Store(reference.results)
    for cell in (fast, slow):
        assert store.status(cell) == "finished" and not store.checkpoint_path(cell).exists()
        for name in ("metrics.parquet", "rounds.parquet"):
            a = pd.read_parquet(store.cell_dir(cell) / name)
            b = pd.read_parquet(alone.cell_dir(cell) / name)
            columns = [c for c in a.columns if c not in TIMING_COLUMNS]
            pd.testing.assert_frame_equal(a[columns], b[columns], check_exact=True)
    assert cell_hash(fast) in report.outcomes and report.outcomes[cell_hash(fast)] == "finished"
