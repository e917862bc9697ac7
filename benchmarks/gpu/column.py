"""A paper-scale column on a lent GPU, across as many loans as it takes.

Runs the cells of one `pflbench run` command (a spec and its `--set`s, narrowed by algorithm) in the order
given: each comma-separated item of `--algorithms` one `pflbench run --no-ray --device DEVICE --cell-groups on`
process, `+` joining algorithms into one (their cells one cell group: their clients' local training one
batched step; `fedbn+fedrep+fedfomo`), `--parallel` processes at a time,
with `--cuda-graphs` passed on (`on` once the `graphs` verdict has passed: benchmarks/gpu/PLAN.md), each cell
writing a round checkpoint at least every `--checkpoint-minutes`. At `--deadline` seconds from the start
every process still running gets SIGTERM (pflbench's preemption: each running cell writes a checkpoint of
the round it is in, then exits), SIGKILL after `--grace` more seconds (a kill leaves its last checkpoint:
the store is written atomically).

Then the store goes back packed in two kinds of file, so that a finished row never rides with a checkpoint
that may not fit: `OUT/results.tar.xz` (every cell's folder without its checkpoint; parts under 15 MiB
where larger), written first, and one `OUT/ckpt-ALGORITHM-ID.tar.xz` per unfinished cell (its checkpoint as
byte planes, planes.py, which compress better), compressed side by side, each kept only if it is under
`--checkpoint-cap` bytes, all together under `--checkpoints-bytes` (the room the next loan's carry has
left), within `--max-files` returned files, and done before `--call-seconds` (the device call's limit)
less a margin; the cells closest to finishing first. A checkpoint left out is said in column.json: its cell
starts over. The next loan carries these files once (`--resume FILE...`; the parts of one archive in order)
and the same command continues: finished cells are skipped, the others resume from their checkpoints, bit
for bit (the checkpoint names the code that computes the cell, torch version and execution path: anything
else starts the cell over, said in its log). An archive of an earlier loan (store.tar.xz, store.tar.gz)
unpacks too.

OUT/column.json: per cell its algorithm, id, state (finished, diverged, failed, checkpoint at round R,
not started) and seconds run in this loan, the packed files; the device, torch, TF32 setting and the load.
OUT/column.log: every process's output.

    bash benchmarks/gpu/in_kit.sh python3 benchmarks/gpu/column.py --out "$OUT" --deadline 420 \\
        --call-seconds 590 --spec benchmarks/table1.yaml --set dataset=fmnist --set clients=10 --set seed=0 \\
        --algorithms pfedme,perfedavg,fedbn+fedrep+fedfomo --parallel 3 --cuda-graphs on

tests/test_gpu_column.py runs it on the CPU (`--device cpu`) on a tiny spec: a cell that finishes, one stopped
at the deadline with its checkpoint in the archive and resumed from it by the next call, the results
returned when a checkpoint is over its cap; `make gpu-rehearse` runs it as the device will (benchmarks/gpu/rehearse.py).
"""
from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the scripts beside this one (PYTHONSAFEPATH leaves the script's folder out)
from planes import from_planes, to_planes  # noqa: E402

PART_BYTES = 15 * 2 ** 20  # under the device's 16 MiB a returned file
ARCHIVE = "store.tar.xz"  # an earlier loan's single archive (results and checkpoints together)
RESULTS = "results.tar.xz"
CHECKPOINT_PREFIX = "ckpt-"
RETURNED_FILES = 8  # the device returns at most 8 files
RETURNED_BYTES = 64 * 2 ** 20  # ... of 64 MiB together
PACK_MARGIN = 15.0  # seconds kept between the last packed file and the call's limit
PLANES = ".planes"  # a round checkpoint carried as byte planes (planes.py)
REFUSED = "refused"  # beside the store: the carried checkpoints that did not come back whole


def cell_ids(spec: str, sets: list[str], algorithms: list[str]) -> dict[str, str]:
    """algorithm -> the id of its one cell under the command (each algorithm narrows it to one cell)."""
    from pflbench.config import cell_hash
    from pflbench.run.spec import load_spec
    from pflbench.run.spec_axes import parse_sets

    ids = {}
    for algorithm in algorithms:
        cells = load_spec(spec, sets=parse_sets([*sets, f"algorithm={algorithm}"])).cells
        if len(cells) != 1:
            raise SystemExit(f"column.py: --set {' --set '.join(sets)} with algorithm={algorithm} plans "
                             f"{len(cells)} cells; one cell an algorithm is needed")
        ids[algorithm] = cell_hash(cells[0])
    return ids


def prepare(spec: str, sets: list[str]) -> None:
    from pflbench.simulator.resolve import resolve
    from pflbench.simulator.rounds import prepare_cell
    from pflbench.run.spec import load_spec
    from pflbench.run.spec_axes import parse_sets

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
        from pflbench.storage.checkpoint import CheckpointProblem, read_header

        try:
            return {"state": "checkpoint", "round": read_header(checkpoint).get("round")}
        except CheckpointProblem as problem:
            return {"state": f"checkpoint unreadable: {problem}"}
    return {"state": "not started"}


def archives(files: list[str]) -> list[list[str]]:
    """The carried files grouped into archives: NAME.partNN files, in order, as one; any other file alone."""
    grouped: dict[str, list[str]] = {}
    for name in files:
        base = name.rsplit(".part", 1)[0] if ".part" in Path(name).name else name
        grouped.setdefault(base, []).append(name)
    return [sorted(parts) for parts in grouped.values()]


def unpack(files: list[str], store: Path) -> None:
    """The previous loan's files (its results archive, its checkpoint archives; an earlier loan's single
    store.tar.xz or store.tar.gz; an archive's parts in order) into `store`: each checkpoint carried as byte
    planes (`pack`) written back as it was, its header's SHA-256 checked (one that fails is kept beside the
    store, under REFUSED, and its cell starts over)."""
    from pflbench.storage.checkpoint import CheckpointProblem, verify_checkpoint

    for parts in archives(files):
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


def write_parts(data: bytes, out: Path, name: str) -> list[str]:
    """`data` as OUT/NAME, or as OUT/NAME.partNN pieces under PART_BYTES each."""
    if len(data) <= PART_BYTES:
        (out / name).write_bytes(data)
        return [name]
    names = []
    for index, start in enumerate(range(0, len(data), PART_BYTES)):
        names.append(f"{name}.part{index:02d}")
        (out / names[-1]).write_bytes(data[start:start + PART_BYTES])
    return names


def pack_results(store: Path, out: Path) -> list[str]:
    """Every cell's folder without its round checkpoint (results, logs, claims) as OUT/results.tar.xz."""
    buffer = io.BytesIO()

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if "_damaged" in info.name or "_kept" in info.name or (info.isfile() and info.name.endswith("/checkpoint.pt")):
            return None
        return info

    with tarfile.open(fileobj=buffer, mode="w:xz", preset=6) as archive:
        archive.add(store, arcname=store.name, filter=keep)
    return write_parts(buffer.getvalue(), out, RESULTS)


def checkpoint_archive(job: tuple[str, str, str]) -> tuple[int, float]:
    """One cell's checkpoint as a tar.xz at `target` (byte planes where it is a whole checkpoint; as it is
    otherwise, for the resume to judge): its size and seconds. Run in a worker process."""
    source, arcname, target = job
    began = time.time()
    data = Path(source).read_bytes()
    try:
        data, arcname = to_planes(data), arcname + PLANES
    except (ValueError, zipfile.BadZipFile):
        pass
    info = tarfile.TarInfo(arcname)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
    with tarfile.open(target + ".tmp", mode="w:xz", preset=6) as archive:
        archive.addfile(info, io.BytesIO(data))
    os.replace(target + ".tmp", target)
    return Path(target).stat().st_size, time.time() - began


def pack_checkpoints(store: Path, out: Path, cells: list[tuple[str, str, float]], cap: int, total: int,
                     files: int, until: float, workers: int) -> dict:
    """Each unfinished cell's checkpoint as OUT/ckpt-ALGORITHM-ID.tar.xz, compressed side by side in
    `workers` processes; kept in the order given (`cells`: algorithm, id, share of rounds done; the
    most done first) while each is under `cap` bytes, all under `total`, at most `files` of them, and done
    by `until` (time.time()); what is not kept is removed, and said. -> id: what became of its checkpoint."""
    jobs = []
    for algorithm, cell_id, _ in cells:
        source = store / cell_id / "checkpoint.pt"
        if source.is_file():
            name = f"{CHECKPOINT_PREFIX}{algorithm}-{cell_id[:12]}.tar.xz"
            jobs.append((cell_id, name, (str(source), f"{store.name}/{cell_id}/checkpoint.pt", str(out / name))))
    report: dict = {}
    if not jobs:
        return report
    pool = multiprocessing.get_context("spawn").Pool(max(1, min(workers, len(jobs))))
    pending = {cell_id: (name, pool.apply_async(checkpoint_archive, (job,))) for cell_id, name, job in jobs}
    sizes: dict[str, tuple[int, float]] = {}
    while pending and time.time() < until:
        for cell_id, (_name, result) in list(pending.items()):
            if result.ready():
                pending.pop(cell_id)
                try:
                    sizes[cell_id] = result.get()
                except Exception as error:  # recorded; the others are still packed
                    report[cell_id] = {"left_out": f"packing failed: {type(error).__name__}: {error}"}
        time.sleep(0.1)
    pool.terminate()
    pool.join()
    for cell_id, (name, _) in pending.items():
        report[cell_id] = {"left_out": "not packed before the call's limit"}
        (out / (name + ".tmp")).unlink(missing_ok=True)
    used = 0
    for _, cell_id, _ in [(a, i, d) for a, i, d in cells if i in sizes]:
        name = next(n for i, n, _ in jobs if i == cell_id)
        size, seconds = sizes[cell_id]
        megabytes = f"{size / 2 ** 20:.1f} MiB"
        why = (f"{megabytes} over the cap of {cap / 2 ** 20:.1f} MiB a checkpoint" if size > cap else
               f"{megabytes} past the {total / 2 ** 20:.1f} MiB left for checkpoints" if used + size > total else
               f"the returned files' count ({files} for checkpoints) is reached" if len(
                   [r for r in report.values() if "file" in r]) >= files else None)
        if why:
            (out / name).unlink()
            report[cell_id] = {"left_out": why, "bytes": size, "seconds": round(seconds, 1)}
        else:
            used += size
            report[cell_id] = {"file": name, "bytes": size, "seconds": round(seconds, 1)}
    return report


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
    parser.add_argument("--algorithms", required=True,
                        help="comma-separated processes, in the order to start them; '+' joins algorithms into one "
                             "process, their cells one cell group (pfedme,fedbn+fedrep)")
    parser.add_argument("--parallel", type=int, default=4, help="processes at a time")
    parser.add_argument("--cuda-graphs", choices=("auto", "on", "off"), default="auto",
                        help="passed to pflbench run (on: once the graphs verdict passed, PLAN.md)")
    parser.add_argument("--deadline", type=float, required=True, help="seconds from the start: stop, then pack")
    parser.add_argument("--grace", type=float, default=30.0,
                        help="seconds after the deadline's SIGTERM for the cells' checkpoints, then SIGKILL")
    parser.add_argument("--call-seconds", type=float, default=None,
                        help="the device call's limit in seconds from the start: checkpoints not packed "
                             f"{PACK_MARGIN:.0f} s before it are left out (default: no limit)")
    parser.add_argument("--checkpoint-cap", type=int, default=PART_BYTES, help="bytes at most a checkpoint's archive")
    parser.add_argument("--checkpoints-bytes", type=int, default=15 * 2 ** 20,
                        help="bytes at most all checkpoints' archives (the next loan's carry has that room left)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--checkpoint-minutes", type=float, default=1.0)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="rounds (0: by time only)")
    parser.add_argument("--start-margin", type=float, default=30.0,
                        help="no cell starts later than this many seconds before the deadline")
    parser.add_argument("--store", type=Path, default=Path("/tmp/pflbench-column/store"))
    parser.add_argument("--resume", nargs="*", default=[],
                        help="the previous loan's files: results.tar.xz and ckpt-*.tar.xz (parts in order); "
                             "an earlier loan's store.tar.xz or store.tar.gz too")
    args = parser.parse_args(argv)
    began = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    args.store.parent.mkdir(parents=True, exist_ok=True)
    if args.resume:
        unpack(args.resume, args.store)
    args.store.mkdir(parents=True, exist_ok=True)
    processes = [item.split("+") for item in args.algorithms.split(",")]
    algorithms = [a for group in processes for a in group]
    ids = cell_ids(args.spec, args.sets, algorithms)
    before = {a: cell_state(args.store, ids[a]) for a in algorithms}
    waiting = [a for a in algorithms if before[a]["state"] in ("checkpoint", "not started")]
    if waiting:  # the dataset decoded and cached once, before the processes that read it start
        prepare(args.spec, [*args.sets, f"algorithm={waiting[0]}"])
    queue = [[a for a in group if a in waiting] for group in processes]
    queue = [group for group in queue if group]
    log = (args.out / "column.log").open("w")
    report: dict = {"command": ["pflbench", "run", args.spec, *[x for s in args.sets for x in ("--set", s)]],
                    "processes": args.algorithms, "cuda_graphs": args.cuda_graphs, "facts": device_facts(args.device),
                    "loadavg_before": os.getloadavg(), "cells": {}}
    running: dict[str, tuple[subprocess.Popen, float, list[str]]] = {}
    seconds: dict[str, float] = {}

    def start(group: list[str]) -> None:
        name = "+".join(group)
        command = [sys.executable, "-m", "pflbench.cli", "run", args.spec, *[x for s in args.sets for x in ("--set", s)],
                   "--set", f"algorithm=[{', '.join(group)}]", "--results", str(args.store), "--no-ray",
                   "--device", args.device, "--cell-groups", "on", "--cuda-graphs", args.cuda_graphs,
                   "--checkpoint-minutes", str(args.checkpoint_minutes), "--checkpoint-every", str(args.checkpoint_every)]
        handle = open(args.out / f".{name}.log", "w")
        running[name] = (subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True),
                         time.time(), group)
        print(f"{time.time() - began:6.0f} s  start {name} ({', '.join(f'{a} {before[a]}' for a in group)})", flush=True)

    def reap(name: str, how: str) -> None:
        process, started, group = running.pop(name)
        for algorithm in group:
            seconds[algorithm] = time.time() - started
        print(f"{time.time() - began:6.0f} s  {name}: {how or f'exit {process.returncode}'} after "
              f"{time.time() - started:.0f} s", flush=True)

    while queue or running:
        while queue and len(running) < args.parallel and time.time() - began < args.deadline - args.start_margin:
            start(queue.pop(0))
        for name in [n for n, (p, _, _) in running.items() if p.poll() is not None]:
            reap(name, "")
        if time.time() - began >= args.deadline:
            for process, _, _ in running.values():  # preemption: each running cell checkpoints its round
                os.killpg(process.pid, signal.SIGTERM)
            stop = time.time() + args.grace
            while running and time.time() < stop:
                for name in [n for n, (p, _, _) in running.items() if p.poll() is not None]:
                    reap(name, f"stopped at the deadline (SIGTERM, exit {running[name][0].returncode})")
                time.sleep(0.2)
            for name, (process, _, _) in list(running.items()):
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                reap(name, f"killed {args.grace:.0f} s after the deadline's SIGTERM")
            break
        if not running and (not queue or time.time() - began >= args.deadline - args.start_margin):
            break
        time.sleep(1)
    for path in sorted(args.out.glob(".*.log")):
        log.write(f"===== {path.name[1:-4]}\n{path.read_text()}\n")
        path.unlink()
    for algorithm in algorithms:
        report["cells"][algorithm] = {"id": ids[algorithm], "before": before[algorithm],
                                      "after": cell_state(args.store, ids[algorithm]),
                                      "seconds_this_loan": round(seconds.get(algorithm, 0.0), 1)}
    log.close()
    report["loadavg_after"] = os.getloadavg()
    packing = time.time()
    report["results"] = pack_results(args.store, args.out)
    report["results_bytes"] = sum((args.out / n).stat().st_size for n in report["results"])
    report["results_seconds"] = round(time.time() - packing, 1)
    (args.out / "column.json").write_text(json.dumps(report, indent=1) + "\n")  # the rows, whatever comes next
    unfinished = []
    for algorithm in algorithms:
        after = report["cells"][algorithm]["after"]
        if after["state"] == "checkpoint":
            from pflbench.run.spec import load_spec
            from pflbench.run.spec_axes import parse_sets

            rounds = load_spec(args.spec, sets=parse_sets([*args.sets, f"algorithm={algorithm}"])).cells[0].rounds
            unfinished.append((algorithm, ids[algorithm], (after["round"] or 0) / rounds))
    unfinished.sort(key=lambda cell: -cell[2])
    spent = len(report["results"]) + 2  # column.json and column.log come back too
    room = RETURNED_BYTES - report["results_bytes"] - 2 * 2 ** 20
    until = began + args.call_seconds - PACK_MARGIN if args.call_seconds else float("inf")
    packing = time.time()
    packed = pack_checkpoints(args.store, args.out, unfinished, args.checkpoint_cap, min(args.checkpoints_bytes, room),
                              RETURNED_FILES - spent, until, os.cpu_count() or 1)
    report["checkpoints_seconds"] = round(time.time() - packing, 1)
    for cell in report["cells"].values():
        if cell["id"] in packed:
            cell["carried"] = packed[cell["id"]]
    report["seconds"] = round(time.time() - began, 1)
    (args.out / "column.json").write_text(json.dumps(report, indent=1) + "\n")
    for algorithm, cell in report["cells"].items():
        after = cell["after"]
        where = f"round {after['round']}" if after["state"] == "checkpoint" else after.get("wall_seconds") or ""
        carried = cell.get("carried", {})
        carried = carried.get("file") or (f"left out: {carried['left_out']}" if carried else "")
        print(f"{algorithm:11s} {cell['id']}  {after['state']:12s} {where}  ({cell['seconds_this_loan']:.0f} s this "
              f"loan) {carried}")
    print(f"column.py: {report['seconds']:.0f} s; results {report['results']} ({report['results_bytes']} bytes, "
          f"{report['results_seconds']} s); checkpoints packed in {report['checkpoints_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
