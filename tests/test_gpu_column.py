"""A paper-scale column across GPU loans (benchmarks/gpu/column.py), on the CPU with a tiny spec: a cell that
finishes comes back in the results archive; a cell still running at the deadline is stopped and comes back as
its checkpoint's own archive, and the next call, given the files, resumes it from there; a results archive over
the part size is split and put back together byte for byte; a checkpoint over its cap is left out (said) while
the finished rows still come back.

The deadline comes when there is something to show, not after fixed seconds (a loaded machine took over 20 s
to start the cells): column.py's clock is its real one until the loan's condition holds (FedAvg finished and
Local checkpointed, then Local checkpointed past that round), then it jumps past the deadline; column.py
then kills, packs and reports as at a real deadline."""

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
import column  # noqa: E402

SPEC = """
name: tiny-column
matrix:
  algorithm: [fedavg, local]
  dataset: [{name: synthetic, options: {num_samples: 600}}]
  partition: [{scheme: pathological, params: {classes_per_client: 4, samples_per_client: 40}}]
  clients: [4]
  seed: [0]
defaults: {rounds: 100000, eval_every: 100000, local_epochs: 1, batch_size: 16, lr: 0.05}
overrides:
  - when: {algorithm: fedavg}
    set: {rounds: 2, eval_every: 1}
resources: {cpus: 1, gpus: 0}
"""


DEADLINE = 500  # seconds: column.py's own bound; the test's condition ends each loan long before


def returned(folder: Path) -> list[Path]:
    """What a loan's OUT holds to carry: the results archive (or its parts) and the checkpoints' archives."""
    return sorted([*folder.glob(column.RESULTS + "*"), *folder.glob(column.CHECKPOINT_PREFIX + "*")])


def run(tmp_path, monkeypatch, out: str, ready, *resume: Path, extra: tuple = ()) -> dict:
    """One loan; its deadline comes as soon as `ready(state)` holds (state: algorithm -> column.cell_state)."""
    store = tmp_path / out / "work" / "store"
    ids = column.cell_ids(str(tmp_path / "tiny.yaml"), [], ["fedavg", "local"])
    jumped = []

    def clock() -> float:
        try:
            if not jumped and ready({a: column.cell_state(store, i) for a, i in ids.items()}):
                jumped.append(DEADLINE)
        except FileNotFoundError:  # a checkpoint removed while read (its cell finished): ask again next tick
            pass
        return time.time() + sum(jumped)

    monkeypatch.setattr(column, "time", SimpleNamespace(time=clock, sleep=lambda _: time.sleep(0.2)))
    argv = [
        "--out",
        str(tmp_path / out),
        "--spec",
        str(tmp_path / "tiny.yaml"),
        "--algorithms",
        "fedavg,local",
        "--device",
        "cpu",
        "--parallel",
        "2",
        "--deadline",
        str(DEADLINE),
        "--start-margin",
        "0",
        "--checkpoint-every",
        "1",
        "--store",
        str(store),
    ]
    if resume:
        argv += ["--resume", *map(str, resume)]
    argv += extra
    assert column.main(argv) == 0
    monkeypatch.undo()
    assert jumped, "the loan ended before its condition held"
    return json.loads((tmp_path / out / "column.json").read_text())


def checkpoint_past(state: dict, round_: int) -> bool:
    return state["state"] == "checkpoint" and (state["round"] or 0) > round_


