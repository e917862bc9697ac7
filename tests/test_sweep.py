"""Sweeps: a tiny Ray Tune + Optuna sweep writes a best configuration that a spec and the runner use;
the objective never touches the clients' test splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from rich.console import Console

import pflbench.simulator.rounds as rounds
from pflbench.simulator.execution import ExecutionOptions
from pflbench.config import cell_hash
from pflbench.data.partitioning import ClientSplits
from pflbench.run.options import RunOptions
from pflbench.run.runner import run_plan
from pflbench.run.spec import parse_spec
from pflbench.storage.store import Store
from pflbench.tuning.sweep import run_sweep
from pflbench.tuning.trial import SweepError, SweepOptions, run_trial, search_space, trial_cell

BASE = {
    "name": "sweep-test",
    "matrix": {
        "algorithm": "fedprox",
        "dataset": "synthetic",
        "partition": [{"scheme": "pathological", "params": {"classes_per_client": 2, "samples_per_client": 60}}],
    },
    "defaults": {"clients": 4, "rounds": 2, "lr": 0.05, "dataset_options": {"num_samples": 1000}},
}


def base_plan():
    return parse_spec(BASE)


class WithheldTestSplit(ClientSplits):
    """Splits whose test indices raise (and are counted) when anything reads them."""

    reads = 0

    def __getattribute__(self, name):
        if name == "test":
            type(self).reads += 1
            raise AssertionError("the test split was read")
        return super().__getattribute__(name)


@pytest.fixture
def poisoned_test_split(monkeypatch, tmp_path):
    real = rounds.prepare_cell

    def prepare(cell, data_root=None, mirror=None):
        dataset, splits = real(cell, tmp_path / "data", mirror)
        WithheldTestSplit.reads = 0
        poisoned = object.__new__(WithheldTestSplit)
        object.__setattr__(poisoned, "train", splits.train)
        object.__setattr__(poisoned, "val", splits.val)
        return dataset, poisoned

    monkeypatch.setattr(rounds, "prepare_cell", prepare)
    return WithheldTestSplit


def test_the_trial_objective_never_reads_the_test_split(poisoned_test_split, monkeypatch):
    from ray import tune

    reports = []
    monkeypatch.setattr(tune, "report", lambda metrics, **_: reports.append(metrics))
    base = base_plan().cells[0]
    run_trial(
        {"lr": 0.03, "hp": {"mu": 0.1}},
        base=base.model_dump(mode="json"),
        cpus=1,
        data_root=None,
        mirror=None,
        execution=ExecutionOptions(device="cpu"),
    )
    assert poisoned_test_split.reads == 0
    assert [r["round"] for r in reports] == [1, 2] and all(0 <= r["val_accuracy"] <= 1 for r in reports)
    # The engine's own evaluation: without "test" nothing of it is on the device or in the metrics.
    result = rounds.run_cell(trial_cell(base, {"lr": 0.03}), evaluate=("val",))
    assert poisoned_test_split.reads == 0
    assert result.metrics["accuracy"].isna().all() and result.metrics["val_accuracy"].notna().all()
    assert "final_accuracy" not in result.summary and "final_val_accuracy" in result.summary
    with pytest.raises(AssertionError, match="test split was read"):  # the poison works: a benchmark run reads it
        rounds.run_cell(base)


def test_search_space_has_the_algorithms_ranges_and_the_learning_rate():
    base = base_plan().cells[0]
    assert search_space("fedprox", base) == {"lr": ("loguniform", 0.005, 0.5), "hp.mu": ("loguniform", 1e-3, 1.0)}
    assert search_space("fedprox", base, tune_lr=False) == {"hp.mu": ("loguniform", 1e-3, 1.0)}
    with pytest.raises(SweepError, match="nothing to tune"):
        search_space("fedavg", base, tune_lr=False)
    tuned = trial_cell(base, {"lr": 0.02, "hp": {"mu": 0.5}})
    spelled_out = parse_spec({**BASE, "defaults": {**BASE["defaults"], "lr": 0.02, "hp": {"mu": 0.5}}}).cells[0]
    assert cell_hash(tuned) == cell_hash(spelled_out)  # one resolution for trials and specs


def test_tiny_sweep_through_ray_tune_writes_a_configuration_the_runner_uses(tmp_path):
    base = base_plan().cells[0]
    data_root = tmp_path / "data"
    # Poison the cached partition that every trial loads: test indices far outside the dataset, so
    # evaluating (or indexing) a test split anywhere in a Ray worker would fail that trial.
    rounds.prepare_cell(base, data_root)
    [cache] = list((data_root / "cache" / "partitions").glob("*.npz"))
    splits = ClientSplits.load(cache)
    ClientSplits(splits.train, splits.val, [np.full(len(t), 10**9) for t in splits.test]).save(cache)

    out = tmp_path / "tuned"
    result = run_sweep(
        "fedprox",
        base,
        base_plan().resources,
        SweepOptions(trials=2, results=tmp_path / "results", out=out, data_root=data_root, workers=2),
        log=lambda *_: None,
    )
    assert len(result.trials) == 2
    assert all(t["status"] in ("completed", "stopped early") and t["error"] is None for t in result.trials)
    assert result.best["status"] == "completed" and 0 <= result.best["val_accuracy"] <= 1
    assert (result.folder / "sweep.json").is_file() and (result.folder / "trials.parquet").is_file()
    assert result.folder.parent == (tmp_path / "results" / "sweeps").resolve()

    tuned = yaml.safe_load((out / "fedprox.yaml").read_text())
    assert tuned["algorithm"] == "fedprox" and set(tuned["set"]) == {"lr", "hp"}
    spec = {**BASE, "matrix": {**BASE["matrix"], "algorithm": ["fedprox", "fedavg"]}, "tuned": {"dir": str(out)}}
    plan = parse_spec(spec)
    by_algorithm = {c.algorithm: c for c in plan.cells}
    assert by_algorithm["fedprox"].hp_source == "tuned" and by_algorithm["fedavg"].hp_source == "default"
    assert by_algorithm["fedprox"].hp["mu"] == pytest.approx(result.best["values"]["hp"]["mu"], rel=1e-5)
    assert by_algorithm["fedprox"].lr == pytest.approx(result.best["values"]["lr"], rel=1e-5)
    assert plan.tuned == {"fedprox": str(out / "fedprox.yaml")}

    options = RunOptions(results=tmp_path / "bench", data_root=tmp_path / "clean-data", use_ray=False)
    report = run_plan(plan, options, Console(file=open("/dev/null", "w")))
    assert report.exit_code == 0
    assert Store(tmp_path / "bench").status(by_algorithm["fedprox"]) == "finished"
    stored = yaml.safe_load((Store(tmp_path / "bench").cell_dir(by_algorithm["fedprox"]) / "config.json").read_text())
    assert stored["cell"]["hp_source"] == "tuned"


def test_a_sweep_base_must_be_one_cell(tmp_path):
    from pflbench.tuning.trial import base_cell

    path = Path(tmp_path / "two.yaml")
    path.write_text(yaml.safe_dump({**BASE, "matrix": {**BASE["matrix"], "seed": [0, 1]}}))
    with pytest.raises(SweepError, match="gives 2 cells for fedprox.*seed"):
        base_cell("fedprox", path)
    cell, _ = base_cell("fedprox", path, {"seed": 1})
    assert cell.seed == 1 and cell.algorithm == "fedprox"


def test_a_wrong_cluster_address_fails_the_sweep_within_seconds_with_a_clear_message(tmp_path, monkeypatch):
    """As `pflbench run`: nothing listens there, so Ray would retry for minutes; the sweep says so at once."""
    import socket
    import time

    from budgets import scaled

    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # another test's local instance is not this sweep's
    # A loopback port that nothing listens on: bound, not listening, until the test ends, so that no other
    # process (another test's Ray) can take it meanwhile.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    base = base_plan().cells[0]
    start = time.monotonic()
    with pytest.raises(SweepError, match=rf"cannot reach a Ray cluster at 127.0.0.1:{port} .*ray start --head"):
        run_sweep(
            "fedprox",
            base,
            base_plan().resources,
            SweepOptions(
                trials=1,
                results=tmp_path / "sweeps",
                out=tmp_path / "tuned",
                ray_address=f"127.0.0.1:{port}",
                data_root=tmp_path,
            ),
        )
    assert time.monotonic() - start < scaled(30)  # not Ray's minutes of retries (load-scaled)
    probe.close()
