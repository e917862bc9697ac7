"""What pFedLA's aggregation weights did in a stored cell: the figures behind the reproduction write-ups (docs/reproduction/).

For each pFedLA / HeurpFedLA cell folder given (a results store's `<hash>/`, published or not):
- the mean self-weight alpha[i, l, i] per layer at chosen rounds;
- the fraction of alpha entries that are exactly 0 or exactly 1 (a ReLU head's weight at 0 gets no
  gradient again) at chosen rounds;
- the first round from which alpha is bit-identical to the last stored round (frozen weights);
- the mean weight one client gives another by the number of main classes the two share in their
  train splits (0, 1, 2, ...), and Pearson's r between weight and shared classes over the ordered
  pairs (the paper's Figures 5-6: similar clients weigh more), at the last round, per layer. A
  client's main classes are those holding more than the uniform share (1/C) of its train split: the
  classes it has at all under `pathological` (k classes, 1/k each), its dominant classes under
  `dominant` (Table 2: two classes at 30% each, the other eight at 5%).

    python benchmarks/analysis/alpha.py results/published/table1-full/3cc0b2ea0143 [--rounds 10,100,600]
        [--shared-rounds 10] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pflbench.data.locations import DatasetNotFoundError
from pflbench.reports.cells import read_artifacts


def load_alphas(folder: Path) -> tuple[dict[int, np.ndarray], list[str]]:
    """{round: alpha [N, layers, N]} and the layer names, from the cell's stored artifacts."""
    artifacts = read_artifacts(folder)
    layer_names = next(iter(artifacts.get("alpha_layers", {}).values()), [])
    return artifacts.get("alpha", {}), [str(x) for x in layer_names]


def exact_share(alpha: np.ndarray) -> float:
    """The fraction of alpha's entries that are exactly 0 or exactly 1."""
    return float(((alpha == 0) | (alpha == 1)).mean())


def shared_classes(folder: Path) -> np.ndarray:
    """[N, N] main classes (module doc) two clients' train splits have in common (the cell's own partition)."""
    from pflbench.config import CellConfig
    from pflbench.simulator.rounds import prepare_cell

    cell = CellConfig.stored(json.loads((folder / "config.json").read_text())["cell"])
    dataset, splits = prepare_cell(cell)
    labels = dataset.labels.numpy()
    sets = []
    for train in splits.train:
        counts = np.bincount(labels[np.asarray(train)], minlength=dataset.num_classes)
        sets.append(set(np.flatnonzero(counts > counts.sum() / dataset.num_classes).tolist()))
    return np.array([[len(a & b) for b in sets] for a in sets])


def frozen_since(alphas: dict[int, np.ndarray]) -> int | None:
    """The first stored round from which every later alpha equals the last one bit for bit."""
    rounds = list(alphas)
    last = alphas[rounds[-1]]
    since = None
    for rnd in reversed(rounds):
        if np.array_equal(alphas[rnd], last):
            since = rnd
        else:
            break
    return since


def by_shared_classes(alpha: np.ndarray, layers: list[str], shared: np.ndarray) -> dict:
    """Per layer: the mean weight a client gives another by the main classes the two share, and
    Pearson's r between weight and shared classes over the ordered pairs."""
    n = alpha.shape[0]
    off = ~np.eye(n, dtype=bool)
    by_layer = {}
    for l, name in enumerate(layers):
        weights = alpha[:, l, :][off]
        common = shared[off]
        means = {int(k): round(float(weights[common == k].mean()), 3) for k in np.unique(common)}
        r = float(np.corrcoef(weights, common)[0, 1]) if weights.std() > 0 and common.std() > 0 else float("nan")
        by_layer[name] = {"mean_weight_by_shared_classes": means, "pearson_r": round(r, 2)}
    return by_layer


def describe(folder: Path, rounds: list[int] | None, shared_rounds: list[int] | None = None) -> dict:
    alphas, layers = load_alphas(folder)
    if not alphas:
        raise SystemExit(f"alpha.py: {folder} has no stored alpha (not a pFedLA cell?)")
    n = next(iter(alphas.values())).shape[0]
    eye = np.arange(n)
    chosen = [r for r in (rounds or [min(alphas), max(alphas)]) if r in alphas]
    out: dict = {"cell": folder.name, "layers": layers, "rounds_stored": [min(alphas), max(alphas)],
                 "frozen_since": frozen_since(alphas), "self_weight": {}, "exact_0_or_1": {}}
    for rnd in chosen:
        a = alphas[rnd]
        out["self_weight"][rnd] = [round(float(a[eye, l, eye].mean()), 3) for l in range(a.shape[1])]
        out["exact_0_or_1"][rnd] = round(exact_share(a), 3)
    shared = shared_classes(folder)
    out["by_shared_classes_last_round"] = by_shared_classes(alphas[max(alphas)], layers, shared)
    out["by_shared_classes"] = {rnd: by_shared_classes(alphas[rnd], layers, shared)
                                for rnd in (shared_rounds or []) if rnd in alphas}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="+", help="cell folders (a store's <hash>/)")
    parser.add_argument("--rounds", default=None, help="comma-separated rounds (default: the first and last stored)")
    parser.add_argument("--shared-rounds", default=None,
                        help="comma-separated rounds at which to also show the weights by shared classes")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rounds = [int(r) for r in args.rounds.split(",")] if args.rounds else None
    shared_rounds = [int(r) for r in args.shared_rounds.split(",")] if args.shared_rounds else None
    try:
        results = [describe(Path(folder), rounds, shared_rounds) for folder in args.cells]
    except DatasetNotFoundError as error:  # the split is rebuilt from the data: say where it was looked for
        print(f"alpha.py: {error}", file=sys.stderr)
        return 2
    for r in results:
        print(f"{r['cell']}: layers {', '.join(r['layers'])}; alpha frozen (bit-identical to the last) from round "
              f"{r['frozen_since']}")
        for rnd, weights in r["self_weight"].items():
            print(f"  round {rnd}: mean self-weight per layer {weights}; entries exactly 0 or 1: "
                  f"{100 * r['exact_0_or_1'][rnd]:.1f}%")
        for when, by_layer in [*((f"round {rnd}", b) for rnd, b in r["by_shared_classes"].items()),
                               ("last round", r["by_shared_classes_last_round"])]:
            for layer, facts in by_layer.items():
                print(f"  {when}, {layer}: mean weight to a client sharing k classes "
                      f"{facts['mean_weight_by_shared_classes']}, r = {facts['pearson_r']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
