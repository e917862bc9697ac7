"""Each row's local work, counted by running it: what a round and an evaluation of a paper-scale cell ask
of the model, per client, in samples through a training step and samples through an evaluation.

The projection of `make reproduce-table1` / `-table2` (paper_slice.py) used to charge every row FedAvg's
epochs; the rows differ (Per-FedAvg draws two or three batches a step, pFedMe makes K inner steps a batch,
FedRep trains head and body epochs, pFedHN a fixed number of inner steps, FedFomo scores downloaded
models). Rather than a formula per row, which drifts from the code, this counts: it runs each row's
first round and first evaluation with the cell's own settings (samples per client, epochs, batch size,
hyperparameters, the protocol's adaptation; its epochs as below) on the engine's loop path, and a forward pre-hook on the
clients' model counts every sample through it, as

    grad      samples through a forward with autograd recording (a training step: forward and backward)
    forward   samples through a forward without it (scoring: evaluation, FedFomo's candidates)

The model is swapped for the small `mlp` (the counts do not depend on the architecture, only on the
plans; the swap keeps the count to seconds a row). Per row and setting the counts come from 2 clients, both
joining, on Fashion-MNIST with the setting's samples per client, and are divided per client: a round's
training per joining client and an evaluation's work per client (a 100-client cell joins 10 a round and
adapts all 100 at every evaluation). That division assumes a client's work does not depend on how many
others there are; FedFomo's candidates (at most `M`, capped by the clients seen) are the exception, noted
in the output. The epochs: every row's work is affine in the local epochs (a round) and in the
adaptation epochs (an evaluation), so each setting is run at 1 and 2 epochs and the counts are kept as
`[a, b]`, a + b x epochs (`--check` runs 3 epochs too and compares). Not counted: the hypernetworks of pFedHN and pFedLA (small beside the CNN's batches) and
Per-FedAvg's Hessian-vector products (its `hf` variant; the default `fo` has none).

    python benchmarks/gpu/step_count.py --json benchmarks/gpu/step_counts.json   # Tables 1 and 2, a few minutes
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SPECS = ("table1", "table2")
CLIENTS = 2  # clients of a counting run, all joining (the counts are per client)


class Counter:
    """Samples through the clients' model, by kind, while `active`."""

    def __init__(self) -> None:
        self.grad = 0
        self.forward = 0

    def hook(self, module, args) -> None:
        import torch
        from torch._C._functorch import is_batchedtensor

        x = args[0]
        if is_batchedtensor(x):  # vmap hides the clients' dimension: the count would be short
            raise RuntimeError("step_count needs the loop path (client_batching off)")
        if torch.is_grad_enabled():
            self.grad += x.shape[0]
        else:
            self.forward += x.shape[0]

    def snapshot(self) -> tuple[int, int]:
        return self.grad, self.forward


def count_run(cell, epochs: int, data_root=None) -> dict:
    """Per client, one run of two rounds evaluated at the second, `epochs` local and adaptation epochs:
    after round 1, one round's training; after round 2, two and an evaluation."""
    from pflbench.simulator import training
    from pflbench.simulator.execution import ExecutionOptions
    from pflbench.simulator.rounds import run_cell

    counter, after = Counter(), []
    original = training.ClientModel.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.template.register_forward_pre_hook(counter.hook)

    training.ClientModel.__init__ = init
    update = {"rounds": 2, "eval_every": 2, "local_epochs": epochs, "finetune_epochs": epochs}
    try:
        run_cell(cell.model_copy(update=update), data_root=data_root, on_round=lambda info: after.append(counter.snapshot()),
                 execution=ExecutionOptions(device="cpu", client_batching="off", compiled_training="off",
                                            client_threads="off"))
    finally:
        training.ClientModel.__init__ = original
    (grad1, forward1), (grad2, forward2) = after
    clients = cell.clients
    return {"round_grad": grad1 / clients, "round_forward": forward1 / clients,
            "eval_grad": (grad2 - 2 * grad1) / clients, "eval_forward": (forward2 - 2 * forward1) / clients}


def count_row(cell, data_root=None) -> dict:
    """Each count as `[a, b]`: a + b x epochs (local epochs for a round's counts, adaptation epochs for
    an evaluation's), from runs at 1 and 2 epochs. Every row's work is affine in its epochs (epochs of
    batches, or a fixed number of steps or of its own epochs, as FedRep's and pFedHN's); `check`
    runs a third point to see it."""
    one, two = count_run(cell, 1, data_root), count_run(cell, 2, data_root)
    return {name: [2 * one[name] - two[name], two[name] - one[name]] for name in one}


def at_epochs(count: list[float], epochs: int) -> float:
    return count[0] + count[1] * epochs


def counting_cell(cell):
    """`cell` reduced to what counting needs: Fashion-MNIST, CLIENTS clients all joining, its samples per
    client, its epochs and hyperparameters; the small model."""
    from pflbench.simulator.resolve import resolve

    params = dict(cell.partition_params)
    if cell.partition == "pathological":
        params["classes_per_client"] = 4
    if cell.partition == "dominant":
        params["dominant_classes"] = 2
    return resolve(cell.model_copy(update={"dataset": "fmnist", "dataset_options": {}, "clients": CLIENTS,
                                           "participation": 1.0, "partition_params": params, "model": "mlp",
                                           "seed": 0}))


def setting_key(cell) -> str:
    """What the counts depend on besides the epochs: the row, its hyperparameters, the client's data."""
    hp = json.dumps(cell.hp, sort_keys=True, default=str)
    return (f"{cell.algorithm}|n={cell.partition_params.get('samples_per_client')}|B={cell.batch_size}"
            f"|val={cell.val_fraction}|{cell.partition}|hp={hp}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", default=",".join(SPECS))
    parser.add_argument("--algorithms", default=None, help="comma-separated rows (default: every row)")
    parser.add_argument("--check", action="store_true", help="also run 3 epochs and compare with the line")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from pflbench.run.spec import load_spec

    counts: dict = {}
    started = time.time()
    for spec in args.specs.split(","):
        for cell in load_spec(REPO / "benchmarks" / f"{spec}.yaml", sets={"resources.gpus": 0}).cells:
            if args.algorithms and cell.algorithm not in args.algorithms.split(","):
                continue
            key = setting_key(cell)
            if key not in counts:
                began = time.time()
                counts[key] = {**count_row(counting_cell(cell)), "algorithm": cell.algorithm,
                               "seconds": round(time.time() - began, 1)}
                if args.check:
                    three = count_run(counting_cell(cell), 3)
                    off = {n: three[n] - at_epochs(counts[key][n], 3) for n in three}
                    counts[key]["check_3_epochs_off_by"] = off
                    if any(abs(v) > 1e-9 for v in off.values()):
                        print(f"not affine in the epochs: {key}: {off}", file=sys.stderr)
                print(f"{key}: {counts[key]}", flush=True)
    result = {"counts": counts, "seconds": round(time.time() - started, 1),
              "note": "per client: round_* per joining client and round, eval_* per client and evaluation "
                      "(benchmarks/gpu/step_count.py); FedFomo's candidate scoring counted with 2 clients"}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