def test_a_column_finishes_what_it_can_and_the_next_loan_resumes_the_rest(tmp_path, monkeypatch):
    (tmp_path / "tiny.yaml").write_text(SPEC)
    first = run(
        tmp_path, monkeypatch, "loan1", lambda s: s["fedavg"]["state"] == "finished" and checkpoint_past(s["local"], 0)
    )["cells"]
    assert first["fedavg"]["after"]["state"] == "finished" and first["fedavg"]["after"]["rounds"] == 2
    killed = first["local"]["after"]
    assert killed["state"] == "checkpoint" and killed["round"] >= 1, killed
    loan1 = json.loads((tmp_path / "loan1" / "column.json").read_text())
    assert loan1["results"] == [column.RESULTS] and loan1["cells"]["local"]["carried"]["file"].startswith("ckpt-local-")
    assert "carried" not in loan1["cells"]["fedavg"]
    second = run(
        tmp_path,
        monkeypatch,
        "loan2",
        lambda s: checkpoint_past(s["local"], killed["round"]),
        *returned(tmp_path / "loan1"),
    )["cells"]
    assert second["fedavg"]["before"]["state"] == "finished" and second["fedavg"]["seconds_this_loan"] == 0
    assert second["local"]["before"] == killed
    assert second["local"]["after"]["state"] == "checkpoint" and second["local"]["after"]["round"] > killed["round"]
    assert f"resumed at round {killed['round']} of 100000" in (tmp_path / "loan2" / "column.log").read_text()

    store = tmp_path / "loan2" / "work" / "store"
    monkeypatch.setattr(column, "PART_BYTES", 4096)
    (tmp_path / "parts").mkdir()
    names = column.pack_results(store, tmp_path / "parts")
    ids = column.cell_ids(str(tmp_path / "tiny.yaml"), [], ["local"])
    packed = column.pack_checkpoints(
        store, tmp_path / "parts", [("local", ids["local"], 0.0)], 2**20, 2**20, 5, float("inf"), 1
    )
    assert len(names) > 1 and all((tmp_path / "parts" / n).stat().st_size <= 4096 for n in names)
    column.unpack([str(p) for p in returned(tmp_path / "parts")], tmp_path / "back" / "store")
    assert packed[ids["local"]]["file"] in [p.name for p in returned(tmp_path / "parts")]
    files = sorted(p.relative_to(store) for p in store.rglob("*") if p.is_file() and "_damaged" not in str(p))
    assert files and files == sorted(
        p.relative_to(tmp_path / "back" / "store") for p in (tmp_path / "back" / "store").rglob("*") if p.is_file()
    )
    assert all((store / f).read_bytes() == (tmp_path / "back" / "store" / f).read_bytes() for f in files)


def test_checkpoints_travel_as_byte_planes_and_come_back_byte_for_byte(tmp_path, capsys):
    """pack carries each round checkpoint as byte planes (planes.py) in an xz archive; unpack writes back the
    very bytes that left, and keeps aside (beside the store, said on stderr) a carried checkpoint whose
    bytes changed, so that its cell starts over; a checkpoint.pt that is not whole travels as it is; an earlier
    loan's tar.gz with checkpoints as they are unpacks too."""
    import tarfile

    import pytest
    import torch

    import planes
    from pflbench.storage.checkpoint import CheckpointProblem, verify_checkpoint, write_checkpoint

    store = tmp_path / "store"
    (store / "cell").mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    payload = {
        "weights": torch.randn(100, 257, generator=generator),
        "steps": torch.arange(7),
        "rng": torch.randint(0, 255, (5003,), dtype=torch.uint8, generator=generator),
        "round": 3,
    }
    write_checkpoint(store / "cell" / "checkpoint.pt", {"round": 3}, payload)
    (store / "cell" / "claim.json").write_text("{}")
    original = (store / "cell" / "checkpoint.pt").read_bytes()

    carried = planes.to_planes(original)
    assert carried != original and len(carried) == len(original) and planes.from_planes(carried) == original
    body = original[original.index(b"\n") + 1 :]
    assert sum(length for _, length in planes.storage_ranges(body)) == 100 * 257 * 4 + 7 * 8 + 5003

    (tmp_path / "out").mkdir()
    assert column.pack_results(store, tmp_path / "out") == [column.RESULTS]
    packed = column.pack_checkpoints(
        store, tmp_path / "out", [("fedavg", "cell", 0.5)], 2**20, 2**20, 5, float("inf"), 1
    )
    name = packed["cell"]["file"]
    with tarfile.open(tmp_path / "out" / column.RESULTS) as archive:
        assert "store/cell/claim.json" in archive.getnames() and "store/cell/checkpoint.pt" not in archive.getnames()
    with tarfile.open(tmp_path / "out" / name) as archive:
        assert archive.getnames() == ["store/cell/checkpoint.pt" + column.PLANES]
    column.unpack([str(tmp_path / "out" / column.RESULTS), str(tmp_path / "out" / name)], tmp_path / "back" / "store")
    back = tmp_path / "back" / "store" / "cell"
    assert (back / "checkpoint.pt").read_bytes() == original and (back / "claim.json").read_text() == "{}"
    assert not list(back.glob("*" + column.PLANES))

    # a carried checkpoint damaged on the way is refused, not written back
    damaged = tmp_path / "damaged"
    (damaged / "store" / "cell").mkdir(parents=True)
    wrong = bytearray(carried)
    wrong[original.index(b"\n") + 1 + planes.storage_ranges(body)[0][0] + 10] ^= 1  # a weight's byte
    (damaged / "store" / "cell" / ("checkpoint.pt" + column.PLANES)).write_bytes(bytes(wrong))
    with tarfile.open(damaged / "old.tar.xz", "w:xz") as archive:
        archive.add(damaged / "store", arcname="store")
    column.unpack([str(damaged / "old.tar.xz")], tmp_path / "refused" / "store")
    refused = tmp_path / "refused" / "store" / "cell"
    assert not (refused / "checkpoint.pt").exists()  # its cell starts over
    assert not list(refused.glob("*" + column.PLANES))
    kept = tmp_path / "refused" / column.REFUSED / "cell" / ("checkpoint.pt" + column.PLANES)
    assert kept.read_bytes() == bytes(wrong)
    assert "is not the checkpoint that left" in capsys.readouterr().err
    with pytest.raises(CheckpointProblem):  # what unpack asks of the bytes it got back
        verify_checkpoint(planes.from_planes(bytes(wrong)))

    # a file named checkpoint.pt that is not a whole checkpoint travels as it is
    (store / "cell" / "checkpoint.pt").write_bytes(b"torn")
    (tmp_path / "out2").mkdir()
    torn = column.pack_checkpoints(
        store, tmp_path / "out2", [("fedavg", "cell", 0.5)], 2**20, 2**20, 5, float("inf"), 1
    )
    column.unpack([str(tmp_path / "out2" / torn["cell"]["file"])], tmp_path / "torn" / "store")
    assert (tmp_path / "torn" / "store" / "cell" / "checkpoint.pt").read_bytes() == b"torn"
    (store / "cell" / "checkpoint.pt").write_bytes(original)

    # an earlier loan's archive: tar.gz, the checkpoint as it is
    with tarfile.open(tmp_path / "store.tar.gz", "w:gz") as archive:
        archive.add(store, arcname="store")
    column.unpack([str(tmp_path / "store.tar.gz")], tmp_path / "old" / "store")
    assert (tmp_path / "old" / "store" / "cell" / "checkpoint.pt").read_bytes() == original


