"""A real multi-node Ray cluster on this machine, a node lost mid-matrix, nothing lost (issue 45).

Two Ray nodes, each in network, PID, UTS and mount namespaces of its own (`unshare`), joined by a veth
pair, with addresses of a private test range (10.213.45.1 and .2) routed over that pair only; nothing
else is reachable from either namespace, so all traffic stays between them. The head node
("pfl-head", 2 CPUs) runs the driver, `pflbench run SPEC --ray-address 10.213.45.1:PORT`, with the
store and the data root. The worker node ("pfl-worker", 2 CPUs) sees neither: a private tmpfs is
mounted over both paths in its mount namespace, so there is no shared results folder and its data root
is empty (it makes the partition itself, verified against the driver's: pflbench/run/node_data.py).

The matrix: four cells (FedAvg with a gate, seeds 0-3, 5 rounds, a checkpoint every round). A cell on
the worker node stops at the start of round GATE_ROUND (its checkpoint of round GATE_ROUND - 1 written
through the driver's keeper, pflbench/run/checkpoint_relay.py) and says so; once every other cell has
finished on the head, the test checks those checkpoints in the driver's store and kills -9 every
process of the worker node (its raylet and workers). Ray declares the node dead, the runner retries
its cells on the head, and they resume at round GATE_ROUND - 1 from the driver's copy. Then: every cell
finished exactly once, the lost node's cells said "resumed at round 2 of 5", the metrics and summaries
are bit-identical to an in-process run of the same spec, and the store holds no checkpoint, claim or
temporary file. The gate makes the kill's moment deterministic (whatever the machine's load); the loss
itself is a real one. Unnamed namespaces (unshare, not `ip netns add`) die with their last process, and
the veth pair with them: the test kills both namespaces in `finally`, removes the pair if it was
never moved, and every wait is bounded. Skipped where namespaces cannot be made (not root, no `ip`
or `unshare`). Ray's command line runs as `python -m ray.scripts.scripts` with this interpreter, so
both nodes' workers run this checkout's code.

The same cluster runs a sweep (issue 60, part 4): `pflbench sweep` of the gated FedAvg, four trials at
once (one CPU each: two on each node), no early stopping. The worker node's two trials stop at the gate
with their checkpoints of round GATE_ROUND - 1 kept by the sweep's keeper in the driver's sweep folder;
the node is killed, Tune restarts the lost trials on the head and they resume there from the driver's
copies ("resumed at round 2 of 5"); every trial reports, round by round, the validation accuracy and
loss an uninterrupted trial of its values reports in this process, bit for bit.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml

from budgets import scaled
from checkpoint_helpers import TIMING_COLUMNS
from pflbench.simulator.metrics import RUN_RECORD_KEYS

ROUNDS = 5
GATE_ROUND = 3
SEEDS = [0, 1, 2, 3]
HEAD_IP, WORKER_IP = "10.213.45.1", "10.213.45.2"
# Seconds for the whole cluster part (about 60 on two idle cores), scaled by the load when the module is loaded
# (tests/budgets.py); every wait is bounded by it, and so is the test (pytest-timeout's box, the reference run after).
DEADLINE = scaled(300.0)
pytestmark = pytest.mark.timeout(max(600.0, DEADLINE + scaled(150.0)))
VOLATILE = RUN_RECORD_KEYS | {"train_time_total", "server_time_total", "eval_time_total"}

GATED_AVG = '''
"""FedAvg that, on the node named pfl-worker, stops at the start of round {gate_round} (bounded) after
writing {gate}/waiting-<key>-<pid> (key: the cell's {ident}); every round it runs is traced to
{gate}/trace-<host>.txt."""
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from pflbench.algorithm import ALGORITHMS
from pflbench.algorithms.fedavg import FedAvg

GATE = Path({gate!r})


@ALGORITHMS.register("gated-fedavg")
class GatedFedAvg(FedAvg):
    def configure(self, rnd):
        host, seed = socket.gethostname(), {ident}
        if host.startswith("pfl-"):
            with open(GATE / f"trace-{{host}}.txt", "a") as trace:
                trace.write(f"{{seed}} {{rnd.number}} {{os.getpid()}}\\n")
        if host == "pfl-worker" and rnd.number == {gate_round}:
            (GATE / f"waiting-{{seed}}-{{os.getpid()}}").touch()
            deadline = time.monotonic() + {wait}
            while time.monotonic() < deadline:  # the test kills this node meanwhile
                time.sleep(0.1)
            raise RuntimeError("the test never killed this node")
        return super().configure(rnd)
'''

# A node's address sits on its own loopback, with a route to the other node through its end of the veth
# pair: when the worker's namespace dies the pair goes with it, and the head keeps its address (with
# the address on the veth end, the head lost it, and its own connections to it timed out).
COMMON = """
set -e
hostname "$NODE"
ip link set lo up
ip addr add "$IP/32" dev lo
for i in $(seq 300); do ip link show "$VETH" > /dev/null 2>&1 && break; sleep 0.1; done
ip link set "$VETH" up
ip route add "$PEER/32" dev "$VETH" src "$IP"
"""

HEAD_SCRIPT = (
    COMMON
    + """
"$PYTHON" -m ray.scripts.scripts start --head --node-ip-address "$IP" --port "$PORT" --temp-dir "$RAY_DIR" --num-cpus 2 \\
    --include-dashboard false --disable-usage-stats > "$LOGS/head-start.log" 2>&1
touch "$LOGS/head-ready"
for i in $(seq 1200); do [ -e "$LOGS/go" ] && break; sleep 0.1; done
set +e
"$PYTHON" -m pflbench.cli $DRIVER --ray-address "$IP:$PORT" --results "$STORE" --root "$DATA" \\
    --checkpoint-every 1 --checkpoint-minutes 0 > "$LOGS/run.log" 2>&1
code=$?
"$PYTHON" -m ray.scripts.scripts stop --force > "$LOGS/head-stop.log" 2>&1
exit $code
"""
)

WORKER_SCRIPT = (
    """
mount -t tmpfs -o size=64m pfl-worker-private "$STORE"  # no shared results folder
mount -t tmpfs -o size=64m pfl-worker-private "$DATA"   # nor the driver's data root
"""
    + COMMON
    + """
# As soon as the head's GCS listens (the head's own start goes on meanwhile)
for i in $(seq 600); do timeout 1 bash -c 'exec 3<>"/dev/tcp/$HEAD_IP/$PORT"' 2>/dev/null && break; sleep 0.1; done
"$PYTHON" -m ray.scripts.scripts start --address "$HEAD_IP:$PORT" --node-ip-address "$IP" --temp-dir "$RAY_DIR" --num-cpus 2 \\
    --disable-usage-stats > "$LOGS/worker-start.log" 2>&1
touch "$LOGS/worker-ready"
exec sleep infinity  # until the test kills the node (a node that ended by itself would not be a loss)
"""
)


def namespaces_unavailable() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (network, PID and mount namespaces, a veth pair)"
    if not shutil.which("unshare") or not shutil.which("ip"):
        return "needs Linux with unshare and ip (util-linux, iproute2)"
    probe = subprocess.run(
        [
            "unshare",
            "--net",
            "--pid",
            "--uts",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "sh",
            "-c",
            "ip link set lo up && mount -t tmpfs probe /mnt",
        ],
        capture_output=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"cannot make network/PID/mount namespaces here: {probe.stderr.decode().strip()[:200]}"
    return None


def netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def processes_in_pid_namespace_of(pid: int) -> dict[int, str]:
    """Every process (host pid -> command) in the PID namespace that `pid`'s children live in."""
    try:
        [child] = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        target = os.readlink(f"/proc/{child}/ns/pid")
    except (OSError, ValueError):
        return {}
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "pid") == target:
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
            except OSError:
                continue
    return found


