"""The runner: failures are recorded while the other cells finish; Ray gives the in-process results."""

from __future__ import annotations

import math

import pytest
from rich.console import Console

from pflbench.simulator.metrics import RUN_RECORD_KEYS
from pflbench.simulator.execution import ExecutionOptions
from pflbench.algorithm import ALGORITHMS
from pflbench.fedavg import FedAvg
from pflbench.config import cell_hash
from pflbench.run.options import RunOptions
from pflbench.run.runner import run_plan
from pflbench.run.spec import parse_spec
from pflbench.storage.store import Store, load_store


class Raises(FedAvg):
    name = "test-runner-raises"

    def local_train(self, rnd, state):
        if rnd.number == 2:
            raise RuntimeError("boom in round 2")
        return super().local_train(rnd, state)


class InjectsNaN(FedAvg):
    """Uploads NaN weights, as an exploding update would."""

    name = "test-runner-nan"

    def local_train(self, rnd, state):
        state = super().local_train(rnd, state)
        return {k: v * math.nan if v.is_floating_point() else v for k, v in state.items()}


class RaisesMarkup(FedAvg):
    """Fails with a message that rich would read as (broken) console markup."""

    name = "test-runner-[/x]-markup"

    def local_train(self, rnd, state):
        raise RuntimeError("[/x] closing tag with nothing open [bold]")


@pytest.fixture
def broken_algorithms(monkeypatch):
    """Registered only for the test that uses them, so no other test ever runs them."""
    for algorithm in (Raises, InjectsNaN, RaisesMarkup):
        monkeypatch.setitem(ALGORITHMS._entries, algorithm.name, algorithm)


def plan(algorithms, seeds=(0,), rounds=3):
    return parse_spec(
        {
            "name": "t",
            "matrix": {
                "algorithm": list(algorithms),
                "dataset": ["synthetic"],
                "partition": [
                    {"scheme": "pathological", "params": {"classes_per_client": 2, "samples_per_client": 40}},
                    {"scheme": "dirichlet", "params": {"alpha": 0.5, "min_samples": 20}},
                ],
                "seed": list(seeds),
            },
            "defaults": {"clients": 5, "rounds": rounds, "lr": 0.05, "dataset_options": {"num_samples": 1000}},
        }
    )


@pytest.fixture
def options(tmp_path, monkeypatch):
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    return RunOptions(results=tmp_path / "results", data_root=tmp_path / "data", use_ray=False)


def quiet() -> Console:
    return Console(file=open("/dev/null", "w"), width=160)


def test_a_failing_and_a_diverging_cell_do_not_stop_the_others(broken_algorithms, options):
    the_plan = plan(["test-runner-raises", "fedavg", "test-runner-nan", "local"], rounds=4)
    report = run_plan(the_plan, options, quiet())
    assert report.exit_code == 1 and report.ran == 8
    store = Store(options.results)
    by_algorithm = {}
    for cell in the_plan.cells:
        by_algorithm.setdefault(cell.algorithm, set()).add(store.status(cell))
    assert by_algorithm == {
        "test-runner-raises": {"failed"},
        "fedavg": {"finished"},
        "test-runner-nan": {"diverged"},
        "local": {"finished"},
    }
    failed = next(c for c in the_plan.cells if c.algorithm == "test-runner-raises")
    traceback = (store.cell_dir(failed) / "error.txt").read_text()
    assert "in local_train" in traceback and traceback.strip().endswith("RuntimeError: boom in round 2")
    assert store.summary(failed)["error"] == "RuntimeError: boom in round 2"
    diverged = store.summary(next(c for c in the_plan.cells if c.algorithm == "test-runner-nan"))
    assert diverged["diverged_round"] == 1 and "non-finite" in diverged["error"]

    # Resume: finished and diverged cells are results; only the failed ones run again.
    again = run_plan(the_plan, options, quiet())
    assert again.ran == 2 and again.exit_code == 1
    table = load_store(options.results)
    assert len(table) == 8 and table.groupby("status").size().to_dict() == {"diverged": 2, "failed": 2, "finished": 4}


def test_ray_gives_the_in_process_summaries(local_ray, options, tmp_path):
    the_plan = plan(["fedavg", "local"], seeds=(0, 1))
    run_plan(the_plan, options, quiet())
    on_ray = RunOptions(results=tmp_path / "ray-results", data_root=options.data_root, use_ray=True, workers=2)
    report = run_plan(the_plan, on_ray, quiet())
    assert report.exit_code == 0 and report.ran == len(the_plan.cells) == 8
    # timings differ (and so do the checksums of the files holding them); everything else must not
    volatile = RUN_RECORD_KEYS | {"train_time_total", "server_time_total", "eval_time_total"}  # timings, memory
    for cell in the_plan.cells:
        here, there = Store(options.results).summary(cell), Store(on_ray.results).summary(cell)
        assert here["status"] == "finished" and here["hash"] == cell_hash(cell)
        assert {k: v for k, v in here.items() if k not in volatile} == {
            k: v for k, v in there.items() if k not in volatile
        }
        assert set(here["files"]) == set(there["files"])


