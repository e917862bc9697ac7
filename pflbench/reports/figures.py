"""The report's figures, drawn with matplotlib's object API (no pyplot state) and written as PNG and
SVG. Every function takes plain arrays/frames, writes `<stem>.png` and `<stem>.svg`, and returns the
data it drew, so tests (and readers) can check the picture against its input.

pFedLA's figures read the aggregation weights α that pFedLA stores per eval round: α[i, l, j] is the
weight client i gives to client j's layer l (each row i, l sums to 1).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from collections.abc import Iterable
from typing import TYPE_CHECKING
from collections.abc import Sequence

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = ("png", "svg")


def new_figure(width: float = 6.4, height: float = 4.0) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def save(figure: Figure, stem: str | Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        figure.savefig(path, dpi=110)
        paths.append(path)
    return paths


def layer_index(layer: int | str | None, layer_names: Sequence[str] | None, num_layers: int) -> int:
    """A layer given by index (negative counts from the end), by name, or None (the last)."""
    if layer is None:
        return num_layers - 1
    if isinstance(layer, str) and not layer.lstrip("-").isdigit():
        names = [str(n) for n in (layer_names if layer_names is not None else [])]
        if layer not in names:
            raise ValueError(f"unknown layer {layer!r}; layers: {', '.join(names) or f'0..{num_layers - 1}'}")
        return names.index(layer)
    index = int(layer)
    if not -num_layers <= index < num_layers:
        raise ValueError(f"layer {index} out of range (0..{num_layers - 1})")
    return index % num_layers


def _names(layer_names: Sequence[str] | None, count: int) -> list[str]:
    return (
        [str(n) for n in layer_names]
        if layer_names is not None and len(layer_names) == count
        else [str(i) for i in range(count)]
    )


def alpha_heatmap(
    alpha: np.ndarray,
    stem: str | Path,
    *,
    layer: int | str | None = None,
    layer_names: Sequence[str] | None = None,
    title: str = "",
    formats: Sequence[str] = FORMATS,
) -> np.ndarray:
    """Figure 6: the clients x clients aggregation weights of one layer, α[:, layer, :]."""
    alpha = np.asarray(alpha, dtype=float)
    index = layer_index(layer, layer_names, alpha.shape[1])
    matrix = alpha[:, index, :]
    n = matrix.shape[0]
    figure = new_figure(min(2.5 + 0.45 * n, 12), min(2.0 + 0.4 * n, 11))
    axes = figure.add_subplot()
    image = axes.imshow(matrix, cmap="viridis", vmin=0, vmax=max(float(matrix.max()), 1e-12))
    figure.colorbar(image, ax=axes, label="aggregation weight")
    axes.set_xlabel("source client j")
    axes.set_ylabel("target client i")
    if n <= 20:
        axes.set_xticks(range(n))
        axes.set_yticks(range(n))
        if n <= 10:
            for i in range(n):
                for j in range(n):
                    axes.text(
                        j,
                        i,
                        f"{matrix[i, j]:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if matrix[i, j] < 0.6 * matrix.max() else "black",
                    )
    axes.set_title(title or f"layer {_names(layer_names, alpha.shape[1])[index]}")
    save(figure, stem, formats)
    return matrix


def alpha_evolution(
    alphas: dict[int, np.ndarray],
    stem: str | Path,
    *,
    client: int = 0,
    layer_names: Sequence[str] | None = None,
    title: str = "",
    formats: Sequence[str] = FORMATS,
) -> np.ndarray:
    """Figure 5: a target client's weights on every source client over rounds, one panel per layer.
    Returns [rounds, layers, clients] = α_r[client, :, :] stacked over the sorted rounds."""
    rounds = sorted(alphas)
    data = np.stack([np.asarray(alphas[r], dtype=float)[client] for r in rounds])  # [R, L, N]
    _, layers, clients = data.shape
    names = _names(layer_names, layers)
    cols = min(layers, 3)
    panel_rows = -(-layers // cols)
    figure = new_figure(3.8 * cols + 1.8, 2.9 * panel_rows + 0.6)
    grid = figure.subplots(panel_rows, cols, squeeze=False, sharey=True)
    colors = _client_colors(clients)
    for l in range(panel_rows * cols):
        axes = grid[l // cols][l % cols]
        if l >= layers:
            axes.set_visible(False)
            continue
        for j in range(clients):
            axes.plot(
                rounds,
                data[:, l, j],
                color=colors[j],
                lw=2.2 if j == client else 1.0,
                label=f"client {j}" + (" (self)" if j == client else ""),
            )
        axes.set_title(names[l], fontsize=10)
        axes.set_xlabel("round")
        integer_rounds(axes)
        axes.grid(alpha=0.3)
        if l % cols == 0:
            axes.set_ylabel("weight")
    if clients <= 20:
        figure.legend(*grid[0][0].get_legend_handles_labels(), fontsize=8, loc="outside right upper")
    figure.suptitle(title or f"aggregation weights of client {client} over rounds")
    save(figure, stem, formats)
    return data


def client_layer_weights(
    alpha: np.ndarray,
    stem: str | Path,
    *,
    client: int = 0,
    layer_names: Sequence[str] | None = None,
    title: str = "",
    formats: Sequence[str] = FORMATS,
) -> np.ndarray:
    """Figure 7: one client's weights for every layer (rows) over source clients (columns): α[client]."""
    matrix = np.asarray(alpha, dtype=float)[client]  # [L, N]
    layers, clients = matrix.shape
    figure = new_figure(min(3 + 0.5 * clients, 12), 1.5 + 0.4 * layers)
    axes = figure.add_subplot()
    image = axes.imshow(matrix, cmap="viridis", aspect="auto", vmin=0)
    figure.colorbar(image, ax=axes, label="aggregation weight")
    axes.set_yticks(range(layers), _names(layer_names, layers), fontsize=8)
    if clients <= 30:
        axes.set_xticks(range(clients))
    axes.set_xlabel("source client j")
    axes.set_title(title or f"per-layer aggregation weights of client {client}")
    save(figure, stem, formats)
    return matrix