def wait_until(condition, what: str, deadline: float, interval: float = 0.1):
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"no {what} in time")


def kill_node(unshare: subprocess.Popen) -> dict[int, str]:
    """kill -9 every process of the namespace (the node's raylet, workers, everything); returns them."""
    victims = processes_in_pid_namespace_of(unshare.pid)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims


@dataclass
class LostNodeRun:
    """What `run_and_lose_the_worker_node` saw: the driver's exit status, the gate's files when the node
    was killed (`waiting`), what `at_kill` read from the head's store just before, the processes killed."""

    code: int | None
    seconds: float
    moments: dict
    waiting: list
    at_kill: object
    killed: dict
    leftovers: list
    nodes: list
    run_log: str
    logs_text: str


def run_and_lose_the_worker_node(tmp_path: Path, driver: str, ready, at_kill) -> LostNodeRun:
    """Start the two nodes; run `pflbench <driver> --ray-address HEAD --results STORE --root DATA
    --checkpoint-every 1 --checkpoint-minutes 0` on the head; when `ready()` returns the gate's waiting
    files (the worker node's work at the gate, the rest finished), call `at_kill()` and kill -9 every
    process of the worker node; wait for the driver to end; take both namespaces down."""
    logs, store, data = (tmp_path / name for name in ("logs", "store", "data"))
    tag = secrets.token_hex(3)
    veth_head, veth_worker = f"pflh{tag}", f"pflw{tag}"
    ray_dirs = [Path(tempfile.mkdtemp(prefix=f"pflmn{tag}{node}-", dir="/tmp")) for node in "hw"]  # short: unix sockets
    home = tmp_path / "home"  # no Ray token: this cluster asks for none
    home.mkdir()
    env = {
        key: value for key, value in os.environ.items() if not key.startswith("RAY_") or key == "RAY_worker_niceness"
    }  # conftest.py
    env.update(
        HOME=str(home),
        PYTHON=sys.executable,
        PORT="6379",
        LOGS=str(logs),
        DRIVER=driver,
        STORE=str(store),
        DATA=str(data),
        HEAD_IP=HEAD_IP,
        RAY_USAGE_STATS_ENABLED="0",
        PFLBENCH_DATA_MIRROR=str(tmp_path / "no-mirror"),
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
        # A lost node is declared dead after ~3 s instead of ~15 s.
        RAY_health_check_period_ms="1000",
        RAY_health_check_timeout_ms="1000",
        RAY_health_check_failure_threshold="3",
    )
    unshare = ["unshare", "--net", "--pid", "--uts", "--fork", "--mount-proc", "--kill-child", "bash", "-c"]
    nodes: list[subprocess.Popen] = []
    started = time.monotonic()
    deadline = started + DEADLINE
    killed: dict[int, str] = {}
    waiting: list[Path] = []
    moments: dict[str, float] = {}
    inspected = None
    code = None
    try:
        for name, script, ip, peer, veth, ray_dir in (
            ("pfl-head", HEAD_SCRIPT, HEAD_IP, WORKER_IP, veth_head, ray_dirs[0]),
            ("pfl-worker", WORKER_SCRIPT, WORKER_IP, HEAD_IP, veth_worker, ray_dirs[1]),
        ):
            with open(logs / f"{name}.out", "w") as out:
                nodes.append(
                    subprocess.Popen(
                        unshare + [script],
                        env={**env, "NODE": name, "IP": ip, "VETH": veth, "PEER": peer, "RAY_DIR": str(ray_dir)},
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        ours = netns(os.getpid())
        for node in nodes:  # each `unshare` is in its new network namespace before a link is moved there
            wait_until(lambda: netns(node.pid) not in (None, ours), "network namespace", deadline, 0.02)  # noqa: B023 (called in this iteration)
        subprocess.run(["ip", "link", "add", veth_head, "type", "veth", "peer", "name", veth_worker], check=True)
        subprocess.run(["ip", "link", "set", veth_head, "netns", str(nodes[0].pid)], check=True)
        subprocess.run(["ip", "link", "set", veth_worker, "netns", str(nodes[1].pid)], check=True)
        up = [logs / "head-ready", logs / "worker-ready"]
        wait_until(
            lambda: all(p.exists() for p in up) or any(n.poll() is not None for n in nodes), "both nodes", deadline
        )
        assert all(p.exists() for p in up), "a node did not start"
        (logs / "go").touch()
        moments = {"nodes up": time.monotonic() - started}

        # Every other cell or trial finished on the head, the worker node's waiting at the gate: kill the node.
        waiting = wait_until(lambda: ready() or nodes[0].poll() is not None, "work at the gate", deadline)
        assert waiting is not True and nodes[0].poll() is None, "the driver ended before anything reached the gate"
        inspected = at_kill()
        moments["at the gate"] = time.monotonic() - started
        killed = kill_node(nodes[1])
        moments["node killed"] = time.monotonic() - started
        code = nodes[0].wait(timeout=max(1.0, deadline - time.monotonic()))
        moments["driver ended"] = time.monotonic() - started
    finally:
        for node in nodes:
            if node.poll() is None:
                kill_node(node)
                node.kill()  # --kill-child: the namespace's first process goes with it
            try:
                node.wait(timeout=scaled(10))
            except subprocess.TimeoutExpired:
                pass
        subprocess.run(["ip", "link", "del", veth_head], capture_output=True)  # only if it never moved
        leftovers = subprocess.run(["pgrep", "-f", f"pflmn{tag}"], capture_output=True, text=True).stdout.split()
        for node, ray_dir in zip(("head", "worker"), ray_dirs):
            if code != 0:  # Ray's own logs, for the failure's message
                for session in ray_dir.glob("session_2*"):
                    shutil.copytree(
                        session / "logs",
                        logs / f"ray-{node}",
                        dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.sock", "events"),
                    )
            shutil.rmtree(ray_dir, ignore_errors=True)
    seconds = time.monotonic() - started
    run_log = (logs / "run.log").read_text() if (logs / "run.log").exists() else "(no run.log)"
    logs_text = "\n".join(
        f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(logs.glob("*.log")) + sorted(logs.glob("*.out"))
    )
    return LostNodeRun(code, seconds, moments, waiting, inspected, killed, leftovers, nodes, run_log, logs_text)


def gated_plugin(tmp_path: Path, ident: str) -> tuple[Path, Path]:
    """The gated FedAvg plugin (GATED_AVG) naming its cells by `ident`, and its gate folder; the run's
    folders (logs, store, data) made."""
    for name in ("logs", "gate", "store", "data"):
        (tmp_path / name).mkdir()
    plugin = tmp_path / "gated_avg.py"
    plugin.write_text(GATED_AVG.format(gate=str(tmp_path / "gate"), gate_round=GATE_ROUND, wait=DEADLINE, ident=ident))
    return plugin, tmp_path / "gate"


def gate_trace(gate: Path, key=int) -> dict[str, list[tuple]]:
    """What ran where: the gate's trace (key, round, pid) per node."""
    return {
        node: [
            (key(k), int(r), int(pid))
            for k, r, pid in (line.split() for line in (gate / f"trace-{node}.txt").read_text().splitlines())
        ]
        for node in ("pfl-head", "pfl-worker")
        if (gate / f"trace-{node}.txt").exists()
    }


def assert_the_cluster_went_down(run: LostNodeRun) -> None:
    assert run.code == 0, f"the driver ended with {run.code} after {run.seconds:.0f} s\n{run.logs_text}"
    assert not run.leftovers, f"processes of the cluster survived it: {run.leftovers}"
    assert not any(netns(node.pid) for node in run.nodes)
    assert any(
        name.startswith(f"{sys.executable} ") or "ray::" in name or "raylet" in name for name in run.killed.values()
    )


def test_a_node_lost_mid_matrix_loses_nothing(tmp_path, monkeypatch, fresh_plugins):
    why = namespaces_unavailable()
    if why:
        pytest.skip(why)
    from pflbench.storage.checkpoint import read_checkpoint
    from pflbench.cli import main
    from pflbench.run.spec import load_spec
    from pflbench.storage.store import Store

    plugin, gate = gated_plugin(tmp_path, "self.engine.cell.seed")
    store = tmp_path / "store"
    spec = tmp_path / "multinode.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "multinode",
                "plugins": [str(plugin)],
                "matrix": {"algorithm": ["gated-fedavg"], "dataset": ["synthetic"], "seed": SEEDS},
                "defaults": {
                    "rounds": ROUNDS,
                    "clients": 3,
                    "local_epochs": 1,
                    "eval_every": 1,
                    "dataset_options": {"num_samples": 300},
                },
                "resources": {"cpus": 1},
            }
        )
    )

    def worker_cells_stuck():
        stuck = sorted(gate.glob("waiting-*"))
        finished = [p for p in store.glob("*/summary.json")]
        return stuck if stuck and len(stuck) + len(finished) == len(SEEDS) else None

    def checkpoints_in_the_store():
        found = {}
        for path in store.glob("*/checkpoint.pt"):
            header, payload = read_checkpoint(path)  # whole: header, size, checksum, payload
            found[path.parent.name] = (header["host"], header["round"], payload["round"])
        return found

    run = run_and_lose_the_worker_node(tmp_path, f"run {spec}", worker_cells_stuck, checkpoints_in_the_store)
    started = time.monotonic() - run.seconds
    assert_the_cluster_went_down(run)
    run_log, checkpoints, killed = run.run_log, run.at_kill, run.killed

    trace = gate_trace(gate)
    lost = sorted(int(p.name.split("-")[1]) for p in run.waiting)
    assert lost and set(seed for seed, _, _ in trace["pfl-worker"]) == set(lost)
    assert all(
        host == "pfl-worker" and header_round == payload_round == GATE_ROUND - 1
        for host, header_round, payload_round in checkpoints.values()
    ) and len(checkpoints) == len(lost)
    for seed in lost:  # resumed on the head from the round after the checkpoint, not from round 1
        assert sorted(r for s, r, _ in trace["pfl-head"] if s == seed) == list(range(GATE_ROUND, ROUNDS + 1))
    resumed = [line.strip() for line in run_log.splitlines() if "resumed at round" in line]
    assert run_log.count(f"resumed at round {GATE_ROUND - 1} of {ROUNDS}") == len(lost), run_log
    assert run_log.count("retry 1 of 2") == len(lost) and "retry 2 of 2" not in run_log, run_log
    assert len(re.findall(r"^finished gated-fedavg", run_log, re.MULTILINE)) == len(SEEDS), run_log  # once each

    # The same spec in this process: identical metrics and summaries, cell by cell.
    monkeypatch.setenv("PFLBENCH_DATA_MIRROR", str(tmp_path / "no-mirror"))
    assert (
        main(
            [
                "run",
                str(spec),
                "--no-ray",
                "--results",
                str(tmp_path / "in-process"),
                "--root",
                str(tmp_path / "ref-data"),
            ]
        )
        == 0
    )
    cells = load_spec(spec).cells
    there, here = Store(store), Store(tmp_path / "in-process")
    for cell in cells:
        a, b = there.summary(cell), here.summary(cell)
        assert a["status"] == "finished", run_log
        assert {k: v for k, v in a.items() if k not in VOLATILE} == {k: v for k, v in b.items() if k not in VOLATILE}
        assert a["resumed_from_round"] == (GATE_ROUND - 1 if cell.seed in lost else None)
        for name in ("metrics.parquet", "rounds.parquet"):
            x, y = pd.read_parquet(there.cell_dir(cell) / name), pd.read_parquet(here.cell_dir(cell) / name)
            columns = [c for c in x.columns if c not in TIMING_COLUMNS]
            pd.testing.assert_frame_equal(x[columns], y[columns], check_exact=True)
    # Nothing left behind: per cell its result files only; no checkpoint, claim, temporary or set-aside file.
    extra = [
        str(p.relative_to(store))
        for p in store.rglob("*")
        if p.name in ("checkpoint.pt", "claim.json") or p.name.endswith(".tmp") or "_damaged" in p.parts
    ]
    assert not extra, extra
    assert sorted(p.name for p in store.iterdir() if p.is_dir()) == sorted(there.cell_dir(c).name for c in cells)
    print(
        json.dumps(
            {
                "nodes": {
                    "pfl-head": f"{HEAD_IP}, 2 CPUs, driver + store",
                    "pfl-worker": f"{WORKER_IP}, 2 CPUs, private tmpfs over store and data",
                },
                "rounds_per_node": {
                    node: {
                        seed: sorted(r for s, r, _ in rows if s == seed)
                        for seed in SEEDS
                        if any(s == seed for s, _, _ in rows)
                    }
                    for node, rows in trace.items()
                },
                "killed": {
                    "processes": len(killed),
                    "commands": sorted({name.split()[0].rsplit("/", 1)[-1] for name in killed.values()}),
                },
                "checkpoints_at_kill": {key[:8]: list(value) for key, value in checkpoints.items()},
                "resumed": resumed,
                "lost_seeds": lost,
                "seconds": {k: round(v, 1) for k, v in run.moments.items()},
                "reference_and_checks_s": round(time.monotonic() - started - run.seconds, 1),
                "load": os.getloadavg(),
            }
        )
    )