def test_a_finished_row_comes_back_when_a_checkpoint_is_over_its_cap(tmp_path):
    """Results and checkpoints are packed apart: a store with a finished row and a checkpoint too large for its
    cap (a random payload, which no compressor shrinks) returns the row; the checkpoint is left out, said with
    its size, and nothing of it stays in OUT; the next loan, given what came back, has the row and starts the
    other cell over. A second checkpoint under the cap comes back beside; a third past the total is left out."""
    import tarfile

    import torch

    from pflbench.storage.checkpoint import write_checkpoint

    store = tmp_path / "store"
    (store / "done").mkdir(parents=True)
    (store / "done" / "summary.json").write_text(json.dumps({"status": "finished", "rounds_completed": 2}))
    generator = torch.Generator().manual_seed(1)
    for cell, values in (("big", 400_000), ("small", 1_000), ("third", 1_000)):
        (store / cell).mkdir()
        write_checkpoint(
            store / cell / "checkpoint.pt",
            {"round": 3},
            {"weights": torch.randint(0, 2**31, (values,), generator=generator, dtype=torch.int32), "round": 3},
        )
    out = tmp_path / "out"
    out.mkdir()
    assert column.pack_results(store, out) == [column.RESULTS]
    cap = 2**20  # the big checkpoint is 1.6 MB of random bytes
    small = column.pack_checkpoints(store, tmp_path, [("a", "small", 0.1)], cap, cap, 5, float("inf"), 1)["small"]
    packed = column.pack_checkpoints(
        store,
        out,
        [("a", "big", 0.9), ("b", "small", 0.5), ("c", "third", 0.1)],
        cap,
        small["bytes"] + 100,
        5,
        float("inf"),
        2,
    )
    assert "over the cap of 1.0 MiB" in packed["big"]["left_out"] and packed["big"]["bytes"] > cap
    assert packed["small"]["file"] == "ckpt-b-small.tar.xz"
    assert "past the" in packed["third"]["left_out"]
    assert sorted(p.name for p in out.iterdir()) == ["ckpt-b-small.tar.xz", column.RESULTS]
    with tarfile.open(out / column.RESULTS) as archive:
        assert "store/done/summary.json" in archive.getnames()
    back = tmp_path / "next" / "store"
    column.unpack([str(p) for p in sorted(out.iterdir())], back)
    assert column.cell_state(back, "done")["state"] == "finished"
    assert column.cell_state(back, "big")["state"] == "not started"
    assert column.cell_state(back, "small") == {"state": "checkpoint", "round": 3}
