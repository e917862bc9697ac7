"""The figure of docs/algorithms/perfedavg.md ("Table 2's break"): from the JSON files of
benchmarks/analysis/perfedavg_break.sh (and the two branches to round 590), the shared model's and the
delivered models' mean test accuracy and the largest Hessian eigenvalue over the clients, by round.

    python benchmarks/analysis/perfedavg_break_figure.py docs/algorithms/perfedavg-break OUT.png
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RUNS = [("trajectory.json", "the cell (CPU run, probed on the GPU)", "black", "-"),
        ("branch-same.json", "branch at 475, as stored (GPU, float32)", "tab:red", "--"),
        ("to600-beta-half.json", "branch at 475, beta 5e-4", "tab:blue", "-"),
        ("to600-alpha-half.json", "branch at 475, alpha 0.005", "tab:green", "-")]


def main(folder: Path, out: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    for name, label, color, style in RUNS:
        probes = json.loads((folder / name).read_text())["probes"]
        rounds = [p["round"] for p in probes]
        axes[0].plot(rounds, [100 * p["delivered_test_accuracy"] for p in probes], style, color=color, label=label)
        axes[1].plot(rounds, [100 * p["shared_test_accuracy"] for p in probes], style, color=color)
        axes[2].plot(rounds, [max(p["sharpness"]) for p in probes], style, color=color)
    axes[2].axhline(200, color="grey", lw=0.8)
    axes[2].text(401, 210, "2 / alpha (alpha 0.01)", color="grey", fontsize=8)
    axes[2].axhline(400, color="tab:green", lw=0.8, ls=":")
    axes[2].text(401, 410, "2 / alpha (alpha 0.005)", color="tab:green", fontsize=8)
    axes[2].set_ylim(0, 900)
    titles = ["delivered models (one step of alpha): test accuracy %", "shared model: test accuracy %",
              "largest Hessian eigenvalue over the clients"]
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle("Table 2, Fashion-MNIST, 10 clients, Per-FedAvg (f7af474989db): rounds 400-600", fontsize=11)
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