TRIALS = 4  # at once, one CPU each: two on each node


@pytest.mark.slow
def test_a_sweep_whose_worker_node_is_lost_resumes_its_trials_from_the_drivers_keeper(tmp_path, fresh_plugins):
    why = namespaces_unavailable()
    if why:
        pytest.skip(why)
    from ray import tune

    from pflbench.storage.checkpoint import read_checkpoint
    from pflbench.simulator.execution import ExecutionOptions
    from pflbench.loader.plugins import sources_for
    from pflbench.tuning.trial import base_cell, run_trial

    plugin, gate = gated_plugin(tmp_path, "repr(self.engine.cell.lr)")
    store = tmp_path / "store"
    spec = tmp_path / "sweep-base.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "multinode-sweep",
                "plugins": [str(plugin)],
                "matrix": {"algorithm": ["gated-fedavg"], "dataset": ["synthetic"]},
                "defaults": {
                    "rounds": ROUNDS,
                    "clients": 3,
                    "local_epochs": 1,
                    "eval_every": 1,
                    "lr": 0.05,
                    "dataset_options": {"num_samples": 300},
                },
                "resources": {"cpus": 1},
            }
        )
    )
    driver = (
        f"sweep --algo gated-fedavg --spec {spec} --trials {TRIALS} --workers {TRIALS} "
        f"--grace-rounds {ROUNDS} --out {tmp_path / 'tuned'}"
    )  # grace = rounds: ASHA stops no trial

    def worker_trials_stuck():
        stuck = sorted(gate.glob("waiting-*"))
        trace = gate_trace(gate, key=str) if stuck else {}
        finished = {k for k, r, _ in trace.get("pfl-head", []) if r == ROUNDS}
        return stuck if stuck and len(stuck) + len(finished) == TRIALS else None

    def checkpoints_in_the_drivers_sweep_folder():
        found = {}
        for path in store.glob("sweeps/*/checkpoints/*/checkpoint.pt"):
            header, payload = read_checkpoint(path)  # whole: header, size, checksum, payload
            found[path.parent.name] = (header["host"], header["round"], payload["round"])
        return found

    run = run_and_lose_the_worker_node(tmp_path, driver, worker_trials_stuck, checkpoints_in_the_drivers_sweep_folder)
    assert_the_cluster_went_down(run)
    checkpoints = run.at_kill

    [folder] = (store / "sweeps").iterdir()
    outcomes = json.loads((folder / "sweep.json").read_text())["outcomes"]
    assert len(outcomes) == TRIALS and all(t["status"] == "completed" for t in outcomes), outcomes
    trace = gate_trace(gate, key=str)
    lost = {p.name.split("-")[1] for p in run.waiting}
    assert lost and {k for k, _, _ in trace["pfl-worker"]} == lost
    lost_ids = {t["trial_id"] for t in outcomes if repr(t["values"]["lr"]) in lost}
    assert len(lost_ids) == len(lost), (lost, outcomes)
    # At the kill, the lost trials' checkpoints (written on the worker node, round GATE_ROUND - 1) were in
    # the driver's sweep folder, kept by its keeper; the worker node's own disk is gone with it.
    assert set(checkpoints) >= lost_ids, checkpoints
    assert all(checkpoints[i] == ("pfl-worker", GATE_ROUND - 1, GATE_ROUND - 1) for i in lost_ids), checkpoints
    for key in lost:  # resumed on the head from the round after the checkpoint, not from round 1
        assert sorted(r for k, r, _ in trace["pfl-head"] if k == key) == list(range(GATE_ROUND, ROUNDS + 1))
    for trial in outcomes:
        assert trial["resumed_at_rounds"] == ([GATE_ROUND - 1] if trial["trial_id"] in lost_ids else []), trial
        assert (
            f"({trial['trial_id']}): resumed at round {GATE_ROUND - 1} of {ROUNDS} from its checkpoint" in run.run_log
        ) == (trial["trial_id"] in lost_ids), run.run_log
    assert not list(folder.glob("checkpoints/*/checkpoint.pt"))  # every trial finished: none left

    # Each trial's values run here without interruption: the same validation accuracy and loss every round.
    stored = pd.read_parquet(folder / "trials.parquet")
    base, _ = base_cell("gated-fedavg", spec)
    for i, trial in enumerate(outcomes):
        reports = []
        real, tune.report = tune.report, lambda metrics, **_: reports.append(metrics)  # noqa: B023 (called in this iteration)
        try:
            run_trial(
                trial["values"],
                base=base.model_dump(mode="json"),
                cpus=1,
                data_root=str(tmp_path / "ref-data"),
                mirror=None,
                execution=ExecutionOptions(device="cpu"),
                plugins=sources_for([base]),
            )
        finally:
            tune.report = real
        mine = stored[stored["trial"] == i]
        assert list(mine["round"]) == [r["round"] for r in reports] == list(range(1, ROUNDS + 1))
        assert list(mine["val_accuracy"]) == [r["val_accuracy"] for r in reports]
        assert list(mine["val_loss"]) == [r["val_loss"] for r in reports] and mine["val_loss"].notna().all()
    print(
        json.dumps(
            {
                "lost_trials": sorted(lost_ids),
                "checkpoints_at_kill": checkpoints,
                "seconds": {k: round(v, 1) for k, v in run.moments.items()},
                "load": os.getloadavg(),
            }
        )
    )
