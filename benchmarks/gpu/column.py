"""A paper-scale column on a lent GPU, across as many loans as it takes.

Runs the cells of one `pflbench run` command (a spec and its `--set`s, narrowed by algorithm) as separate
`pflbench run --no-ray --device DEVICE` processes, `--parallel` at a time (Table 1's Fashion-MNIST cells
on an H100: 4 processes give 3.56x one alone, 8 give 3.69x; docs/howto/gpu.md; measured: docs/measurements/gpu.md), in the order given, each
writing a round checkpoint at least every `--checkpoint-minutes`. At `--deadline` seconds from the start
every process still running is killed (the store is written atomically, so a kill leaves its last
checkpoint), and the whole store goes back as `OUT/store.tar.xz` (split in parts under 15 MiB where
larger: the device returns 8 files of 16 MiB at most): finished cells with their results, unfinished
ones with their checkpoint, carried as byte planes (planes.py), which compress better. The next loan
carries that archive (`--resume FILE...`, the parts in order) and the same command continues: finished
cells are skipped, the others resume from their checkpoints, bit for bit (the checkpoint names the code,
torch version and execution path: anything else starts the cell over, said in its log). docs/inflight.md says what is in flight and the command for the next loan.

OUT/column.json: per cell its algorithm, id, state (finished, diverged, failed, checkpoint at round R,
not started) and seconds run in this loan; the device, torch, TF32 setting and the load. OUT/column.log:
every process's output.

    bash benchmarks/gpu/in_kit.sh python3 benchmarks/gpu/column.py --out "$OUT" --deadline 500 \\
        --spec benchmarks/table1.yaml --set dataset=fmnist --set clients=10 --set seed=0 \\
        --algorithms local,fedavg,pfedla,heurpfedla,fedbn,fedrep,fedfomo,pfedhn,perfedavg,pfedme

tests/test_gpu_column.py runs it on the CPU (`--device cpu`) on a tiny spec: a cell that finishes, one killed
at the deadline with its checkpoint in the archive and resumed from it by the next call, the archive in parts.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from planes import from_planes, to_planes

PART_BYTES = 15 * 2 ** 20  # under the device's 16 MiB a returned file
ARCHIVE = "store.tar.xz"
PLANES = ".planes"  # a round checkpoint carried as byte planes (planes.py)
REFUSED = "refused"  # beside the store: the carried checkpoints that did not come back whole


def cell_ids(spec: str, sets: list[str], algorithms: list[str]) -> dict[str, str]:
    """algorithm -> the id of its one cell under the command (each algorithm narrows it to one cell)."""
    from pflbench.config import cell_hash
    from pflbench.spec import load_spec, parse_sets

    ids = {}
    for algorithm in algorithms:
        cells = load_spec(spec, sets=parse_sets([*sets, f"algorithm={algorithm}"])).cells
        if len(cells) != 1:
            raise SystemExit(f"column.py: --set {' --set '.join(sets)} with algorithm={algorithm} plans "
                             f"{len(cells)} cells; one cell an algorithm is needed")
        ids[algorithm] = cell_hash(cells[0])
    return ids


def prepare(spec: str, sets: list[str]) -> None:
    from pflbench.resolve import resolve
    from pflbench.rounds import prepare_cell
    from pflbench.spec import load_spec, parse_sets

    prepare_cell(resolve(load_spec(spec, sets=parse_sets(sets)).cells[0]))


def cell_state(store: Path, cell_id: str) -> dict:
    """What the store holds of one cell: its result's status, or its checkpoint's round."""
    folder = store / cell_id
    summary = folder / "summary.json"
    if summary.exists():
        facts = json.loads(summary.read_text())
        return {"state": facts.get("status"), "wall_seconds": facts.get("wall_time"),
                "rounds": facts.get("rounds_completed")}
    checkpoint = folder / "checkpoint.pt"
    if checkpoint.exists():
        from pflbench.checkpoint import CheckpointProblem, read_header

        try:
            return {"state": "checkpoint", "round": read_header(checkpoint).get("round")}
        except CheckpointProblem as problem:
            return {"state": f"checkpoint unreadable: {problem}"}
    return {"state": "not started"}


def unpack(parts: list[str], store: Path) -> None:
    """The previous loan's store (its archive's parts, in order) into `store`: each checkpoint carried as
    byte planes (`pack`) written back as it was, its header's SHA-256 checked (one that fails is kept
    beside the store, under REFUSED, and its cell starts over). An archive of an earlier loan (store.tar.gz,
    checkpoints as they are) unpacks too."""
    from pflbench.checkpoint import CheckpointProblem, verify_checkpoint

    data = b"".join(Path(part).read_bytes() for part in parts)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
        archive.extractall(store.parent, filter="data")
    for carried in sorted(store.rglob("*" + PLANES)):
        try:
            checkpoint = from_planes(carried.read_bytes())
            verify_checkpoint(checkpoint)  # CheckpointProblem where a byte differs from the one that left
        except (CheckpointProblem, ValueError, zipfile.BadZipFile) as problem:
            # kept outside the store (its cell's folder must hold only what the cell writes): the cell starts over
            kept = store.parent / REFUSED / carried.parent.name / carried.name
            kept.parent.mkdir(parents=True, exist_ok=True)
            carried.rename(kept)
            print(f"unpack: {carried} is not the checkpoint that left ({problem}); kept as {kept}, its cell starts "
                  f"over", file=sys.stderr, flush=True)
            continue
        carried.with_name(carried.name[:-len(PLANES)]).write_bytes(checkpoint)
        carried.unlink()


def pack(store: Path, out: Path) -> list[str]:
    """The store as OUT/store.tar.xz, or OUT/store.tar.xz.partNN pieces under PART_BYTES each; each round
    checkpoint in it as byte planes (planes.py), which xz compresses better than the checkpoint itself."""
    buffer = io.BytesIO()
    checkpoints: list[Path] = []

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if "_damaged" in info.name:
            return None
        if info.isfile() and info.name.endswith("/checkpoint.pt"):
            checkpoints.append(store.parent / info.name)
            return None  # added below, as planes
        return info

    with tarfile.open(fileobj=buffer, mode="w:xz", preset=6) as archive:
        archive.add(store, arcname=store.name, filter=keep)
        for checkpoint in checkpoints:
            name, carried = str(checkpoint.relative_to(store.parent)), checkpoint.read_bytes()
            try:
                carried, name = to_planes(carried), name + PLANES
            except (ValueError, zipfile.BadZipFile):  # not a whole checkpoint: carried as it is, for the resume to judge
                pass
            info = archive.gettarinfo(str(checkpoint), arcname=name)
            info.size = len(carried)
            archive.addfile(info, io.BytesIO(carried))
    data = buffer.getvalue()
    if len(data) <= PART_BYTES:
        (out / ARCHIVE).write_bytes(data)
        return [ARCHIVE]
    names = []
    for index, start in enumerate(range(0, len(data), PART_BYTES)):
        names.append(f"{ARCHIVE}.part{index:02d}")
        (out / names[-1]).write_bytes(data[start:start + PART_BYTES])
    return names


def device_facts(device: str) -> dict:
    import torch

    facts = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
             "cpu_cores": os.cpu_count()}
    if device.startswith("cuda") and torch.cuda.is_available():
        facts.update(gpu=torch.cuda.get_device_name(0), cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
                     matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32)
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--algorithms", required=True, help="comma-separated, in the order to start them")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--deadline", type=float, required=True, help="seconds from the start: kill and pack")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--checkpoint-minutes", type=float, default=1.0)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="rounds (0: by time only)")
    parser.add_argument("--start-margin", type=float, default=30.0,
                        help="no cell starts later than this many seconds before the deadline")
    parser.add_argument("--store", type=Path, default=Path("/tmp/pflbench-column/store"))
    parser.add_argument("--resume", nargs="*", default=[],
                        help="the previous loan's store.tar.xz (or its parts; an earlier store.tar.gz too)")
    args = parser.parse_args(argv)
    began = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    args.store.parent.mkdir(parents=True, exist_ok=True)
    if args.resume:
        unpack(args.resume, args.store)
    args.store.mkdir(parents=True, exist_ok=True)
    algorithms = args.algorithms.split(",")
    ids = cell_ids(args.spec, args.sets, algorithms)
    before = {a: cell_state(args.store, ids[a]) for a in algorithms}
    queue = [a for a in algorithms if before[a]["state"] in ("checkpoint", "not started")]
    if queue:  # the dataset decoded and cached once, before the processes that read it start
        prepare(args.spec, [*args.sets, f"algorithm={queue[0]}"])
    log = (args.out / "column.log").open("w")
    report = {"command": ["pflbench", "run", args.spec, *[x for s in args.sets for x in ("--set", s)]],
              "facts": device_facts(args.device), "loadavg_before": os.getloadavg(), "cells": {}}
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    seconds: dict[str, float] = {}

    def start(algorithm: str) -> None:
        command = [sys.executable, "-m", "pflbench.cli", "run", args.spec, *[x for s in args.sets for x in ("--set", s)],
                   "--set", f"algorithm={algorithm}", "--results", str(args.store), "--no-ray",
                   "--device", args.device, "--checkpoint-minutes", str(args.checkpoint_minutes),
                   "--checkpoint-every", str(args.checkpoint_every)]
        handle = open(args.out / f".{algorithm}.log", "w")
        running[algorithm] = (subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT,
                                               start_new_session=True), time.time())
        print(f"{time.time() - began:6.0f} s  start {algorithm} ({ids[algorithm]}, {before[algorithm]})", flush=True)

    def reap(algorithm: str, killed: bool) -> None:
        process, started = running.pop(algorithm)
        seconds[algorithm] = time.time() - started
        state = "killed at the deadline" if killed else f"exit {process.returncode}"
        print(f"{time.time() - began:6.0f} s  {algorithm}: {state} after {seconds[algorithm]:.0f} s", flush=True)

    while queue or running:
        while queue and len(running) < args.parallel and time.time() - began < args.deadline - args.start_margin:
            start(queue.pop(0))
        for algorithm in [a for a, (p, _) in running.items() if p.poll() is not None]:
            reap(algorithm, killed=False)
        if time.time() - began >= args.deadline:
            for algorithm, (process, _) in list(running.items()):
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                reap(algorithm, killed=True)
            break
        if not running and (not queue or time.time() - began >= args.deadline - args.start_margin):
            break
        time.sleep(1)
    for algorithm in algorithms:
        path = args.out / f".{algorithm}.log"
        if path.exists():
            log.write(f"===== {algorithm} ({ids[algorithm]})\n{path.read_text()}\n")
            path.unlink()
        report["cells"][algorithm] = {"id": ids[algorithm], "before": before[algorithm],
                                      "after": cell_state(args.store, ids[algorithm]),
                                      "seconds_this_loan": round(seconds.get(algorithm, 0.0), 1)}
    log.close()
    report["loadavg_after"] = os.getloadavg()
    report["archive"] = pack(args.store, args.out)
    report["seconds"] = round(time.time() - began, 1)
    (args.out / "column.json").write_text(json.dumps(report, indent=1) + "\n")
    for algorithm, cell in report["cells"].items():
        after = cell["after"]
        where = f"round {after['round']}" if after["state"] == "checkpoint" else after.get("wall_seconds") or ""
        print(f"{algorithm:11s} {cell['id']}  {after['state']:12s} {where}  ({cell['seconds_this_loan']:.0f} s this loan)")
    print(f"column.py: {report['seconds']:.0f} s; archive {report['archive']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
