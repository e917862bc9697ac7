"""Branch a stored cell from one of its round checkpoints: run its remaining rounds again, on another
device or with changed settings, and probe the shared model as it goes (issue 41: why Table 2's
Per-FedAvg cell breaks between rounds 480 and 490 after 48 evaluations at 86-87%).

A branch is an experiment, not a result: it loads the checkpoint's state whatever the code version or
execution path that wrote it (both are printed), so its rows are never stored or published. From the
checkpoint's round r it runs rounds r+1 .. `--until` through the engine's own round loop (the same
training and evaluation as `pflbench run`), with `--set` changes applied to the cell (hyperparameters
as `hp.beta=5e-4`, or `eval_every=5`, `finetune_epochs=0`). Without `--set`, on the device and code
that wrote the checkpoint, a branch repeats the stored run's rounds bit for bit (what `--check`
tests against a stored cell's metrics).

Every `--probe-every` rounds, after aggregation, for the model the server holds (`global_state`; the
methods with one shared model) it records:
- its norm and how far it moved since the last probe;
- the shared model's mean train and test accuracy and loss over the clients (no adaptation);
- each client's gradient norm on its whole train split, and the eigenvalue largest in size of the
  Hessian of its train loss (power iteration on exact Hessian-vector products, `--power-steps`):
  one gradient step of size a on a loss whose curvature exceeds 2/a overshoots along that direction,
  which is what Per-FedAvg's personalization step (alpha = 0.01: 2/alpha = 200) does;
- for Per-FedAvg, the delivered models (`personalized()`: one step of alpha from the shared model):
  mean train and test accuracy and loss, and how far the step moved each client's model.
Rows are written to `--out` (JSON) after every probe, so a branch cut short keeps what it measured.

    python benchmarks/analysis/branch.py CHECKPOINT --config STORE/HASH/config.json --out OUT.json
        [--until 600] [--set hp.beta=5e-4 ...] [--device cuda] [--tf32 on|off] [--probe-every 2]
        [--power-steps 15] [--deadline SECONDS] [--check STORE/HASH]
    python benchmarks/analysis/branch.py --config ... --out OUT.json --snapshots SNAPSHOT...   # probes only
    python benchmarks/analysis/branch.py --write-snapshots CHECKPOINT... --out FOLDER
    python benchmarks/analysis/branch.py CHECKPOINT --write-light OUT   # without Per-FedAvg's cache
A snapshot (`write_snapshot`) keeps only the shared model of a checkpoint, so that many of a run's
checkpoints travel to a GPU where whole ones weigh too much.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import yaml


class Stop(Exception):
    """The branch ran out of its wall-time deadline."""


def branch_cell(config: dict, changes: list[str]):
    """The stored cell (config.json's "cell") with `changes` ("key=value", dotted into dict fields) applied."""
    from pflbench.config import CellConfig
    from pflbench.simulator.resolve import resolve

    values = json.loads(json.dumps(config["cell"]))
    for change in changes:
        key, _, text = change.partition("=")
        target, *path = key.split(".")
        value = yaml.safe_load(text)
        if path:
            node = values.setdefault(target, {})
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = value
        else:
            values[target] = value
    return resolve(CellConfig(**values))


def federation_of(cell, execution, data_root=None):
    """The cell's Federation and algorithm, as `pflbench.simulator.rounds.run_cell` builds them (call it inside
    `cell_global_rng`, as run_cell does)."""
    from pflbench.simulator.rounds import build_cell, prepare_cell

    return build_cell(cell, *prepare_cell(cell, data_root), execution)


def flat(state: dict, names) -> torch.Tensor:
    """The named tensors of each row, flattened side by side: [K, P]."""
    return torch.cat([state[n].flatten(1) for n in names], 1)


class Probe:
    """The probes of the module doc, run by the round loop through the checkpointer's two calls."""

    def __init__(self, checkpoint: Path, every: int, power_steps: int, out: Path, deadline: float, meta: dict):
        self.checkpoint, self.every, self.power_steps, self.out = checkpoint, every, power_steps, out
        self.deadline, self.meta, self.rows, self.evals = deadline, meta, [], []
        self.started, self.previous = time.perf_counter(), None

    # -- the round loop's checkpointer calls --
    def resume(self, fed, algorithm, provenance=None):
        from pflbench.storage.checkpoint import Resumed, load_federation_state, read_checkpoint, set_random_state

        header, payload = read_checkpoint(self.checkpoint, fed.device)
        algorithm.load_state_dict(payload["algorithm"])
        load_federation_state(fed, payload["federation"])
        set_random_state(payload["random"])
        self.meta["checkpoint"] = {k: header.get(k) for k in ("round", "hash", "code", "execution", "written_at")}
        self.previous = self._shared(algorithm)
        self.probe(header["round"], fed, algorithm)
        return Resumed(header["round"], float(payload["elapsed"]), payload["loop"])

    def after_round(self, rnd, fed, algorithm, loop, elapsed) -> None:
        if rnd % self.every == 0 or rnd == fed.cell.rounds:
            self.probe(rnd, fed, algorithm)
        if time.perf_counter() - self.started > self.deadline:
            raise Stop(f"deadline of {self.deadline:.0f} s reached after round {rnd}")

    def summary(self) -> dict:
        return {}

    def on_round(self, info: dict) -> None:
        rows = pd.DataFrame(info["client_rows"])
        if len(rows):
            means = rows[[c for c in ("accuracy", "loss", "accuracy_adapted", "loss_adapted") if c in rows]].mean()
            self.evals.append({"round": info["round"], **{k: float(v) for k, v in means.items()}})
            self.write()

    # -- the probes --
    @staticmethod
    def _shared(algorithm) -> dict | None:
        from pflbench.simulator.cell_method import unwrapped

        state = getattr(unwrapped(algorithm), "global_state", None)  # the method's, under a privacy cell's wrapper
        return None if state is None else {n: t.detach().clone() for n, t in state.items()}

    def probe(self, rnd: int, fed, algorithm) -> None:
        start = time.perf_counter()
        shared = self._shared(algorithm)
        if shared is None:
            return
        names = fed.model.param_names
        n = fed.num_clients
        w = flat(shared, names)
        row = {"round": rnd, "norm": float(w.norm()),
               "moved": float((w - flat(self.previous, names)).norm()) if self.previous is not None else None}
        self.previous = shared
        expanded = {k: t.expand(n, *t.shape[1:]).clone() for k, t in shared.items()}
        for split in ("train", "test"):
            accuracy, loss = fed.evaluate(expanded, split)
            row[f"shared_{split}_accuracy"], row[f"shared_{split}_loss"] = float(accuracy.mean()), float(loss.mean())
        with _full_precision():
            grad_norm, sharpness = curvature(fed, expanded, self.power_steps)
        row["grad_norm"] = grad_norm.tolist()
        row["sharpness"] = sharpness.tolist()
        from pflbench.simulator.cell_method import unwrapped

        if type(unwrapped(algorithm)).__name__ == "PerFedAvg":
            delivered = algorithm.personalized()
            row["step_norm"] = (flat(delivered, names) - flat(expanded, names)).norm(dim=1).tolist()
            for split in ("train", "test"):
                accuracy, loss = fed.evaluate(delivered, split)
                row[f"delivered_{split}_accuracy"] = float(accuracy.mean())
                row[f"delivered_{split}_loss"] = float(loss.mean())
        row["seconds"] = time.perf_counter() - start
        self.rows.append(row)
        self.write()
        print(f"round {rnd}: shared test {row['shared_test_accuracy']:.4f} / {row['shared_test_loss']:.3f}, "
              f"max sharpness {max(row['sharpness']):.1f}, moved {row['moved']}", flush=True)

    def write(self) -> None:
        self.out.write_text(json.dumps({**self.meta, "wall_seconds": time.perf_counter() - self.started,
                                        "probes": self.rows, "evaluations": self.evals}, indent=1))


class _full_precision:
    """float32 matmuls and convolutions (no TF32) inside the block, the caller's settings after it."""

    def __enter__(self):
        self.before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.before


def curvature(fed, state: dict, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each client's gradient norm on its whole train split and the eigenvalue largest in size of its
    train loss's Hessian at `state` ([N, ...] rows), by `steps` power iterations on exact
    Hessian-vector products (double backward; a ReLU's second derivative is 0, as autograd takes it)."""
    from pflbench.kit.steps import batch_losses, per_client

    names = fed.model.param_names
    length = min(len(fed.splits["train"][c]) for c in range(fed.num_clients))
    ids = torch.stack([fed.splits["train"][c][:length] for c in range(fed.num_clients)])
    everyone = torch.arange(fed.num_clients, device=fed.device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    start = torch.randn((fed.num_clients, sum(state[n][0].numel() for n in names)), generator=generator)

    def probe(clients, params, buffers, rows, v):
        leaves = {n: t.detach().requires_grad_(True) for n, t in params.items()}
        losses = batch_losses(fed, leaves, {k: t.clone() for k, t in buffers.items()}, rows)
        grads = torch.autograd.grad(losses.sum(), list(leaves.values()), create_graph=True)
        g = torch.cat([t.flatten(1) for t in grads], 1)
        v = v / v.norm(dim=1, keepdim=True)
        eigen = torch.zeros(len(v), device=v.device)
        for _ in range(max(1, steps)):
            hv = torch.autograd.grad((g * v).sum(), list(leaves.values()), retain_graph=True)
            hv = torch.cat([t.flatten(1) for t in hv], 1)
            eigen = (hv * v).sum(1)
            v = hv / hv.norm(dim=1, keepdim=True).clamp_min(1e-30)
        return g.detach().norm(dim=1), eigen.detach()

    params = {n: state[n] for n in names}
    buffers = {n: state[n] for n in fed.model.buffer_names}
    return per_client(fed, everyone, probe, params, buffers, ids, start.to(fed.device))


# ---- snapshots: the shared model alone, to probe a run's trajectory where whole checkpoints weigh too much ----

SNAPSHOT_ATTRIBUTES = ("global_state", "_version")  # the shared model; Per-FedAvg's cache key


def write_snapshot(checkpoint: Path, folder: Path) -> Path:
    """`folder/snapshot-<round>.pt`: the checkpoint's round and the algorithm attributes the probes
    read (`SNAPSHOT_ATTRIBUTES`; about 0.35 MB for Table 2's CNN where its checkpoint is 7.3 MB)."""
    from pflbench.storage.checkpoint import read_checkpoint

    header, payload = read_checkpoint(checkpoint)
    attributes = payload["algorithm"]["attributes"]
    path = Path(folder) / f"snapshot-{header['round']:04d}.pt"
    torch.save({"round": header["round"], "hash": header["hash"],
                "attributes": {k: attributes[k] for k in SNAPSHOT_ATTRIBUTES if k in attributes}}, path)
    return path


def write_light(checkpoint: Path, out: Path) -> None:
    """The checkpoint without Per-FedAvg's cache of delivered models (`_cached`: recomputed from the
    shared model at the next evaluation, keyed by the model's version), half its size, same header."""
    from pflbench.storage.checkpoint import decode_checkpoint, encode_checkpoint

    header, payload = decode_checkpoint(Path(checkpoint).read_bytes())
    header = {k: v for k, v in header.items() if k not in ("header_bytes", "bytes", "sha256", "format")}
    if "_cached" in payload["algorithm"]["attributes"]:
        payload["algorithm"]["attributes"]["_cached"] = None
    Path(out).write_bytes(encode_checkpoint(header, payload))


def probe_snapshots(paths: list[Path], fed, algorithm, probe: Probe) -> None:
    """Probe each snapshot's shared model at its round, in round order (no round is run)."""
    from pflbench.simulator.cell_method import unwrapped

    algorithm.setup()
    method = unwrapped(algorithm)  # the attributes are the method's, under a privacy cell's wrapper
    for path in sorted(paths):
        snapshot = torch.load(path, map_location=fed.device, weights_only=False)
        for name, value in snapshot["attributes"].items():
            setattr(method, name, value)
        probe.probe(snapshot["round"], fed, algorithm)


def check_against(store_cell: Path, evals: list[dict]) -> list[str]:
    """Where the branch's evaluations differ from the stored cell's (mean accuracy per round)."""
    stored = pd.read_parquet(store_cell / "metrics.parquet").groupby("round")["accuracy"].mean()
    return [f"round {e['round']}: branch {e['accuracy']!r}, stored {float(stored[e['round']])!r}"
            for e in evals if e["round"] in stored.index and e["accuracy"] != float(stored[e["round"]])]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, nargs="?", help="the round checkpoint to branch from")
    parser.add_argument("--snapshots", type=Path, nargs="+", default=None,
                        help="probe these snapshots (write_snapshot's files) instead of running rounds")
    parser.add_argument("--write-snapshots", type=Path, nargs="+", default=None, metavar="CHECKPOINT",
                        help="write a snapshot of each checkpoint into --out (a folder), and nothing else")
    parser.add_argument("--write-light", type=Path, default=None, metavar="OUT",
                        help="write the checkpoint without Per-FedAvg's cache to OUT, and nothing else")
    parser.add_argument("--config", type=Path, help="the stored cell's config.json")
    parser.add_argument("--out", type=Path, help="the JSON written (a folder with --write-snapshots)")
    parser.add_argument("--until", type=int, default=None, help="the last round to run (default: the cell's)")
    parser.add_argument("--set", dest="changes", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tf32", choices=("on", "off"), default=None, help="CUDA: TF32 matmuls/convolutions")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--probe-every", type=int, default=2)
    parser.add_argument("--power-steps", type=int, default=15)
    parser.add_argument("--deadline", type=float, default=math.inf, help="stop after this many seconds")
    parser.add_argument("--data-root", default=None, help="pflbench's data folder (default: as `pflbench run`)")
    parser.add_argument("--check", type=Path, default=None, help="a stored cell folder: compare evaluations")
    args = parser.parse_args(argv)
    if args.write_snapshots:
        if args.out is None:
            parser.error("--write-snapshots needs --out FOLDER")
        args.out.mkdir(parents=True, exist_ok=True)
        for checkpoint in args.write_snapshots:
            print(write_snapshot(checkpoint, args.out))
        return 0
    if args.write_light:
        write_light(args.checkpoint, args.write_light)
        return 0
    if args.config is None or args.out is None or (args.checkpoint is None) == (args.snapshots is None):
        parser.error("give --config, --out and either a checkpoint or --snapshots")

    from pflbench.algorithm import get_algorithm
    from pflbench.storage.code_version import code_version
    from pflbench.simulator.execution import ExecutionOptions
    from pflbench.simulator.rounds import cell_global_rng, run_rounds

    torch.set_num_threads(args.threads)
    if args.tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
    cell = branch_cell(json.loads(args.config.read_text()), args.changes)
    algorithm_cls = get_algorithm(cell.algorithm)
    meta = {"changes": args.changes, "device": args.device, "tf32": args.tf32, "torch": torch.__version__,
            "python": platform.python_version(), "code": code_version(algorithm_cls),
            "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None}
    probe = Probe(args.checkpoint, args.probe_every, args.power_steps, args.out, args.deadline, meta)
    with cell_global_rng(cell.seed, torch.device(args.device)):
        fed, algorithm = federation_of(cell, ExecutionOptions(device=args.device, threads=args.threads), args.data_root)
        if args.snapshots:
            probe_snapshots(args.snapshots, fed, algorithm, probe)
            meta["ended"] = f"probed {len(args.snapshots)} snapshots"
            probe.write()
            return 0
        try:
            run_rounds(fed, algorithm, on_round=probe.on_round, checkpointer=probe, stop_after=args.until)
            meta["ended"] = "ran to the end"
        except Stop as stop:
            meta["ended"] = str(stop)
    if args.check is not None:
        meta["differences"] = check_against(args.check, probe.evals)
        print(f"{len(meta['differences'])} evaluations differ from {args.check}: {meta['differences'][:3]}")
    probe.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
