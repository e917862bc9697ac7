"""What FedFomo's clients took from each other in a stored cell: the figures behind the reproduction write-ups (docs/reproduction/).

For each FedFomo cell folder given (a results store's `<hash>/`, published or not), over the stored
rounds (every evaluation round) of its `weights` artifact ([N, N], row i: the normalized weights client
i gave the models it downloaded that round; its own model's weight is not in it):
- how many clients take a step towards other clients' models (a row with a positive entry) and how
  many positive weights there are, on average per stored round;
- the mean row sum (0: the client keeps its own model; 1: it moves all the way to the weighted
  combination of what it downloaded) and the largest single weight;
- the entries of the accumulated `affinity` matrix that are positive at the last stored round;
- at the last stored round, Pearson's r between a weight and the number of main classes the two
  clients share (alpha.py's definition: classes above the uniform share of a client's train split).

    python benchmarks/analysis/fedfomo.py results/published/table2-full/37a15f562e87 [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from alpha import shared_classes  # noqa: E402  (this folder's sibling script)

from pflbench.reports.cells import read_artifacts  # noqa: E402


def load(folder: Path, name: str) -> dict[int, np.ndarray]:
    """{round: array} of one stored artifact of the cell."""
    return read_artifacts(folder).get(name, {})


def describe(folder: Path) -> dict:
    weights, affinity = load(folder, "weights"), load(folder, "affinity")
    if not weights:
        raise SystemExit(f"{folder}: no FedFomo weights among its artifacts")
    stacked = np.stack(list(weights.values()))
    last = list(weights)[-1]
    n = stacked.shape[1]
    off = ~np.eye(n, dtype=bool)
    shared = shared_classes(folder)[off]
    final = weights[last][off]
    return {
        "cell": folder.name,
        "stored_rounds": len(weights),
        "clients_stepping_per_round": float((stacked > 0).any(axis=2).sum(axis=1).mean()),
        "positive_weights_per_round": float((stacked > 0).sum(axis=(1, 2)).mean()),
        "pairs": int(off.sum()),
        "mean_row_sum": float(stacked.sum(axis=2).mean()),
        "max_weight": float(stacked.max()),
        "last_round": last,
        "positive_affinity_last": int((affinity[last][off] > 0).sum()) if last in affinity else None,
        "r_weight_shared_last": float(np.corrcoef(final, shared)[0, 1]) if final.std() and shared.std() else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="+", type=Path, help="cell folders (a store's <hash>/)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    found = [describe(folder) for folder in args.cells]
    for d in found:
        print(f"{d['cell']}: {d['stored_rounds']} stored rounds; per round {d['clients_stepping_per_round']:.1f} "
              f"clients step towards others, {d['positive_weights_per_round']:.1f} positive weights of "
              f"{d['pairs']}; mean row sum {d['mean_row_sum']:.2f}, largest weight {d['max_weight']:.2f}; "
              f"round {d['last_round']}: {d['positive_affinity_last']} positive affinities, r(weight, shared "
              f"main classes) {d['r_weight_shared_last'] if d['r_weight_shared_last'] is None else round(d['r_weight_shared_last'], 2)}")
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