def _client_colors(count: int) -> np.ndarray:
    import matplotlib

    return matplotlib.colormaps["tab10" if count <= 10 else "tab20" if count <= 20 else "viridis"].resampled(count)(
        np.arange(count)
    )


# Families of methods, one learning-curve panel each: each algorithm's class declares its `family`
# (pflbench.algorithm.FAMILIES gives the panels' order; a family of a plugin's own comes after them,
# a method that declares none, or is not registered here, goes to "other").
BASELINES = "baselines"  # drawn in grey in every other panel, as context
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P")


def family_of(label: str) -> str:
    """The family of the algorithm a curve's label shows: its display name or name, possibly with a
    " (variant)" or " †" suffix."""
    from pflbench.reports.cells import display_names, family

    names = {}
    for name, shown in display_names().items():
        names[name.lower()] = names[shown.lower()] = name
    text = str(label).split(" †")[0].strip().lower()
    algorithm = names.get(text) or names.get(text.split(" (")[0].strip(), text.split(" (")[0].strip())
    return family(algorithm)


def family_order(families: Iterable[str]) -> list[str]:
    """`families` in panel order: pflbench.algorithm.FAMILIES first, others by name, "other" last."""
    from pflbench.algorithm import FAMILIES

    return sorted(set(families), key=lambda f: (f == "other", FAMILIES.index(f) if f in FAMILIES else len(FAMILIES), f))


def integer_rounds(axes: Axes) -> None:
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8, steps=[1, 2, 5, 10]))


