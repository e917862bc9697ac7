"""`make gpu-rehearse`: the next loan's device calls, run on this CPU as the device will run them.

What the device gets is a copy of the tree as the device tool sends it (tracked files, untracked files git
does not ignore, and the carried paths: the kit, the carry of the last loan), at most 64 MiB, and a command
run from its root, under a time limit, in its own Python with the kit installed over it (in_kit.sh:
PYTHONSAFEPATH=1, so a script's folder is not on sys.path; pflbench from the tree, laid out as installed).
This script builds that copy in a scratch folder, a Python that sees only the device image's packages
(rehearse_env.py), and runs in it, through in_kit.sh, each call of the plan at tiny sizes, with its limit:

  verdict  graphs.py as the loan's first call runs it (PLAN.md), at tiny sizes: the captured step against the
           eager one, and the verdict under graphs.RULE (on a CPU: "no CUDA device", the rest bit-identical)
  column   column.py on benchmarks/gpu/rehearse-column.yaml (two rows as one cell group): a deadline, the
           SIGTERM, the pack (results and checkpoints apart); then a second loan that carries what came back
           (copied into the copy's .gpu-carry/, as the next loan's `carry`) and resumes the stopped cell
  check    check.py --rehearse (every step at tiny sizes, `--check-only` to name some: the verdict call is
           `--check-only graphs`), its graphs verdict read back
  cifar    cifar_travel.py unpack --check on the cifar kit (`--cifar-kit`, made by `kit.py --datasets
           cifar10-jpeg`), where one is given: the files rebuilt and the loader's output checked

Every call's returned files are checked against the device's limits (8 files, 16 MiB each, 64 MiB together,
two folders deep, plain names). OUT/rehearse.json: each call's status, seconds, output tail, the tree's and
the returned files' sizes; exit 1 where any call failed or any limit was passed.

    python benchmarks/gpu/rehearse.py --out reports/gpu-rehearsal [--steps verdict,column,check,cifar] [--check-only graphs]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TREE_LIMIT = 64 * 2 ** 20
RETURNED_FILES, RETURNED_FILE_BYTES, RETURNED_BYTES = 8, 16 * 2 ** 20, 64 * 2 ** 20
NAME = re.compile(r"^[A-Za-z0-9._-]+$")
# Tracked folders a loan leaves behind: `make gpu-aside` moves them out of the working tree before the loan's
# first call (the device copies only the files present) and `make gpu-back` returns them after. The CPU cells'
# carried checkpoints (contributing/inflight.md): tens of MB the device never needs, which with the kit would
# pass the 64 MiB.
LEFT_BEHIND = ("contributing/inflight/checkpoints/",)


def sent_files(repo: Path) -> list[str]:
    """What the device tool sends of a checkout once `make gpu-aside` has moved LEFT_BEHIND out: tracked files and
    untracked files git does not ignore."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    return [name for name in listed
            if name and not name.startswith(LEFT_BEHIND) and (repo / name).is_file()]


def build_tree(repo: Path, dest: Path, carry: list[str]) -> int:
    """The tree as the device receives it, at `dest`: its bytes."""
    total = 0
    for name in sent_files(repo):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target, follow_symlinks=False)
        total += target.lstat().st_size
    for path in carry:
        source, target = repo / path, dest / path
        if not source.exists():
            continue
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        if source.is_dir():
            shutil.copytree(source, target)
            total += sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            total += target.stat().st_size
    return total


def add_rehearsal_wheels(tree: Path) -> None:
    """This machine's Python's wheels (kit.py), beside the copy as the rehearsal needs them; not part of
    what the device gets, so not counted."""
    if (REPO / ".gpu-rehearsal-wheels").is_dir():
        shutil.copytree(REPO / ".gpu-rehearsal-wheels", tree / ".gpu-rehearsal-wheels", dirs_exist_ok=True)


def rehearsal_python(work: Path) -> str:
    """A Python that sees only the device image's packages (rehearse_env.py), from this machine's environment."""
    python = os.environ.get("PYTHON") or sys.executable
    return subprocess.run([python, str(HERE / "rehearse_env.py"), str(work)], capture_output=True, text=True,
                          check=True).stdout.strip()


