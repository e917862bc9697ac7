"""A paper-scale column across GPU loans (benchmarks/gpu/column.py), on the CPU with a tiny spec: a cell that
finishes is in the archive as a result; a cell still running at the deadline is killed and comes back as its
checkpoint, and the next call, given the archive, resumes it from there; an archive over the part size is
split and put back together byte for byte.

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


def run(tmp_path, monkeypatch, out: str, ready, *resume: Path) -> dict:
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
    argv = ["--out", str(tmp_path / out), "--spec", str(tmp_path / "tiny.yaml"), "--algorithms", "fedavg,local",
            "--device", "cpu", "--parallel", "2", "--deadline", str(DEADLINE), "--start-margin", "0",
            "--checkpoint-every", "1", "--store", str(store)]
    if resume:
        argv += ["--resume", *map(str, resume)]
    assert column.main(argv) == 0
    monkeypatch.undo()
    assert jumped, "the loan ended before its condition held"
    return json.loads((tmp_path / out / "column.json").read_text())


def checkpoint_past(state: dict, round_: int) -> bool:
    return state["state"] == "checkpoint" and (state["round"] or 0) > round_


def test_a_column_finishes_what_it_can_and_the_next_loan_resumes_the_rest(tmp_path, monkeypatch):
    (tmp_path / "tiny.yaml").write_text(SPEC)
    first = run(tmp_path, monkeypatch, "loan1",
                lambda s: s["fedavg"]["state"] == "finished" and checkpoint_past(s["local"], 0))["cells"]
    assert first["fedavg"]["after"]["state"] == "finished" and first["fedavg"]["after"]["rounds"] == 2
    killed = first["local"]["after"]
    assert killed["state"] == "checkpoint" and killed["round"] >= 1, killed
    second = run(tmp_path, monkeypatch, "loan2", lambda s: checkpoint_past(s["local"], killed["round"]),
                 tmp_path / "loan1" / column.ARCHIVE)["cells"]
    assert second["fedavg"]["before"]["state"] == "finished" and second["fedavg"]["seconds_this_loan"] == 0
    assert second["local"]["before"] == killed
    assert second["local"]["after"]["state"] == "checkpoint" and second["local"]["after"]["round"] > killed["round"]
    assert f"resumed at round {killed['round']} of 100000" in (tmp_path / "loan2" / "column.log").read_text()

    store = tmp_path / "loan2" / "work" / "store"
    monkeypatch.setattr(column, "PART_BYTES", 4096)
    (tmp_path / "parts").mkdir()
    names = column.pack(store, tmp_path / "parts")
    assert len(names) > 1 and all((tmp_path / "parts" / n).stat().st_size <= 4096 for n in names)
    column.unpack([str(tmp_path / "parts" / n) for n in names], tmp_path / "back" / "store")
    files = sorted(p.relative_to(store) for p in store.rglob("*") if p.is_file() and "_damaged" not in str(p))
    assert files and files == sorted(p.relative_to(tmp_path / "back" / "store")
                                     for p in (tmp_path / "back" / "store").rglob("*") if p.is_file())
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
    from pflbench.checkpoint import CheckpointProblem, verify_checkpoint, write_checkpoint

    store = tmp_path / "store"
    (store / "cell").mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    payload = {"weights": torch.randn(100, 257, generator=generator), "steps": torch.arange(7),
               "rng": torch.randint(0, 255, (5003,), dtype=torch.uint8, generator=generator), "round": 3}
    write_checkpoint(store / "cell" / "checkpoint.pt", {"round": 3}, payload)
    (store / "cell" / "claim.json").write_text("{}")
    original = (store / "cell" / "checkpoint.pt").read_bytes()

    carried = planes.to_planes(original)
    assert carried != original and len(carried) == len(original) and planes.from_planes(carried) == original
    body = original[original.index(b"\n") + 1:]
    assert sum(length for _, length in planes.storage_ranges(body)) == 100 * 257 * 4 + 7 * 8 + 5003

    (tmp_path / "out").mkdir()
    names = column.pack(store, tmp_path / "out")
    assert names == [column.ARCHIVE]
    with tarfile.open(tmp_path / "out" / column.ARCHIVE) as archive:
        members = sorted(archive.getnames())
    assert "store/cell/checkpoint.pt" + column.PLANES in members and "store/cell/checkpoint.pt" not in members
    column.unpack([str(tmp_path / "out" / column.ARCHIVE)], tmp_path / "back" / "store")
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
    column.pack(store, tmp_path / "out2")
    column.unpack([str(tmp_path / "out2" / column.ARCHIVE)], tmp_path / "torn" / "store")
    assert (tmp_path / "torn" / "store" / "cell" / "checkpoint.pt").read_bytes() == b"torn"
    (store / "cell" / "checkpoint.pt").write_bytes(original)

    # an earlier loan's archive: tar.gz, the checkpoint as it is
    with tarfile.open(tmp_path / "store.tar.gz", "w:gz") as archive:
        archive.add(store, arcname="store")
    column.unpack([str(tmp_path / "store.tar.gz")], tmp_path / "old" / "store")
    assert (tmp_path / "old" / "store" / "cell" / "checkpoint.pt").read_bytes() == original
