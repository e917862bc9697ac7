"""Runners sharing one store split its cells through claims: a cell is computed once, a claim held by
a live runner is respected, an abandoned one (dead owner, no heartbeat) is taken over."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time

import yaml
from rich.console import Console

from pflbench.storage import store as store_module
from pflbench.run.options import RunOptions
from pflbench.run.runner import run_plan
from pflbench.run.spec import parse_spec
from pflbench.storage.store import CLAIM, Store, load_store

SPEC = {
    "name": "shared",
    "matrix": {"algorithm": ["fedavg", "local"], "dataset": ["synthetic"], "seed": [0, 1, 2, 3]},
    "defaults": {
        "partition_params": {"classes_per_client": 2, "samples_per_client": 40},
        "clients": 4,
        "rounds": 15,
        "dataset_options": {"num_samples": 800},
    },
}


def _options(tmp_path) -> RunOptions:
    return RunOptions(results=tmp_path / "results", data_root=tmp_path / "data", use_ray=False)


def test_two_runners_at_once_compute_every_cell_exactly_once(tmp_path):
    spec = tmp_path / "shared.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    env = {**os.environ, "PFLBENCH_DATA": str(tmp_path / "data"), "PFLBENCH_DATA_MIRROR": str(tmp_path / "none")}
    command = [
        sys.executable,
        "-m",
        "pflbench.cli",
        "run",
        str(spec),
        "--results",
        str(tmp_path / "results"),
        "--no-ray",
    ]
    runners = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [runner.communicate(timeout=300)[0] for runner in runners]
    assert [runner.returncode for runner in runners] == [0, 0], outputs
    computed = [re.findall(r"^finished .* · ([0-9a-f]{12})", out, re.M) for out in outputs]
    every = [h for cells in computed for h in cells]
    assert sorted(every) == sorted(set(every)) and len(every) == 8, computed  # each cell once, by one runner
    table = load_store(tmp_path / "results")
    assert len(table) == 8 and (table["status"] == "finished").all()
    assert table["runner"].nunique() == sum(1 for cells in computed if cells)
    assert not list((tmp_path / "results").glob(f"*/{CLAIM}"))  # every claim released


def test_a_live_claim_is_respected_and_an_abandoned_one_taken_over(tmp_path, monkeypatch):
    plan = parse_spec(SPEC)
    options = _options(tmp_path)
    other = Store(options.results)  # another runner in this (live) process holds two cells
    held = plan.cells[:2]
    assert all(other.claim(cell) for cell in held)
    assert not Store(options.results).claim(held[0])  # not twice
    report = run_plan(plan, options, Console(quiet=True))
    assert report.ran == 6 and report.elsewhere == 2 and report.exit_code == 0
    assert all(Store(options.results).status(cell) is None for cell in held)

    # The holder dies without releasing: a claim naming a process that is gone is taken over at once,
    # one that is not refreshed for CLAIM_STALE seconds too.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    claim = other.cell_dir(held[0]) / CLAIM
    claim.write_text(json.dumps({"owner": "x", "host": other.host, "pid": int(dead.stdout)}))
    stale = other.cell_dir(held[1]) / CLAIM
    stale.write_text(json.dumps({"owner": "elsewhere", "host": "another-machine", "pid": 1}))
    old = time.time() - store_module.CLAIM_STALE - 5
    os.utime(stale, (old, old))
    report = run_plan(plan, options, Console(quiet=True))
    assert report.ran == 2 and report.elsewhere == 0
    assert len(load_store(options.results)) == 8


def test_a_cell_taken_over_without_a_checkpoint_says_it_starts_from_round_1(tmp_path):
    """What `kill -9` of a runner leaves when its cell had no checkpoint yet (a cell shorter than the default
    5-minute checkpoint policy): the cell's claim, naming a dead process. The next run says that the cell
    starts over, instead of restarting it silently; a cell nobody had started gets no such line."""
    from pflbench.config import cell_hash
    from pflbench.run.stops import NO_CHECKPOINT

    plan = parse_spec(
        {**SPEC, "matrix": {**SPEC["matrix"], "seed": [0]}, "defaults": {**SPEC["defaults"], "rounds": 2}}
    )
    options = _options(tmp_path)
    killed, _ = plan.cells
    store = Store(options.results)
    store.cell_dir(killed).mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (store.cell_dir(killed) / CLAIM).write_text(json.dumps({"owner": "x", "host": store.host, "pid": int(dead.stdout)}))
    console = Console(record=True, width=400, file=io.StringIO())
    report = run_plan(plan, options, console)
    assert report.ran == 2 and report.exit_code == 0
    notes = [line for line in console.export_text().splitlines() if NO_CHECKPOINT in line]
    assert len(notes) == 1 and cell_hash(killed) in notes[0], notes


def test_a_fresh_claim_from_another_machine_is_not_taken(tmp_path):
    store = Store(tmp_path)
    cell = parse_spec(SPEC).cells[0]
    store.cell_dir(cell).mkdir(parents=True)
    (store.cell_dir(cell) / CLAIM).write_text(json.dumps({"owner": "o", "host": "another-machine", "pid": 1}))
    assert not store.claim(cell)
    assert store.claim_holder(cell) == "o"
    store.heartbeat()  # refreshes only its own claims: none
    assert not store.claimed
