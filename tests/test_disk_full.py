"""A full disk (pflbench/storage/store.py's DiskFull, pflbench/run/runner.py): a checkpoint or a result that cannot be
written for lack of space stops the run with one line (the file, the bytes it needed, the bytes free), no
partial file becomes a result or a checkpoint, finished cells stay intact, and a run after space is freed
resumes, bit-identical to an uninterrupted run.

ENOSPC is injected where a real one comes from: inside the write of a store file or checkpoint, after half
of its bytes reached the temporary file (`atomic_write`'s `write` callback)."""

from __future__ import annotations

import errno
import io
import os
import re
from collections import Counter
from pathlib import Path
from collections.abc import Callable

import pytest
from rich.console import Console

import pflbench.storage.checkpoint as checkpoint
import pflbench.storage.store as store_module
from checkpoint_helpers import assert_same_result
from pflbench.storage.checkpoint import CHECKPOINT, read_header
from pflbench.config import cell_hash
from pflbench.run.options import RunOptions
from pflbench.run.runner import run_plan
from pflbench.run.stops import DISK_FULL_EXIT
from pflbench.run.spec import parse_spec
from pflbench.storage.store import DiskFull, Store, store_problems

ROUNDS = 6


def the_plan():
    return parse_spec(
        {
            "name": "full",
            "matrix": {
                "algorithm": ["fedavg"],
                "dataset": ["synthetic"],
                "partition": [{"scheme": "pathological", "params": {"classes_per_client": 3}}],
                "seed": [0, 1, 2],
            },
            "defaults": {
                "clients": 5,
                "rounds": ROUNDS,
                "lr": 0.05,
                "eval_every": 2,
                "dataset_options": {"num_samples": 600},
            },
        }
    )


def run(options: RunOptions):
    output = io.StringIO()
    report = run_plan(the_plan(), options, Console(file=output, width=400))
    return report, output.getvalue()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    options = RunOptions(
        results=root / "reference", data_root=root / "data", use_ray=False, checkpoint_every=2, checkpoint_minutes=0
    )
    report, output = run(options)
    assert report.exit_code == 0, output
    return options