def learning_curves(
    curves: pd.DataFrame,
    stem: str | Path,
    *,
    title: str = "",
    formats: Sequence[str] = FORMATS,
    ylabel: str = "mean client test accuracy (%)",
) -> pd.DataFrame:
    """Mean client test accuracy vs round, one line per `label`, a band of ± one std over seeds; one
    panel per family of methods (each class's `family`) with the baselines (Local, FedAvg) repeated in grey in
    every panel, so each line is told apart by color, dash and marker. Integer round ticks.
    `curves`: columns label, seed, round, accuracy (the mean over clients, in [0, 1]).
    Returns label, round, mean, std, seeds (accuracy in %)."""
    stats = (
        curves.assign(accuracy=curves["accuracy"] * 100)
        .groupby(["label", "round"], sort=False)["accuracy"]
        .agg(mean="mean", std="std", seeds="count")
        .reset_index()
    )
    stats["std"] = stats["std"].fillna(0.0)
    labels = list(dict.fromkeys(stats["label"]))
    families = family_order(family_of(l) for l in labels)
    baselines = [l for l in labels if family_of(l) == BASELINES]
    panels = [f for f in families if f != BASELINES] or families or ["all"]
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)

    def legend_lines(panel: str) -> int:  # the height of a panel's legend, in lines (as drawn below)
        names = [l for l in labels if panel == "all" or family_of(l) == panel or l in baselines]
        if max((len(n) for n in names), default=0) > 28:
            return sum(len(textwrap.wrap(n, 46)) or 1 for n in names)
        return -(-len(names) // 2)

    lines = max([legend_lines(p) for p in panels] or [1])
    figure = new_figure(6.0 * cols + 0.6, (3.8 + 0.2 * lines) * rows + 0.6)
    grid = figure.subplots(rows, cols, squeeze=False, sharey=True)
    ymin = max(0.0, float((stats["mean"] - stats["std"]).min()) - 3) if len(stats) else 0.0
    ymax = min(100.0, float((stats["mean"] + stats["std"]).max()) + 3) if len(stats) else 100.0
    for k, panel in enumerate(panels):
        axes = grid[k // cols][k % cols]
        members = [l for l in labels if family_of(l) == panel] if panel != "all" else labels
        if panel != BASELINES:
            for j, label in enumerate(baselines):  # context: the baselines in grey
                line = stats[stats["label"] == label]
                axes.plot(line["round"], line["mean"], color="0.55", ls=LINE_STYLES[j % 4], lw=1.2, label=label)
        colors = _client_colors(max(len(members), 1))
        for j, (color, label) in enumerate(zip(colors, members)):
            line = stats[stats["label"] == label]
            axes.plot(
                line["round"],
                line["mean"],
                color=color,
                ls=LINE_STYLES[j % 4],
                marker=MARKERS[j % 6],
                markersize=3.5,
                label=label,
                lw=1.6,
            )
            axes.fill_between(
                line["round"], line["mean"] - line["std"], line["mean"] + line["std"], color=color, alpha=0.15, lw=0
            )
        axes.set_title(panel if panel != "all" else "", fontsize=10)
        axes.set_xlabel("round")
        axes.set_ylim(ymin, max(ymax, ymin + 1))
        integer_rounds(axes)
        axes.grid(alpha=0.3)
        if k % cols == 0:
            axes.set_ylabel(ylabel)
        # below the panel, off the curves (a legend inside sat on the lines it names); long labels wrapped
        handles, names = axes.get_legend_handles_labels()
        wide = max((len(n) for n in names), default=0) > 28
        axes.legend(
            handles,
            wrapped_labels(names, 46) if wide else names,
            fontsize=8,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.16),
            ncols=1 if wide else 2,
            frameon=False,
        )
    for k in range(len(panels), rows * cols):
        grid[k // cols][k % cols].set_visible(False)
    figure.suptitle(title)
    save(figure, stem, formats)
    return stats


def worst_fraction_threshold(values: np.ndarray, fraction: float = 0.1) -> tuple[float, float]:
    """(the largest accuracy among the worst `fraction` of clients, their mean)."""
    ordered = np.sort(np.asarray(values, dtype=float))
    count = max(1, int(np.ceil(fraction * len(ordered))))
    return float(ordered[count - 1]), float(ordered[:count].mean())


CHAR_WIDTH, LINE_HEIGHT = 0.075, 0.18  # inches per character and per text line at fontsize 10


def wrapped_labels(labels: Sequence[str], width: int = 36) -> list[str]:
    """Labels broken into lines of at most `width` characters at spaces (a variant's label names its
    hyperparameters: "pFedLA (head_init=random, hn_lr=0.005, hn_optimizer=sgd)")."""
    return ["\n".join(textwrap.wrap(label, width, break_long_words=False)) or label for label in labels]


def client_accuracy_distribution(
    accuracies: dict[str, np.ndarray],
    stem: str | Path,
    *,
    title: str = "",
    formats: Sequence[str] = FORMATS,
    worst10: dict[str, float] | None = None,
) -> dict[str, dict]:
    """Per-client final accuracies (%) per label as a horizontal box + points, one row per label (top
    to bottom in the given order; long labels wrapped beside their row and the figure sized to them,
    so that any number of variants fits); the worst 10% of clients in red and their mean as a red bar.
    `worst10` ({label: value in [0, 1]}): the worst-10% number as the tables compute it (per seed, the
    mean of the worst ceil(10%) clients, then the mean over seeds), drawn as the bar instead of the
    pooled clients' worst 10%. Returns {label: {"values", "worst10_threshold", "worst10_mean"}}."""
    labels = list(accuracies)
    ticks = wrapped_labels(labels)
    label_width = max((len(line) for tick in ticks for line in tick.split("\n")), default=0) * CHAR_WIDTH
    width = 6.0 + label_width
    height = 1.6 + max(2.0, sum(max(0.42, (tick.count("\n") + 1) * LINE_HEIGHT + 0.1) for tick in ticks))
    figure = new_figure(width, height)
    axes = figure.add_subplot()
    out = {}
    rng = np.random.default_rng(0)
    for y, label in enumerate(labels):
        values = np.asarray(accuracies[label], dtype=float) * 100
        if values.size == 0:
            continue
        threshold, worst_mean = worst_fraction_threshold(values)
        if worst10 and worst10.get(label) is not None:
            worst_mean = float(worst10[label]) * 100
        out[label] = {"values": values, "worst10_threshold": threshold, "worst10_mean": worst_mean}
        axes.boxplot([values], positions=[y], widths=0.5, showfliers=False, orientation="horizontal")
        jitter = rng.uniform(-0.15, 0.15, values.size)
        worst = values <= threshold
        axes.scatter(values[~worst], y + jitter[~worst], s=8, color="tab:blue", alpha=0.6)
        axes.scatter(values[worst], y + jitter[worst], s=12, color="tab:red", label="worst 10%" if y == 0 else None)
        axes.vlines(
            worst_mean,
            y - 0.3,
            y + 0.3,
            color="tab:red",
            lw=2,
            label="worst-10% mean (as in the tables)" if y == 0 else None,  # type: ignore[arg-type]  # None: none (the stubs say str)
        )
    axes.set_yticks(range(len(labels)), ticks, fontsize=10)
    axes.set_ylim(len(labels) - 0.5, -0.5)  # the first label on top
    axes.grid(axis="x", alpha=0.3)
    if labels:
        axes.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False)
    axes.set_xlabel("client test accuracy (%)")
    title = title or "per-client final accuracy (red: worst 10% of clients and their mean)"
    figure.suptitle("\n".join(textwrap.wrap(title, max(30, int(width / (CHAR_WIDTH * 1.25))))), fontsize=11)
    save(figure, stem, formats)
    return out


def communication_vs_accuracy(
    points: pd.DataFrame,
    stem: str | Path,
    *,
    paper: pd.DataFrame | None = None,
    title: str = "",
    formats: Sequence[str] = FORMATS,
) -> pd.DataFrame:
    """MB per round (down + up) against final accuracy (%), one point per label with error bars over
    seeds. `points`: label, mb_per_round, accuracy (mean, %), accuracy_std. `paper` (optional): label,
    comm_mbytes, accuracy — e.g. pFedLA's Table 3 — drawn on a twin x axis, since the paper's
    MBytes are not per round. Returns the points drawn."""
    figure = new_figure(8.0, 4.6)
    axes = figure.add_subplot()
    silent = points[points["mb_per_round"] <= 0]  # no communication (Local): no place on a log axis
    points = points[points["mb_per_round"] > 0]
    if len(silent):
        axes.text(
            0.01,
            0.01,
            "no communication (not on the log axis): "
            + ", ".join(f"{r['label']} {r['accuracy']:.1f}%" for _, r in silent.iterrows()),
            transform=axes.transAxes,
            fontsize=8,
            color="0.3",
            va="bottom",
        )
    colors = _client_colors(max(len(points), 1))
    for k, (color, (_, point)) in enumerate(zip(colors, points.iterrows())):
        axes.errorbar(
            point["mb_per_round"],
            point["accuracy"],
            yerr=point.get("accuracy_std", 0) or 0,
            fmt=MARKERS[k % len(MARKERS)],
            color=color,
            label=point["label"],
            capsize=3,
        )
    axes.set_xlabel("MB per round (down + up, log scale)")
    if len(points) and (points["mb_per_round"] > 0).all():
        from matplotlib.ticker import FuncFormatter, LogLocator

        axes.set_xscale("log")
        axes.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axes.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axes.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        for _, point in points.iterrows():  # names beside the points: methods of equal cost overlap
            axes.annotate(
                str(point["label"]),
                (point["mb_per_round"], point["accuracy"]),
                fontsize=7,
                textcoords="offset points",
                xytext=(5, -3),
                color="0.25",
            )
    axes.grid(alpha=0.3, which="both")
    axes.set_ylabel("final accuracy (%)")
    if paper is not None and len(paper):
        twin = axes.twiny()
        twin.plot(paper["comm_mbytes"], paper["accuracy"], "k^--", lw=0.8, label="paper (Table 3)")
        if (paper["comm_mbytes"] > 0).all():
            twin.set_xscale("log")
        for _, row in paper.iterrows():
            twin.annotate(
                str(row["label"]),
                (row["comm_mbytes"], row["accuracy"]),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
            )
        twin.set_xlabel("paper: communication cost (MBytes, as printed)")
        twin.legend(fontsize=7, loc="lower right")
    if len(points):
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes.set_title(title)
    save(figure, stem, formats)
    return points


def label_distribution(
    counts: np.ndarray, stem: str | Path, formats: Sequence[str] = FORMATS, title: str = ""
) -> np.ndarray:
    """The partition's per-client label counts ([clients, classes]) as stacked bars, titled."""
    counts = np.asarray(counts)
    save(label_counts_figure(counts, title or "label distribution over clients"), stem, formats)
    return counts


def array_figure(
    array: np.ndarray, stem: str | Path, *, title: str = "", formats: Sequence[str] = FORMATS
) -> np.ndarray | None:
    """A generic artifact: a 1-D array as bars, a 2-D one as a heatmap, a 3-D one as heatmaps of its
    slices along the middle axis (at most 8). Returns what was drawn (None: not drawable)."""
    array = np.asarray(array)
    if not np.issubdtype(array.dtype, np.number) or array.ndim == 0 or array.ndim > 3 or array.size == 0:
        return None
    array = array.astype(float)
    if array.ndim == 1:
        figure = new_figure(6, 3)
        axes = figure.add_subplot()
        axes.bar(range(len(array)), array)
        drawn = array
    elif array.ndim == 2:
        figure = new_figure(6, 4.5)
        axes = figure.add_subplot()
        figure.colorbar(axes.imshow(array, aspect="auto", cmap="viridis"), ax=axes)
        drawn = array
    else:
        count = min(array.shape[1], 8)
        figure = new_figure(2.6 * min(count, 4) + 1, 2.6 * (-(-count // 4)))
        grid = figure.subplots(-(-count // 4), min(count, 4), squeeze=False)
        for k in range(count):
            axes = grid[k // 4][k % 4]
            axes.imshow(array[:, k, :], aspect="auto", cmap="viridis", vmin=array.min(), vmax=array.max())
            axes.set_title(f"[:, {k}, :]", fontsize=8)
        for k in range(count, len(grid) * len(grid[0])):
            grid[k // 4][k % 4].set_visible(False)
        drawn = array[:, :count, :]
    figure.suptitle(title, fontsize=9)
    save(figure, stem, formats)
    return drawn


def plot_label_counts(counts: np.ndarray, path: str | Path) -> None:
    """Stacked bar chart of samples per class for each client, written as PNG or SVG (by suffix)."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise ValueError(f"plot path must end in .png or .svg, got {path.name!r}")
    figure = label_counts_figure(counts)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def label_counts_figure(counts: np.ndarray, title: str = "") -> Figure:
    """The stacked bars of samples per class for each client ([clients, classes]) as a matplotlib
    Figure (no pyplot state), titled when `title` is given; `pflbench data show --plot` and the reports save it."""
    import textwrap

    import matplotlib
    from matplotlib.cm import ScalarMappable
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure  # a bare Figure renders with Agg/SVG; no pyplot global state
    from matplotlib.patches import Patch

    counts = np.asarray(counts)
    num_clients, num_classes = counts.shape
    palette = "tab10" if num_classes <= 10 else "tab20" if num_classes <= 20 else "viridis"
    colors = matplotlib.colormaps[palette].resampled(num_classes)(np.arange(num_classes))

    # One collection of rectangles instead of ax.bar: 100 clients x 100 classes would be 10,000
    # separate patches, which take tens of seconds to lay out and draw.
    tops = np.cumsum(counts, axis=1)
    client, cls = np.nonzero(counts)
    left, right = client - 0.42, client + 0.42
    bottom, top = tops[client, cls] - counts[client, cls], tops[client, cls]
    corners = np.stack(
        [np.stack(corner, axis=-1) for corner in [(left, bottom), (right, bottom), (right, top), (left, top)]], axis=1
    )

    figure = Figure(figsize=(min(max(6.0, 0.12 * num_clients + 2.5), 24.0), 4.0), layout="constrained")
    axes = figure.add_subplot()
    # matplotlib's stubs say a sequence of polygons; a [N, 4, 2] array is accepted and is its fast path
    axes.add_collection(PolyCollection(corners, facecolors=colors[cls], linewidths=0))  # type: ignore[arg-type]
    axes.set_xlim(-0.5, num_clients - 0.5)
    axes.set_ylim(0, max(int(tops[:, -1].max()), 1) * 1.02)
    if num_clients <= 30:
        axes.set_xticks(range(num_clients))
    axes.set_xlabel("client")
    axes.set_ylabel("samples")
    if num_classes <= 20:
        handles = [Patch(color=colors[c], label=str(c)) for c in range(num_classes)]
        axes.legend(handles=handles, title="class", loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    else:  # a legend of that many entries is unreadable; a color bar maps color to class id
        scale = ScalarMappable(Normalize(0, num_classes - 1), matplotlib.colormaps[palette])
        figure.colorbar(scale, ax=axes, label="class")
    if title:
        axes.set_title("\n".join(textwrap.wrap(title, 70)), fontsize=10)
    return figure


def critical_difference(
    ranks: dict[str, float],
    cd: float,
    groups: Sequence[Sequence[str]],
    stem: str | Path,
    *,
    title: str = "",
    formats: Sequence[str] = FORMATS,
) -> dict:
    """Demšar's critical-difference diagram: the methods on an axis of average rank (1, the best, on the
    left), the better half labelled on the left and the rest on the right, a bar of length CD, and a
    thick line joining each group of methods that the Nemenyi test cannot tell apart. Returns what it
    drew: {"ranks", "cd", "groups"}."""
    names = sorted(ranks, key=lambda n: ranks[n])
    k = len(names)
    low, high = 1, max(k, 2)
    half = (k + 1) // 2
    rows = max(half, k - half)
    label_inches = 0.075 * max(len(f"{n} (0.00)") for n in names) + 0.3  # one side's labels, fontsize 9
    width = max(8.0, 2 * label_inches + 4.0)
    margin = label_inches * (high - low) / (width - 2 * label_inches)  # the labels' room, in rank units
    height = 1.3 + 0.28 * (rows + len(groups))
    figure = new_figure(width, height)
    axes = figure.add_subplot()
    axes.set_xlim(low - margin - 0.1, high + margin + 0.1)
    axes.set_ylim(-(rows + len(groups)) * 0.28 - 0.6, 0.9)
    axes.axis("off")
    axes.hlines(0, low, high, color="black", linewidth=1)
    for tick in range(low, high + 1):
        axes.vlines(tick, 0, 0.12, color="black", linewidth=1)
        axes.text(tick, 0.18, str(tick), ha="center", va="bottom", fontsize=9)
    # the CD bar, above the axis at the left
    axes.hlines(0.62, low, low + cd, color="#b22222", linewidth=2)
    axes.vlines([low, low + cd], 0.55, 0.69, color="#b22222", linewidth=1)
    axes.text(low + cd / 2, 0.72, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize=9, color="#b22222")
    group_rows = len(groups)
    for i, name in enumerate(names):
        left = i < half
        line = (i if left else k - 1 - i) + 1
        y = -(group_rows * 0.28 + 0.1) - line * 0.28
        x_end = low - 0.35 if left else high + 0.35
        axes.plot([ranks[name], ranks[name], x_end], [0, y, y], color="#333333", linewidth=0.9)
        axes.text(
            x_end + (-0.05 if left else 0.05),
            y,
            f"{name} ({ranks[name]:.2f})",
            fontsize=9,
            va="center",
            ha="right" if left else "left",
        )
    for j, group in enumerate(groups):
        values = [ranks[n] for n in group]
        y = -0.14 - j * 0.28
        axes.hlines(y, min(values) - 0.03, max(values) + 0.03, color="black", linewidth=3.5)
    if title:
        axes.set_title(title, fontsize=10)
    save(figure, stem, formats)
    return {"ranks": dict(ranks), "cd": cd, "groups": [tuple(g) for g in groups]}
