"""Trackers (pflbench/run/trackers.py), read back from what they wrote: TensorBoard's event reader, W&B's
offline run files, MLflow's client on its file store. A cell killed after a checkpoint and resumed
continues its run: the same log folder, run id or run, the steps going on from the checkpoint's round.
W&B and MLflow are optional extras: their tests are skipped where the package is not installed;
TensorBoard is in the test extra."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import pytest
from cells import small_cell

from pflbench.config import cell_hash
from pflbench.run.cell import execute_cell
from pflbench.run.options import RunOptions
from pflbench.run.spec import Resources
from pflbench.run.trackers import TrackerOptions, problems

ROUNDS = 4


class Killed(Exception):
    """Stands in for a kill in round 3 (after the checkpoint of round 2)."""


def kill_in_round_3(info: dict) -> None:
    if info.get("round") == 3:
        raise Killed()


def run_killed_then_resumed(tmp_path: Path, kinds: tuple[str, ...]):
    """One small cell: a first attempt dies in round 3 (its checkpoint: round 2), a second resumes it."""
    cell = small_cell(rounds=ROUNDS, eval_every=1, finetune_epochs=1)
    options = RunOptions(
        results=tmp_path / "results",
        data_root=tmp_path / "data",
        use_ray=False,
        checkpoint_every=1,
        trackers=TrackerOptions(kinds),
    )
    notes: list[str] = []
    first = execute_cell(cell, Resources(), options, report=kill_in_round_3, note=notes.append)
    assert first.status == "failed" and "Killed" in first.error
    second = execute_cell(cell, Resources(), options, note=notes.append)
    assert second.status == "finished" and any("resumed at round 2" in n for n in notes), notes
    assert not any("tracker" in n for n in notes), notes  # no tracker stopped
    return cell, second, options


def test_options_and_missing_packages_are_named():
    with pytest.raises(ValueError, match="tracker 'neptune': allowed tensorboard, wandb, mlflow"):
        TrackerOptions(("neptune",))
    assert problems(["neptune"]) == ["--tracker neptune: unknown; allowed tensorboard, wandb, mlflow"]
    for kind in ("wandb", "mlflow"):
        if importlib.util.find_spec(kind) is None:
            assert problems([kind]) == [
                f"--tracker {kind}: the package {kind} is not installed here; pip install 'pflbench[{kind}]'"
            ]


def test_run_refuses_a_tracker_before_anything_runs(tmp_path, monkeypatch, capsys):
    from pflbench.cli import main

    real = importlib.util.find_spec
    # only tensorboard is missing: the shipped specs (pflbench.benchmarks) are found as ever
    monkeypatch.setattr(
        "pflbench.run.trackers.importlib.util.find_spec",
        lambda name, *a: None if name == "tensorboard" else real(name, *a),
    )
    with pytest.raises(SystemExit, match="--tracker tensorboard: the package tensorboard is not installed"):
        main(["run", "demo", "--tracker", "--results", str(tmp_path / "r")])
    assert not (tmp_path / "r").exists()


def test_tensorboard_streams_rounds_and_a_resumed_cell_continues_its_log(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cell, result, options = run_killed_then_resumed(tmp_path, ("tensorboard",))
    folder = options.results / "tensorboard" / cell_hash(cell)
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2  # one log folder, two attempts
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    steps = {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    # round 3, logged by the killed attempt too, is there once: the resumed one purged it
    assert steps["accuracy/delivered-clients"] == [1, 2, 3, 4]
    assert steps["val_accuracy/delivered-clients"] == [1, 2, 3, 4]
    assert steps["accuracy/adapted-clients"] == [1, 2, 3, 4] and steps["communication/mb_down"][-1] == ROUNDS
    last = events.Scalars("accuracy/delivered-clients")[-1].value
    assert last == pytest.approx(result.summary["final_accuracy"] * 100, rel=1e-5)
    final = events.Scalars("final/adapted-final-clients")
    assert [e.step for e in final] == [ROUNDS] and final[0].value == pytest.approx(
        result.summary["final_accuracy_adapted"] * 100, rel=1e-5
    )
    texts = {
        tag: [e.tensor_proto.string_val[0].decode() for e in events.Tensors(tag)] for tag in events.Tags()["tensors"]
    }
    config = " ".join(v for tag, values in texts.items() if tag.startswith("config") for v in values)
    assert f'cell_id: "{cell_hash(cell)}"' in config and 'cell.algorithm: "fedavg"' in config
    assert "metrics.accuracy/adapted-clients" in config and "after local adaptation" in config


def test_tensorboard_has_every_metric_while_the_cell_runs(tmp_path):
    """What a researcher watches mid-run: the killed attempt (it never reached `finish`) has logged
    every round's adapted, worst-10% and pooled accuracies, losses, bytes and seconds up to its death,
    with the values of the rows its result would have held."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cell = small_cell(rounds=ROUNDS, eval_every=1, finetune_epochs=1, clients=10)
    options = RunOptions(
        results=tmp_path / "results",
        data_root=tmp_path / "data",
        use_ray=False,
        checkpoint_every=1,
        trackers=TrackerOptions(("tensorboard",)),
    )
    first = execute_cell(cell, Resources(), options, report=kill_in_round_3)
    assert first.status == "failed"
    events = EventAccumulator(str(options.results / "tensorboard" / cell_hash(cell)), size_guidance={"scalars": 0})
    events.Reload()
    steps = {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    for tag in (
        "accuracy/delivered-clients",
        "val_accuracy/delivered-clients",
        "accuracy/adapted-clients",
        "accuracy/delivered-worst10",
        "accuracy/adapted-worst10",
        "accuracy/delivered-pooled",
        "loss/delivered-clients",
        "loss/adapted-clients",
        "communication/mb_down",
        "communication/mb_up",
        "time/round_s",
    ):
        assert steps[tag] == [1, 2, 3], tag
    assert not any(tag.startswith("final/") for tag in steps)  # the end never came
    # the same numbers as the finished cell's tables (a run of the cell from scratch: bit-identical rounds)
    done = execute_cell(
        cell, Resources(), RunOptions(results=tmp_path / "again", data_root=tmp_path / "data", use_ray=False)
    )
    rows = done.metrics[done.metrics["round"] == 2]
    logged = {tag: events.Scalars(tag)[1].value for tag in steps if not tag.startswith("time")}
    assert logged["accuracy/adapted-clients"] == pytest.approx(rows["accuracy_adapted"].mean() * 100, rel=1e-5)
    assert logged["accuracy/delivered-worst10"] == pytest.approx(rows["accuracy"].min() * 100, rel=1e-5)  # 1 of 10
    pooled = (rows["accuracy"] * rows["test_samples"]).sum() / rows["test_samples"].sum()
    assert logged["accuracy/delivered-pooled"] == pytest.approx(pooled * 100, rel=1e-5)
    assert logged["communication/mb_up"] == pytest.approx(done.rounds["bytes_up"].iloc[1] * 1e-6, rel=1e-5)


def test_a_spec_names_its_trackers(tmp_path, monkeypatch, capsys):
    """`trackers:` in a spec streams every cell like `--tracker`; an unknown kind is a spec error, a
    missing package stops the run before anything runs (a dry run only warns)."""
    from pflbench.cli import main
    from pflbench.run.spec import parse_spec
    from pflbench.run.spec_problems import SpecError

    spec = {
        "name": "t",
        "trackers": "tensorboard",
        "matrix": {
            "algorithm": ["fedavg"],
            "dataset": ["synthetic"],
            "seed": [0],
            "partition": [{"scheme": "pathological", "params": {"classes_per_client": 2}}],
        },
        "defaults": {"clients": 3, "rounds": 2, "lr": 0.05, "dataset_options": {"num_samples": 300}},
    }
    assert parse_spec(spec).trackers == ("tensorboard",)
    with pytest.raises(SpecError, match="trackers.0.*unknown tracker 'neptune'.*tensorboard, wandb, mlflow"):
        parse_spec({**spec, "trackers": ["neptune"]})
    import yaml

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    args = ["run", str(path), "--results", str(tmp_path / "r"), "--root", str(tmp_path / "data"), "--no-ray"]
    if importlib.util.find_spec("tensorboard") is not None:
        assert main(args) == 0
        assert list((tmp_path / "r" / "tensorboard" / cell_hash(parse_spec(spec).cells[0])).glob("events.*"))
    real = importlib.util.find_spec
    # only tensorboard is missing: the shipped specs (pflbench.benchmarks) are found as ever
    monkeypatch.setattr(
        "pflbench.run.trackers.importlib.util.find_spec",
        lambda name, *a: None if name == "tensorboard" else real(name, *a),
    )
    assert main([*args, "--dry-run"]) == 0
    assert (
        "warning: the spec's trackers: tensorboard: the package tensorboard is not installed" in capsys.readouterr().err
    )
    assert main([*args[:3], str(tmp_path / "r2"), *args[4:]]) == 2
    assert "nothing was run: the spec's trackers: tensorboard" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()


def wandb_records(path: Path) -> list:
    """The records of a W&B offline run file (run-<id>.wandb): a LevelDB-style log of Record protos."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pos, block, buffer = [], 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        buffer += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(buffer)
            records.append(record)
            buffer = b""
    return records


def finished_wandb_records(path: Path, timeout: float = 60.0) -> list:
    """The records once W&B's service has written the run's exit record (it writes after `finish`
    returns)."""
    import time

    from budgets import scaled

    deadline = time.monotonic() + scaled(timeout)  # W&B's service process: a bound scaled by the load
    while True:
        records = wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def test_wandb_offline_run_is_the_cells_and_continues_on_resume(tmp_path):
    pytest.importorskip("wandb", reason="W&B is an optional extra (pip install 'pflbench[wandb]')")
    import json

    cell, result, options = run_killed_then_resumed(tmp_path, ("wandb",))
    runs = sorted((options.results / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(cell_hash(cell)) for r in runs)  # one run id, two attempts
    history, configs = [], {}
    for run in runs:
        for record in finished_wandb_records(next(run.glob("run-*.wandb"))):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
            elif kind == "run":
                assert record.run.run_id == cell_hash(cell)
                configs.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
    streamed = [h["round"] for h in history if "accuracy/delivered-clients" in h]
    assert streamed == [1, 2, 3, 3, 4]  # the resumed attempt goes on from round 3 (W&B sync keeps the last)
    final = [h for h in history if "final/delivered-final-clients" in h]
    assert final and final[-1]["round"] == ROUNDS
    assert final[-1]["final/delivered-final-clients"] == pytest.approx(result.summary["final_accuracy"] * 100)
    assert configs["cell_id"] == cell_hash(cell) and configs["cell.rounds"] == ROUNDS


def test_mlflow_file_store_has_one_run_per_cell_continued_on_resume(tmp_path):
    pytest.importorskip("mlflow", reason="MLflow is an optional extra (pip install 'pflbench[mlflow]')")
    from mlflow.tracking import MlflowClient

    cell, result, options = run_killed_then_resumed(tmp_path, ("mlflow",))
    client = MlflowClient(tracking_uri=(options.results / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("pflbench")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].data.tags["pflbench.cell"] == cell_hash(cell)  # the same run, resumed
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["pflbench.status"] == "finished"
    assert run.data.params["cell_id"] == cell_hash(cell) and run.data.params["cell.rounds"] == str(ROUNDS)
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "accuracy/delivered-clients")]
    assert sorted(set(steps)) == [1, 2, 3, 4]
    final = client.get_metric_history(run.info.run_id, "final/adapted-final-clients")
    assert [m.step for m in final] == [ROUNDS]
    assert final[0].value == pytest.approx(result.summary["final_accuracy_adapted"] * 100)


def test_a_ray_worker_streams_too(tmp_path, monkeypatch):
    """The tracker runs where the cell runs: on a Ray worker, writing under the (absolute) store."""
    pytest.importorskip("tensorboard")
    ray = pytest.importorskip("ray")
    from rich.console import Console

    from pflbench.run.runner import run_plan
    from pflbench.run.spec import parse_spec

    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    monkeypatch.chdir(tmp_path)
    spec = {
        "name": "t",
        "matrix": {
            "algorithm": ["fedavg"],
            "dataset": ["synthetic"],
            "partition": [{"scheme": "pathological", "params": {"classes_per_client": 2}}],
            "seed": [0],
        },
        "defaults": {"clients": 3, "rounds": 2, "lr": 0.05, "dataset_options": {"num_samples": 300}},
    }
    the_plan = parse_spec(spec)
    options = RunOptions(
        results=Path("results"),
        data_root=tmp_path / "data",
        use_ray=True,
        workers=1,
        trackers=TrackerOptions(("tensorboard",)),
    )
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        report = run_plan(the_plan, options, Console(file=open("/dev/null", "w")))
    finally:
        ray.shutdown()
    assert report.exit_code == 0
    folder = tmp_path / "results" / "tensorboard" / cell_hash(the_plan.cells[0])
    assert list(folder.glob("events.out.tfevents.*"))