def test_client_batching_option_reaches_every_cell(options):
    from dataclasses import replace

    run = plan(["fedavg"], rounds=1)
    assert run_plan(run, replace(options, execution=ExecutionOptions(client_batching="on")), quiet()).exit_code == 0
    store = load_store(options.results)
    assert len(store) == 2 and (store["client_batching"] == "batched").all()


def test_user_text_that_looks_like_console_markup_is_printed_as_text(broken_algorithms, options, tmp_path):
    """Spec names, algorithm names and error messages holding `[/x]` neither crash the console nor
    stop the run after the first failed cell (rich would raise MarkupError)."""
    from pflbench.run.summary import print_plan

    the_plan = plan([RaisesMarkup.name, "fedavg"], rounds=1)
    the_plan = the_plan.__class__(**{**the_plan.__dict__, "name": "spec [/x] [bold]"})
    log = tmp_path / "console.txt"
    console = Console(file=open(log, "w"), width=200)
    print_plan(console, the_plan, Store(options.results))
    report = run_plan(the_plan, options, console)
    assert report.ran == 4 and report.exit_code == 1  # every cell ran: 2 failed, 2 finished
    text = log.read_text()
    assert "spec [/x] [bold]" in text and "[/x] closing tag with nothing open [bold]" in text


def test_a_wrong_cluster_address_fails_within_seconds_with_a_clear_message(tmp_path, capsys, monkeypatch):
    """Nothing listens on the address: Ray would retry for minutes; the run says so at once."""
    import socket
    import time

    import yaml
    from budgets import scaled

    from pflbench.cli import main

    # A loopback port that nothing listens on: bound, not listening, until the test ends, so that no other
    # process (another test's Ray) can take it meanwhile.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # another test's local instance is not this run's
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "none"))
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "matrix": {"algorithm": ["fedavg"], "dataset": ["synthetic"]},
                "defaults": {"rounds": 1, "clients": 3, "dataset_options": {"num_samples": 300}},
            }
        )
    )
    start = time.monotonic()
    code = main(
        [
            "run",
            str(spec),
            "--results",
            str(tmp_path / "r"),
            "--root",
            str(tmp_path / "data"),
            "--ray-address",
            f"127.0.0.1:{port}",
        ]
    )
    assert code == 2 and time.monotonic() - start < scaled(30)  # not Ray's minutes of retries (load-scaled)
    probe.close()
    err = capsys.readouterr().err
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in err and "ray start --head" in err


def test_a_dataset_left_out_is_recorded_with_where_it_was_looked_for_and_how_to_provide_it(options, tmp_path):
    import json

    the_plan = parse_spec(
        {
            "name": "t",
            "matrix": {"algorithm": ["fedavg"], "dataset": ["synthetic", {"name": "fmnist", "optional": True}]},
            "defaults": {"clients": 3, "rounds": 1, "lr": 0.05, "partition_params": {"classes_per_client": 2}},
        }
    )
    log = tmp_path / "console.txt"
    report = run_plan(the_plan, options, Console(file=open(log, "w"), width=300))
    assert report.ran == 1 and report.skipped_datasets == {"fmnist": 1}
    note = json.loads((options.results / "_notes.json").read_text())["skipped_datasets"]["fmnist"]
    assert note["cells"] == 1 and note["spec"] == "t" and str(options.data_root) in note["looked_in"]
    assert "--from" in note["how_to_provide"] and "pflbench data prepare fmnist" in note["how_to_provide"]
    text = log.read_text()
    assert "--from" in text and "data prepare" in text and str(options.data_root) in text
    assert list(load_store(options.results)["dataset"]) == ["synthetic"]  # the note is not a cell


def test_a_local_ray_instance_runs_its_workers_at_the_drivers_priority(tmp_path):
    """Ray's default lowers workers to niceness 15, where beside other work at niceness 0 a cell gets
    ~1/30 of a core; the local instance `connect_ray` starts keeps them at 0 (the suite's conftest sets
    RAY_worker_niceness=0 for its own Ray: the probe runs without it, in a process of its own)."""
    import os
    import subprocess
    import sys

    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os, ray\n"
        "from pflbench.run.ray_cluster import connect_ray\n"
        "assert connect_ray(None, 1, 1.0)\n"
        "print('niceness', ray.get(ray.remote(num_cpus=1)(lambda: os.nice(0)).remote()))\n"
        "ray.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_worker_niceness", "RAY_ADDRESS")}
    out = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"niceness {os.nice(0)}" in out.stdout