def in_kit(tree: Path, python: str, command: list[str], limit: float, kit: str | None = None) -> dict:
    """`bash benchmarks/gpu/in_kit.sh COMMAND` in `tree` with `python` as the device's python3, killed at
    `limit` seconds as the device kills a call; its status, seconds and output's tail."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "PFLBENCH_"))}
    env["PYTHON"] = python
    if kit:
        env["PFLBENCH_GPU_KIT"] = str(tree / kit)
    began = time.monotonic()
    process = subprocess.Popen(["bash", "benchmarks/gpu/in_kit.sh", *command], cwd=tree, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=limit)
        status = "ok" if process.returncode == 0 else f"failed (exit {process.returncode})"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        status = f"killed at its limit of {limit:.0f} s"
    return {"command": " ".join(command), "status": status, "seconds": round(time.monotonic() - began, 1),
            "output_tail": output[-4000:]}


def returned_problems(out: Path) -> list[str]:
    """What the device would not bring back of `out` (its limits on returned files)."""
    files = [p for p in out.rglob("*") if p.is_file()]
    problems = []
    if len(files) > RETURNED_FILES:
        problems.append(f"{len(files)} files (at most {RETURNED_FILES} come back)")
    if sum(p.stat().st_size for p in files) > RETURNED_BYTES:
        problems.append(f"{sum(p.stat().st_size for p in files)} bytes together (at most {RETURNED_BYTES})")
    for path in files:
        relative = path.relative_to(out)
        if path.stat().st_size > RETURNED_FILE_BYTES:
            problems.append(f"{relative}: {path.stat().st_size} bytes (at most {RETURNED_FILE_BYTES})")
        if len(relative.parts) > 3 or not all(NAME.match(part) for part in relative.parts):
            problems.append(f"{relative}: too deep or a name the device does not return")
    return problems


def sizes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}


def column_loans(tree: Path, python: str, out: Path, work: Path) -> dict:
    """Two loans of column.py: the first stopped at its deadline and packed; the second carrying what came
    back (in the copy's .gpu-carry/) and resuming."""
    spec = "benchmarks/gpu/rehearse-column.yaml"
    common = ["--spec", spec, "--algorithms", "fedavg+local", "--device", "cpu",
              "--checkpoint-every", "1", "--start-margin", "0", "--grace", "60"]
    loans: dict = {}
    for loan, deadline, call in (("loan1", 150, 290), ("loan2", 60, 200)):
        returned = out / f"column-{loan}"
        command = ["python3", "benchmarks/gpu/column.py", "--out", str(returned), "--deadline", str(deadline),
                   "--call-seconds", str(call), "--store", str(work / loan / "store"), *common]
        if loan == "loan2":
            carried = sorted(p.relative_to(tree) for p in (tree / ".gpu-carry").iterdir())
            command += ["--resume", *map(str, carried)]
        loans[loan] = in_kit(tree, python, command, call)
        loans[loan]["returned"] = sizes(returned)
        loans[loan]["returned_problems"] = returned_problems(returned)
        report = returned / "column.json"
        cells = json.loads(report.read_text())["cells"] if report.exists() else {}
        loans[loan]["cells"] = {a: {"before": c["before"], "after": c["after"], "carried": c.get("carried")}
                                for a, c in cells.items()}
        if loans[loan]["status"] != "ok":
            loans["status"] = "failed"
            return loans
        if loan == "loan1":  # what the next loan carries, carried once: into the ignored .gpu-carry/
            (tree / ".gpu-carry").mkdir(exist_ok=True)
            for path in returned.iterdir():
                if path.name.startswith(("results.tar.xz", "ckpt-")):
                    shutil.copy2(path, tree / ".gpu-carry" / path.name)
    first, second = loans["loan1"]["cells"], loans["loan2"]["cells"]
    log = (out / "column-loan2" / "column.log")
    expect = {
        "loan 1 finished FedAvg": first.get("fedavg", {}).get("after", {}).get("state") == "finished",
        "loan 1 carried Local's checkpoint": bool((first.get("local", {}).get("carried") or {}).get("file")),
        "loan 2 found FedAvg finished": second.get("fedavg", {}).get("before", {}).get("state") == "finished",
        "loan 2 resumed Local": log.exists() and "resumed at round" in log.read_text(),
    }
    loans["expected"] = expect
    loans["status"] = ("ok" if all(loans[x]["status"] == "ok" and not loans[x]["returned_problems"]
                                   for x in ("loan1", "loan2")) and all(expect.values()) else "failed")
    return loans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "gpu-rehearsal")
    parser.add_argument("--steps", default="verdict,column,check,cifar")
    parser.add_argument("--check-only", default=None, help="check.py's --only (default: every step)")
    parser.add_argument("--kit", default=".gpu-kit", help="the carried kit (made by kit.py)")
    parser.add_argument("--cifar-kit", default=".gpu-kit-cifar",
                        help="the cifar loan's kit (kit.py --kit .gpu-kit-cifar --datasets cifar10-jpeg); skipped if absent")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new one under /tmp)")
    args = parser.parse_args(argv)
    steps = args.steps.split(",")
    unknown = set(steps) - {"verdict", "column", "check", "cifar"}
    if unknown:
        parser.error(f"unknown step(s) {', '.join(sorted(unknown))}; the steps: verdict, column, check, cifar")
    if not (REPO / args.kit / "wheels").is_dir():
        print(f"rehearse: no kit at {REPO / args.kit}: run 'make gpu-kit' first", file=sys.stderr)
        return 2
    work = args.work or Path(subprocess.run(["mktemp", "-d", "/tmp/pflbench-rehearse.XXXXXX"], capture_output=True,
                                            text=True, check=True).stdout.strip())
    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    began = time.monotonic()
    python = rehearsal_python(work / "env")
    result: dict = {"python": python, "calls": {}}
    tree = work / "tree"
    result["tree_bytes"] = build_tree(REPO, tree, [args.kit])
    add_rehearsal_wheels(tree)
    result["tree_problems"] = ([f"the tree with the kit is {result['tree_bytes']} bytes (at most {TREE_LIMIT})"]
                               if result["tree_bytes"] > TREE_LIMIT else [])
    if "verdict" in steps:
        (out / "verdict").mkdir()
        call = in_kit(tree, python, ["python3", "benchmarks/gpu/graphs.py", "--device", "cpu", "--widths", "2,3",
                                     "--steps", "2", "--repeats", "1", "--rows", "fedavg,fedbn", "--rounds", "2",
                                     "--samples", "30", "--epochs", "1", "--own-inner-steps", "3", "--own-repeats", "1",
                                     "--json", str(out / "verdict" / "graphs.json")], 900)  # a loaded CPU: far slower than the device at full size
        figures = out / "verdict" / "graphs.json"
        call["verdict"] = json.loads(figures.read_text()).get("verdict") if figures.exists() else None
        call["returned"], call["returned_problems"] = sizes(out / "verdict"), returned_problems(out / "verdict")
        if call["status"] == "ok" and (call["returned_problems"] or not call["verdict"]
                                       or call["verdict"]["reasons"] != ["no CUDA device: capture not exercised"]):
            call["status"] = "failed: no verdict, a difference, or returned files over the limits"
        result["calls"]["verdict"] = call
    if "column" in steps:
        result["calls"]["column"] = column_loans(tree, python, out, work)
    if "check" in steps:
        only = ["--only", args.check_only] if args.check_only else []
        call = in_kit(tree, python, ["python3", "benchmarks/gpu/check.py", "--out", str(out / "check"), "--rehearse",
                                     "--work", str(work / "check-work"), *only], 1300)  # as check.sh: work outside OUT
        figures = out / "check" / "check.json"
        if figures.exists():
            graphs = json.loads(figures.read_text())["steps"].get("graphs", {})
            call["verdict"] = (graphs.get("figures") or {}).get("verdict")
        call["returned"] = sizes(out / "check")
        call["returned_problems"] = returned_problems(out / "check")
        if call["returned_problems"]:
            call["status"] = "failed: returned files over the limits"
        result["calls"]["check"] = call
    if "cifar" in steps:
        if (REPO / args.cifar_kit / "wheels").is_dir():
            cifar_tree = work / "tree-cifar"
            result["cifar_tree_bytes"] = build_tree(REPO, cifar_tree, [args.cifar_kit])
            add_rehearsal_wheels(cifar_tree)
            if result["cifar_tree_bytes"] > TREE_LIMIT:
                result["tree_problems"].append(f"the cifar call's tree is {result['cifar_tree_bytes']} bytes")
            (out / "cifar").mkdir()
            result["calls"]["cifar"] = in_kit(cifar_tree, python, [  # the plan's cifar call's first half, as written
                "bash", "-c", f'"$PY" benchmarks/gpu/cifar_travel.py unpack --pack {args.cifar_kit}/data/'
                f'cifar10-jpeg.travel --check > "$1"/cifar.json', "_", str(out / "cifar")], 600, kit=args.cifar_kit)
            if (out / "cifar" / "cifar.json").exists():
                facts = json.loads((out / "cifar" / "cifar.json").read_text())
                result["calls"]["cifar"]["facts"] = {k: facts.get(k) for k in (
                    "blob_xz_bytes", "unpack_seconds", "check_seconds", "check_ok", "decoded_sha256")}
        else:
            result["calls"]["cifar"] = {"status": f"skipped: no cifar kit at {REPO / args.cifar_kit}"}
    result["seconds"] = round(time.monotonic() - began, 1)
    result["loadavg"] = os.getloadavg()
    failed = [name for name, call in result["calls"].items()
              if not (call["status"] == "ok" or call["status"].startswith("skipped"))]
    result["ok"] = not failed and not result["tree_problems"]
    (out / "rehearse.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, call in result["calls"].items():
        seconds = call.get("seconds", sum(call.get(x, {}).get("seconds", 0) for x in ("loan1", "loan2")))
        print(f"rehearse: {name}: {call['status']} ({seconds} s)")
        for part in (call, call.get("loan1", {}), call.get("loan2", {})):
            if part.get("status", "ok") != "ok" and "output_tail" in part:
                print(part["output_tail"][-2000:])
    print(f"rehearse: the tree as sent with {args.kit}: {result['tree_bytes'] / 2 ** 20:.1f} MiB; "
          f"{'every call ok' if result['ok'] else 'NOT every call ok: ' + ', '.join(failed + result['tree_problems'])}; "
          f"{out / 'rehearse.json'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