def fill_disk(monkeypatch, fails: Callable[[Path], bool]) -> None:
    """Writes of the files `fails` picks run out of space halfway (ENOSPC from the write itself)."""
    real = store_module.atomic_write

    def atomic_write(path, write):
        if not fails(Path(path)):
            return real(path, write)

        def half_then_full(tmp: Path) -> None:
            write(tmp)
            tmp.write_bytes(tmp.read_bytes()[: tmp.stat().st_size // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))

        return real(path, half_then_full)

    monkeypatch.setattr(store_module, "atomic_write", atomic_write)
    monkeypatch.setattr(checkpoint, "atomic_write", atomic_write)


def folders(store: Path) -> dict[int, Path]:
    """The plan's cell folders in `store`, by seed (absent: never started)."""
    return {cell.seed: store / cell_hash(cell) for cell in the_plan().cells if (store / cell_hash(cell)).exists()}


def the_line(output: str) -> str:
    lines = [line for line in output.splitlines() if "disk full" in line]
    assert len(lines) == 1, output
    return lines[0]


def assert_stopped_cleanly(store: Path) -> None:
    """Seed 0 finished and intact, seed 1 without a result, seed 2 never started, no temporary file."""
    cells = folders(store)
    assert set(cells) == {0, 1}
    assert Store(store).summary(the_plan().cells[0])["status"] == "finished"
    assert not (cells[1] / "summary.json").exists() and not (cells[1] / "claim.json").exists()
    assert store_problems(store) == []
    assert not list(store.rglob("*.tmp"))


def resume_and_compare(options: RunOptions, reference: RunOptions, at: int) -> None:
    report, output = run(options)
    assert report.exit_code == 0, output
    assert re.search(rf"resumed at round {at} of {ROUNDS}", output), output
    ours, theirs = folders(options.results), folders(reference.results)
    for seed in (0, 1, 2):
        assert_same_result(ours[seed], theirs[seed])


def test_a_checkpoint_that_does_not_fit_stops_the_run_and_the_previous_checkpoint_is_resumed(
    reference, tmp_path, monkeypatch
):
    options = RunOptions(
        results=tmp_path / "store",
        data_root=reference.data_root,
        use_ray=False,
        checkpoint_every=2,
        checkpoint_minutes=0,
    )
    second_cell = cell_hash(the_plan().cells[1])
    writes = Counter()

    def fails(path: Path) -> bool:  # the second cell's second checkpoint (round 4)
        if path.name == CHECKPOINT and path.parent.name == second_cell:
            writes[path] += 1
            return writes[path] == 2
        return False

    fill_disk(monkeypatch, fails)
    report, output = run(options)
    assert report.exit_code == DISK_FULL_EXIT
    line = the_line(output)
    path = options.results / second_cell / CHECKPOINT
    needed, free = re.fullmatch(
        rf"disk full: cannot write {re.escape(str(path))} \(it needs ([\d,]+) bytes; free there: "
        rf"([\d,]+) bytes\); the run stopped starting cells; cell {second_cell} \(fedavg .*\) has "
        rf"no result and the next run resumes it at round 2 of {ROUNDS}; free space and run the "
        rf"same command again",
        line,
    ).groups()
    assert int(needed.replace(",", "")) > 1000 and int(free.replace(",", "")) > 0
    assert "Traceback" not in output
    assert_stopped_cleanly(options.results)
    assert read_header(path)["round"] == 2  # the previous checkpoint, whole

    monkeypatch.undo()  # space freed
    resume_and_compare(options, reference, at=2)


def test_a_result_that_does_not_fit_is_no_result_and_the_cell_resumes_from_its_checkpoint(
    reference, tmp_path, monkeypatch
):
    options = RunOptions(
        results=tmp_path / "store",
        data_root=reference.data_root,
        use_ray=False,
        checkpoint_every=2,
        checkpoint_minutes=0,
    )
    second_cell = cell_hash(the_plan().cells[1])
    fill_disk(monkeypatch, lambda path: path.name == "metrics.parquet" and path.parent.name == second_cell)
    report, output = run(options)
    assert report.exit_code == DISK_FULL_EXIT
    line = the_line(output)
    assert line.startswith(f"disk full: cannot write {options.results / second_cell / 'metrics.parquet'} (it needs ")
    assert f"the next run resumes it at round 4 of {ROUNDS}" in line
    assert_stopped_cleanly(options.results)

    monkeypatch.undo()
    resume_and_compare(options, reference, at=4)


def test_a_result_that_runs_out_of_space_halfway_leaves_no_part_of_it_in_the_cell_folder(
    reference, tmp_path, monkeypatch
):
    """The third of the result's files runs out of space: the two written before it are removed again, so the
    folder holds only the checkpoint the next run resumes from."""
    options = RunOptions(
        results=tmp_path / "store",
        data_root=reference.data_root,
        use_ray=False,
        checkpoint_every=2,
        checkpoint_minutes=0,
    )
    second_cell = cell_hash(the_plan().cells[1])
    written = []

    def fails(path: Path) -> bool:
        if path.parent.name == second_cell and path.name != CHECKPOINT:
            written.append(path.name)
            return len(written) == 3
        return False

    fill_disk(monkeypatch, fails)
    report, output = run(options)
    assert report.exit_code == DISK_FULL_EXIT, output
    assert len(written) == 3, written
    assert sorted(p.name for p in (options.results / second_cell).iterdir()) == [CHECKPOINT], output
    assert_stopped_cleanly(options.results)


def test_a_result_larger_than_the_free_space_is_refused_before_its_folder_is_touched(reference, tmp_path, monkeypatch):
    options = RunOptions(
        results=tmp_path / "store",
        data_root=reference.data_root,
        use_ray=False,
        checkpoint_every=2,
        checkpoint_minutes=0,
    )
    first = the_plan().cells[0]
    monkeypatch.setattr(store_module, "free_bytes", lambda path: 1000)
    report, output = run(options)
    assert report.exit_code == DISK_FULL_EXIT
    line = the_line(output)
    assert re.match(
        rf"disk full: cannot write {re.escape(str(options.results / cell_hash(first)))} \(it needs [\d,]+ "
        rf"bytes; free there: 1,000 bytes\)",
        line,
    ), line
    assert sorted(p.name for p in (options.results / cell_hash(first)).iterdir()) == [CHECKPOINT]
    assert f"resumes it at round 4 of {ROUNDS}" in line


def test_disk_full_names_a_quota_and_an_unknown_size():
    assert str(DiskFull("/x/y", None, 10, errno.EDQUOT)) == (
        "disk quota exceeded: cannot write /x/y (it needs an unknown number of bytes; free there: 10 bytes)"
    )
    assert store_module.no_space(OSError(errno.EACCES, "denied"), Path("/x")) is None


# ---- a real full disk: a small tmpfs in a mount namespace of its own (no root needed where user
# namespaces are allowed; skipped with the reason where they are not) ----------------------------------

SPEC = f"""
name: full
matrix:
  algorithm: [fedavg]
  dataset: [synthetic]
  partition: [{{scheme: pathological, params: {{classes_per_client: 3}}}}]
  seed: [0, 1, 2]
defaults: {{clients: 5, rounds: {ROUNDS}, lr: 0.05, eval_every: 2, dataset_options: {{num_samples: 600}}}}
"""
# In the namespace: the first cell on a roomy tmpfs; then the tmpfs filled but for 8 KiB (a claim fits, a
# checkpoint does not) and the whole spec run; then the filler removed and the spec run again.
ON_TMPFS = """
set -u
mount -t tmpfs -o size=32m tmpfs "$MNT" || exit 90
run() { "$PYTHON" -m pflbench.cli run "$SPEC" --results "$MNT/store" --no-ray --checkpoint-every 2 \
        --checkpoint-minutes 0 "$@"; }
run --set seed=0 > "$OUT/first.txt" 2>&1; echo $? > "$OUT/first.rc"
"$PYTHON" -c "import os; s = os.statvfs('$MNT'); open('$MNT/filler', 'wb').write(b'x' * (s.f_bavail * s.f_frsize - 8192))"
run > "$OUT/full.txt" 2>&1; echo $? > "$OUT/full.rc"
cp -r "$MNT/store" "$OUT/after-full"
rm "$MNT/filler"
run > "$OUT/freed.txt" 2>&1; echo $? > "$OUT/freed.rc"
cp -r "$MNT/store" "$OUT/after-freed"
"""


def test_a_real_full_tmpfs_stops_the_run_with_one_line_and_a_run_after_space_is_freed_finishes(reference, tmp_path):
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here to mount a tmpfs in a namespace of its own")
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {tmp_path}"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user and mount namespace here: {probe.stderr.strip()}")
    (tmp_path / "spec.yaml").write_text(SPEC)
    mount, out = tmp_path / "mnt", tmp_path / "out"
    mount.mkdir()
    out.mkdir()
    env = {
        **os.environ,
        "MNT": str(mount),
        "OUT": str(out),
        "SPEC": str(tmp_path / "spec.yaml"),
        "PYTHON": sys.executable,
        "PFLBENCH_DATA": str(reference.data_root),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        ["unshare", "-rm", "bash", "-c", ON_TMPFS], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = {name: (out / f"{name}.txt").read_text() for name in ("first", "full", "freed")}
    codes = {name: int((out / f"{name}.rc").read_text()) for name in text}
    assert codes == {"first": 0, "full": DISK_FULL_EXIT, "freed": 0}, text
    second = cell_hash(the_plan().cells[1])
    line = the_line(text["full"])
    assert re.fullmatch(
        rf"disk full: cannot write {re.escape(str(mount / 'store' / second / CHECKPOINT))} \(it needs "
        rf"[\d,]+ bytes; free there: [\d,]+ bytes\); the run stopped starting cells; cell {second} "
        rf"\(.*\) has no result and the next run starts it from round 1 \(it has no checkpoint\); "
        rf"free space and run the same command again",
        line,
    ), line
    assert "Traceback" not in text["full"]
    stopped = out / "after-full"
    assert_stopped_cleanly(stopped)
    assert not (stopped / second / CHECKPOINT).exists()
    assert "3 finished" in text["freed"]
    ours, theirs = folders(out / "after-freed"), folders(reference.results)
    for seed in (0, 1, 2):
        assert_same_result(ours[seed], theirs[seed])


def test_on_ray_the_line_names_every_cell_the_full_disk_stopped(tmp_path, monkeypatch):
    """On Ray a full disk stops the cell whose write failed and cancels the tasks running beside it: the
    line names each of them and where the next run continues it, and their claims are released (the
    scheduler's handler alone, on a store of its own: a real full disk under Ray is the in-process case's)."""
    ray = pytest.importorskip("ray")
    from pflbench.run.on_ray import RayRun

    cells = the_plan().cells[:3]
    store = Store(tmp_path / "store")
    assert all(store.claim(cell) for cell in cells)
    scheduler = RayRun.__new__(RayRun)  # no cluster: only what `disk_full` reads
    scheduler.store, scheduler.recorded = store, set()
    scheduler.by_key = {cell_hash(cell): cell for cell in cells}
    scheduler.running = {"task-b": [cells[1]], "task-c": [cells[2]]}
    cancelled = []
    monkeypatch.setattr(ray, "cancel", lambda ref, force: cancelled.append(ref))
    path = store.cell_dir(cells[0]) / CHECKPOINT
    stop = scheduler.disk_full(DiskFull(str(path), 2298037, 36864), cells[0], [cells[0]])
    assert stop.exit_code == DISK_FULL_EXIT and sorted(cancelled) == ["task-b", "task-c"]
    first, *others = (cell_hash(cell) for cell in cells)
    assert re.fullmatch(
        rf"disk full: cannot write {re.escape(str(path))} .*; the run stopped starting cells; "
        rf"cell {first} \(fedavg .*\) has no result and the next run starts it from round 1 \(it has "
        rf"no checkpoint\); cell {others[0]} \(.*\) stopped with it: the next run starts it from round 1 \(it has no "
        rf"checkpoint\); cell {others[1]} \(.*\) stopped with it: the next run starts it from round 1 \(it has no "
        rf"checkpoint\); free space and run the same command again",
        stop.line,
    ), stop.line
    assert all(store.claim_holder(cell) is None for cell in cells)


def test_disk_full_crosses_a_process_boundary_whole():
    """A Ray actor (the checkpoint keeper) raising it hands the driver the same fields."""
    import pickle

    full = DiskFull("/store/abc/checkpoint.pt", 2298037, 36864)
    again = pickle.loads(pickle.dumps(full))
    assert isinstance(again, DiskFull) and str(again) == str(full) and again.errno == errno.ENOSPC


def test_a_claim_that_does_not_fit_releases_the_claims_its_cell_group_already_took(reference, tmp_path, monkeypatch):
    """In-process cell groups claim a group's cells one after another: when the third claim meets a full
    disk, the run stops with the one line and the two cells already claimed are released (no claim.json
    left to block the next run), and nothing ran."""
    from pflbench.simulator.execution import ExecutionOptions

    options = RunOptions(
        results=tmp_path / "store",
        data_root=reference.data_root,
        use_ray=False,
        checkpoint_every=2,
        checkpoint_minutes=0,
        execution=ExecutionOptions(client_batching="on", cell_groups="on"),
    )
    real, claims = Store.claim, []

    def claim(self, cell):
        claims.append(cell.seed)
        if len(claims) == 3:
            raise DiskFull(str(self.cell_dir(cell) / "claim.json"), None, 0, errno.ENOSPC)
        return real(self, cell)

    monkeypatch.setattr(Store, "claim", claim)
    report, output = run(options)
    assert report.exit_code == DISK_FULL_EXIT, output
    assert "disk full" in the_line(output)
    assert claims == [0, 1, 2]  # one group of the three cells, claimed in turn
    assert list(options.results.rglob("claim.json")) == []
    assert not list(options.results.rglob("summary.json")) and not list(options.results.rglob(CHECKPOINT))


REPORT_ON_TMPFS = """
mount -t tmpfs -o size=64k tmpfs "$MNT" || exit 99
"$PYTHON" -c 'import sys; from pflbench.cli import main; sys.exit(main(sys.argv[1:]))' report --results "$STORE" \\
    --out "$MNT/reports" --quiet --no-partitions > "$OUT/out.txt" 2> "$OUT/err.txt"
echo $? > "$OUT/rc"
"""


@pytest.fixture
def small_store(tmp_path):
    from report_helpers import write_cell

    for seed in (0, 1):
        for algorithm in ("fedavg", "local"):
            write_cell(tmp_path / "store", algorithm=algorithm, seed=seed, accuracies=(0.5 + 0.01 * seed, 0.6))
    return tmp_path / "store"


def test_a_report_onto_a_full_disk_ends_with_the_line_run_gives(small_store, tmp_path, monkeypatch, capsys):
    """`pflbench report` whose writes fail for lack of space (every file opened for writing under --out):
    one line, as `pflbench run`'s (the file, the bytes free, free space and run again), and DISK_FULL_EXIT."""
    import builtins

    from pflbench.cli import main

    out = tmp_path / "reports"
    real_open = builtins.open

    def full_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and set(str(mode)) & set("wax") and Path(file).is_relative_to(out):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full_open)
    monkeypatch.setattr(io, "open", full_open)
    assert (
        main(["report", "--results", str(small_store), "--out", str(out), "--quiet", "--no-partitions"])
        == DISK_FULL_EXIT
    )
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"disk full: cannot write {re.escape(str(out))}/\S+ \(it needs an unknown number of bytes; free "
        rf"there: [\d,]+ bytes\); free space and run the same command again\n",
        err,
    ), err


def test_a_report_onto_a_real_full_tmpfs_ends_with_the_line_run_gives(small_store, tmp_path):
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here to mount a tmpfs in a namespace of its own")
    mount, out = tmp_path / "mnt", tmp_path / "out"
    mount.mkdir()
    out.mkdir()
    env = {
        **os.environ,
        "MNT": str(mount),
        "OUT": str(out),
        "STORE": str(small_store),
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        ["unshare", "-rm", "bash", "-c", REPORT_ON_TMPFS], env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode == 99 or not (out / "rc").exists():
        pytest.skip(f"cannot mount a tmpfs in a user and mount namespace here: {done.stderr.strip()}")
    err = (out / "err.txt").read_text()
    assert int((out / "rc").read_text()) == DISK_FULL_EXIT, err
    assert re.fullmatch(
        rf"disk full: cannot write {re.escape(str(mount))}\S* \(it needs [\w ,]+ bytes; free there: "
        rf"[\d,]+ bytes\); free space and run the same command again\n",
        err,
    ), err
