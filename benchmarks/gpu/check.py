"""The GPU check's steps, each time-boxed and independent: a failing step is recorded, the next runs.

Run by check.sh (which installs the kit first), or directly in an environment that has pflbench:

    python benchmarks/gpu/check.py --out OUT [--rehearse] [--budget SECONDS]

Steps (each a subprocess; its output goes to OUT/check.log, its figures and status to OUT/check.json,
rewritten after every step so that a check cut short still leaves what it measured):
  environment   Python, torch, CUDA, the GPU, the packages the check imports
  cuda_tests    tests/test_cuda.py (marker `cuda`): batched vs loop per algorithm family, BatchNorm,
                the compiled step, a whole cell through the CLI, a device checkpoint read on the CPU
  bench_10      `pflbench bench` at 10 clients (loop, batched, centralized; GFLOP/s vs the measured peak)
  bench_100     the same at 100 clients
  concurrent    1, 4 and 8 processes sharing the GPU, each running a slice of Table 1's Fashion-MNIST
                10-client cell: total throughput and each process's peak GPU memory
  paper_slice   the first rounds of Table 1's Fashion-MNIST 10-client cell (FedAvg, pFedMe, pFedHN,
                Per-FedAvg, then the other rows while time is left), and from them the projected time of
                `make reproduce-table1` on this GPU
  column_groups Table 1's whole Fashion-MNIST 10-client column (10 rows, seed 0, the paper's settings) as one
                cell group: 5 rounds timed (the last with its evaluation), per row seconds a round and the
                600 rounds projected, the column's projected wall time, the group's training throughput in
                sample-steps/s against the `concurrent` step's one-cell-per-process plateau (column_groups.py)
  graphs        the batched local step captured as a CUDA graph (pflbench.simulator.static_step) against the eager step:
                max |diff| and seconds per step (CUDA events) at 10, 70 and 100 rows, and Table 1's Fashion-MNIST
                column's plain rows as one cell group, 2 rounds with graphs off and on, and the methods' own steps
                (pFedMe, Per-FedAvg, pFedHN's official optimizer) eager vs captured, ms a step (graphs.py)
  group_100     the same column at 100 clients (10 of them a round) as one cell group: 3 rounds timed, the
                2500 projected (an evaluation of all 100 projected from the round's counted work)
  kernels       (a call of its own: `--only kernels`) the batched training step of Table 1's two CNNs at 10 and
                100 rows with each convolution form (grouped, unfold + bmm, a per-client loop), channels-first
                and -last, TF32 default/on/off, eager and captured: seconds per step (CUDA events), the ratio to
                the grouped form and to today's path, and each form's distance from a float64 CPU reference of
                the same step (kernels.py)
`--rehearse` runs every step on the CPU at tiny sizes (CI does: every step must say "ok"), `kernels` included.
Why `kernels` is a call of its own: the steps above fill the 540 s, each box sized to what it measures; the
kernels comparison (120 combinations, each timed, most also captured: ~90-130 s on the device, estimated) fits
none of them without dropping what it compares, and it decides one engine change once rather than being
repeated by every check. So a plain run leaves it out and `--only kernels` runs it alone, in a 180 s box: on a
loan of its own, or as a loan's second call where a check left 4 minutes of the loan.
The whole check keeps inside `--budget` seconds (default 540: one device command of 9 minutes, inside the
device's 10-minute limit for a command; a lent device gives 15 minutes in all, its start included, so a
second run is for a few failing steps (`--only`)).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

ENVIRONMENT = """
import json, platform, sys
from importlib import metadata
import torch
facts = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
         "cuda_available": torch.cuda.is_available(), "cpus": __import__("os").cpu_count()}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    facts.update(gpu=p.name, capability=f"{p.major}.{p.minor}", gpu_memory_gib=round(p.total_memory / 2**30, 1),
                 multiprocessors=p.multi_processor_count)
versions = {}
for name in ("numpy", "pandas", "pyarrow", "pydantic", "pydantic_core", "opacus", "scipy", "rich", "jinja2",
             "PyYAML", "matplotlib", "seaborn", "pytest", "pytest-timeout", "torchvision", "pflbench"):
    try:
        versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        versions[name] = None
facts["versions"] = versions
import pflbench.cli
from pflbench.algorithm import ALGORITHMS
facts["algorithms"] = len(list(ALGORITHMS.names()))
print("FIGURES " + json.dumps(facts))
"""


@dataclass
class Step:
    name: str
    command: list[str]
    timeout: float                      # seconds at most (less where the budget has less left)
    figures: Path | None = None         # a JSON file the step writes, folded into check.json
    env: dict[str, str] = field(default_factory=dict)
    separate: bool = False              # runs on the device only when `--only` names it (a call of its own)


def steps(device: str, rehearse: bool, work: Path) -> list[Step]:
    py = sys.executable
    cli = [py, "-m", "pflbench.cli"]
    if rehearse:  # tiny sizes on the CPU: every step runs end to end in a few tens of seconds
        bench = ["--samples", "32", "--shape", "1,28,28", "--repeats", "1", "--no-compile"]
        return [
            Step("environment", [py, "-c", ENVIRONMENT], 60),
            Step("cuda_tests", [py, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider",
                                str(REPO / "tests" / "test_cuda.py")], 400, env={"PFLBENCH_TEST_DEVICE": device}),
            Step("bench_10", [*cli, "bench", "--device", device, "--clients", "2", *bench,
                              "--json", str(work / "bench_10.json")], 120, work / "bench_10.json"),
            Step("bench_100", [*cli, "bench", "--device", device, "--clients", "4", *bench,
                               "--json", str(work / "bench_100.json")], 120, work / "bench_100.json"),
            Step("concurrent", [py, str(HERE / "sharing.py"), "--device", device, "--processes", "1,2",
                                "--rounds", "2", "--samples", "100", "--epochs", "1",
                                "--json", str(work / "concurrent.json")], 180, work / "concurrent.json"),
            Step("paper_slice", [py, str(HERE / "paper_slice.py"), "--device", device, "--rounds", "2",
                                 "--samples", "50", "--epochs", "1", "--algorithms", "fedavg,pfedla,pfedme",
                                 "--sharing", str(work / "concurrent.json"),
                                 "--json", str(work / "paper_slice.json")], 240, work / "paper_slice.json"),
            Step("graphs", [py, str(HERE / "graphs.py"), "--device", device, "--widths", "2,3", "--steps", "2",
                            "--repeats", "1", "--rows", "fedavg,fedbn", "--rounds", "2", "--samples", "30",
                            "--epochs", "1", "--own-inner-steps", "3", "--own-repeats", "1",
                            "--json", str(work / "graphs.json")], 240, work / "graphs.json"),
            Step("column_groups", [py, str(HERE / "column_groups.py"), "--device", device, "--clients", "10",
                                   "--rounds", "3", "--samples", "30", "--epochs", "1", "--client-batching", "on",
                                   "--seconds", "200", "--sharing", str(work / "concurrent.json"),
                                   "--json", str(work / "column_groups.json")], 240, work / "column_groups.json"),
            Step("group_100", [py, str(HERE / "column_groups.py"), "--device", device, "--clients", "100",
                               "--rounds", "3", "--evaluation", "projected", "--samples", "30", "--epochs", "1",
                               "--client-batching", "on", "--seconds", "200", "--sharing", str(work / "concurrent.json"),
                               "--json", str(work / "group_100.json")], 240, work / "group_100.json"),
            Step("kernels", [py, str(HERE / "kernels.py"), "--device", device, "--widths", "2,3", "--batch", "4",
                             "--steps", "2", "--repeats", "1", "--json", str(work / "kernels.json")], 240,
                 work / "kernels.json", separate=True),
        ]
    # Boxes: what each step took on an H100 (benchmarks/gpu/h100-2026-11-26.json: 12, 48, 14, 37, 58 and
    # 67 s) with a margin, and the two group steps (not yet run on a GPU: their own `--seconds` stop
    # starting rounds well inside their box), and the graphs step (not yet run on a GPU: its timed calls are
    # a few seconds, its column two runs of 2 rounds of seven rows); 540 s in all.
    return [
        Step("environment", [py, "-c", ENVIRONMENT], 25),
        Step("cuda_tests", [py, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider",
                            str(REPO / "tests" / "test_cuda.py")], 90, env={"PFLBENCH_TEST_DEVICE": device}),
        Step("bench_10", [*cli, "bench", "--device", device, "--clients", "10", "--repeats", "3", "--no-compile",
                          "--json", str(work / "bench_10.json")], 30, work / "bench_10.json"),
        Step("bench_100", [*cli, "bench", "--device", device, "--clients", "100", "--repeats", "2", "--no-compile",
                           "--json", str(work / "bench_100.json")], 45, work / "bench_100.json"),
        Step("concurrent", [py, str(HERE / "sharing.py"), "--device", device, "--processes", "1,4,8",
                            "--rounds", "5", "--json", str(work / "concurrent.json")], 70, work / "concurrent.json"),
        Step("paper_slice", [py, str(HERE / "paper_slice.py"), "--device", device, "--rounds", "20",
                             "--seconds", "40", "--max-seconds-each", "12", "--sharing", str(work / "concurrent.json"),
                             "--json", str(work / "paper_slice.json")], 60, work / "paper_slice.json"),
        Step("graphs", [py, str(HERE / "graphs.py"), "--device", device, "--rounds", "2",
                        "--json", str(work / "graphs.json")], 60, work / "graphs.json"),
        Step("column_groups", [py, str(HERE / "column_groups.py"), "--device", device, "--clients", "10",
                               "--rounds", "5", "--seconds", "70", "--sharing", str(work / "concurrent.json"),
                               "--json", str(work / "column_groups.json")], 90, work / "column_groups.json"),
        Step("group_100", [py, str(HERE / "column_groups.py"), "--device", device, "--clients", "100",
                           "--rounds", "3", "--evaluation", "projected", "--seconds", "50",
                           "--sharing", str(work / "concurrent.json"),
                           "--json", str(work / "group_100.json")], 70, work / "group_100.json"),
        # A call of its own (module doc): 120 combinations; none starts after 150 s, the last ends well inside 180.
        Step("kernels", [py, str(HERE / "kernels.py"), "--device", device, "--seconds", "150",
                         "--json", str(work / "kernels.json")], 180, work / "kernels.json", separate=True),
    ]


def run_step(step: Step, seconds: float, log) -> dict:
    """Run one step for at most `seconds`: its status (ok, failed, timeout, skipped), time and figures."""
    record: dict = {"command": " ".join(shlex.quote(c) for c in step.command), "timeout": round(seconds, 1)}
    if seconds < 5:
        return {**record, "status": "skipped", "reason": "the check's time budget is spent"}
    log.write(f"\n===== {step.name} (at most {seconds:.0f} s): {record['command']}\n")
    log.flush()
    start = time.monotonic()
    env = {**os.environ, **step.env}
    process = subprocess.Popen(step.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=seconds)
        status = "ok" if process.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        status = "timeout"
    record.update(status=status, seconds=round(time.monotonic() - start, 1), returncode=process.returncode)
    log.write(output or "")
    log.write(f"===== {step.name}: {status} in {record['seconds']} s\n")
    log.flush()
    for line in (output or "").splitlines():
        if line.startswith("FIGURES "):
            record["figures"] = json.loads(line.removeprefix("FIGURES "))
    if step.figures is not None and step.figures.exists():
        try:
            record["figures"] = json.loads(step.figures.read_text())
        except json.JSONDecodeError as error:
            record["figures_error"] = str(error)
    tail = [line for line in (output or "").splitlines() if line.strip()][-3:]
    record["last_lines"] = tail
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pflbench's GPU check (benchmarks/gpu/check.sh runs it)")
    parser.add_argument("--out", required=True, help="folder for check.json and check.log")
    parser.add_argument("--work", default=None, help="scratch folder (default: OUT/work)")
    parser.add_argument("--rehearse", action="store_true", help="every step on the CPU at tiny sizes")
    parser.add_argument("--device", default=None, help="torch device (default: cuda; cpu with --rehearse)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole check (default: 540 on the device, 1200 rehearsing)")
    parser.add_argument("--only", default=None,
                        help="comma-separated step names (a second, shorter run; a step of its own call, `kernels`, "
                             "runs on the device only when named)")
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cpu" if args.rehearse else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("check: torch sees no CUDA device: nothing to check here (--rehearse runs the steps on the CPU)",
              file=sys.stderr)
        return 3
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else out / "work"
    work.mkdir(parents=True, exist_ok=True)
    budget = args.budget or (1200.0 if args.rehearse else 540.0)
    chosen = steps(device, args.rehearse, work)
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {s.name for s in chosen})
        if unknown:
            parser.error(f"unknown step(s) {', '.join(unknown)}; the steps: {', '.join(s.name for s in chosen)}")
        chosen = [s for s in chosen if s.name in names]
    elif not args.rehearse:
        chosen = [s for s in chosen if not s.separate]
    result = {"device": device, "rehearse": args.rehearse, "budget_seconds": budget, "steps": {},
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_before": list(os.getloadavg())}
    start = time.monotonic()
    with open(out / "check.log", "a") as log:
        for step in chosen:
            left = budget - (time.monotonic() - start)
            result["steps"][step.name] = run_step(step, min(step.timeout, left), log)
            print(f"check: {step.name}: {result['steps'][step.name]['status']} "
                  f"({result['steps'][step.name].get('seconds', 0)} s)", flush=True)
            result["seconds"] = round(time.monotonic() - start, 1)
            (out / "check.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    result["loadavg_after"] = list(os.getloadavg())
    result["all_ok"] = all(s["status"] == "ok" for s in result["steps"].values())
    (out / "check.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"check: {'every step ok' if result['all_ok'] else 'not every step ok'} in {result['seconds']} s; "
          f"{out / 'check.json'}, {out / 'check.log'}")
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
