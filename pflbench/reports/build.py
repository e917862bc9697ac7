"""`build_reports(results, out)`: every report of one results store.

Accuracy tables are made per evaluation protocol (protocols.py): report.md and report.tex show as
delivered at the final round (mean over clients), plus after local adaptation and at the best
validation round where the store has those numbers (`ReportOptions.protocols` names others), and the
worst 10% of clients at the final round; the leaderboard offers every protocol the store has numbers
for (pooled, worst 10%, best test round included), one at a time.

    out/report.md        the tables (Markdown), linking the figures; "who copes with what" where the
                         store has heterogeneity cells (heterogeneity.py)
    out/report.tex       the same tables, LaTeX booktabs
    out/index.html       the leaderboard; out/cells/<hash>.html a page per cell,
                         out/algorithms/<name>.html the cells of each algorithm
    out/figures/         per (dataset, scheme, clients): learning curves, per-client accuracy
                         distribution, communication vs accuracy; partitions/: label distributions
    out/cells/<hash>/    pFedLA's Figures 5-7 from the cell's α, its other artifacts (its curves are
                         drawn inline on its page, as SVG: a matplotlib figure per cell is too slow)
"""

from __future__ import annotations

import hashlib
import json
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pflbench.reports import figures as fig
from pflbench.loader.plugins import loaded_versions
from pflbench.reports.cells import load_cells, read_artifacts, read_config, read_metrics
from pflbench.reports.heterogeneity import cope_tables
from pflbench.reports.heterogeneity import latex_section as heterogeneity_latex
from pflbench.reports.heterogeneity import markdown_section as heterogeneity_markdown
from pflbench.reports.progress import progress_text, skipped_datasets, skipped_text, store_progress
from pflbench.reports.protocols import Protocol, available, report_protocols
from pflbench.reports.reference import default_reference_dir, load_references
from pflbench.reports.differences import DEFAULT_BASELINE, UnknownBaseline, difference_tables
from pflbench.reports.ranks import StudyRanks, study_ranks
from pflbench.reports.stats import LEVEL
from pflbench.reports.tables import CommTable, Table, accuracy_tables, communication_tables, mean_or_none
from pflbench.reports.document import Report, safe_name
from pflbench.reports.text import latex_report, markdown_report
from pflbench.storage.store import store_problems

ALPHA, ALPHA_LAYERS = "alpha", "alpha_layers"


@dataclass(frozen=True)
class ReportOptions:
    reference: Path | None = None  # folder of reference CSVs; None: benchmarks/reference if found
    figures: bool = True
    cell_figures: bool = True  # artifact figures on the cell pages (α, ...)
    partitions: bool = True  # label distributions (loads each partition's dataset)
    formats: tuple[str, ...] = fig.FORMATS
    alpha_layer: str | None = None  # Figure 6's layer (name or index; default: the last)
    alpha_round: int | None = None  # Figures 6-7's round (default: the last stored)
    target_client: int = 0  # Figures 5 and 7
    data_root: Path | None = None
    mirror: Path | None = None
    protocols: tuple[str, ...] | None = None  # report.md/.tex's protocols (names); None: see report_protocols
    level: float = LEVEL  # the paired tests' level (stats.py): tie marks, intervals, ranks
    baseline: str = DEFAULT_BASELINE  # the difference view's reference row (differences.py)
    baseline_required: bool = False  # a store without that row is an error (else: no difference view)
    beside: tuple[Path, ...] = ()  # other stores whose cells are shown beside this one's (cells.load_cells)
    docs_url: str | None = None  # the documentation site, linked from every page (a relative URL is
    # taken from the leaderboard's index: `pflbench leaderboard --docs-url`)


def beside_text(store: Path, cells: pd.DataFrame) -> str:
    """The note naming a store shown beside the report's own, and how many of its cells the tables hold."""
    count = int(cells["path"].map(lambda p: Path(p).parent == Path(store)).sum()) if len(cells) else 0
    return (
        f"beside this store's cells: {count} cell{'' if count == 1 else 's'} of {Path(store).name} (rows told "
        f"apart by what differs; "
        f"each cell's page says where it comes from and how to re-run it)"
    )


def group_stem(dataset: str, scheme: str, clients: int, params: str = "") -> str:
    return safe_name(f"{dataset}_{scheme}_{clients}" + (f"_{params}" if params else ""))


def build_reports(results: str | Path, out: str | Path, options: ReportOptions = ReportOptions()) -> Report:
    from pflbench.reports.site import write_site

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cells = load_cells(results, options.beside, plugins=loaded_versions())
    version_notes = list(cells.attrs.get("notes", []))  # cells of a user's plugin's other versions left out
    references = load_references(options.reference or default_reference_dir())
    made: dict[Protocol, list[Table]] = {}

    def tables_of(protocol: Protocol) -> list[Table]:
        if protocol not in made:
            made[protocol] = accuracy_tables(cells, references, protocol, options.level)
        return made[protocol]

    shown = report_protocols(cells, options.protocols)
    tables = [t for p in shown if not p.worst10 for t in tables_of(p)]
    worst = [
        t
        for p in shown
        if p.averaging == "clients" and p.selection == "final"
        for t in tables_of(p.with_averaging("worst10"))
    ]
    worst += [t for p in shown if p.worst10 for t in tables_of(p)]
    boards = [(p, tables_of(p)) for p in dict.fromkeys([*available(cells), *shown]) if tables_of(p)]
    comm = communication_tables(cells, references)
    try:  # every accuracy table against the reference row (Local), on the leaderboard and in report.md
        differences = {
            d.table.id: d
            for d in difference_tables(
                [t for _, board in boards for t in board if not t.protocol.worst10], options.baseline
            )
        }
    except UnknownBaseline:
        if options.baseline_required:
            raise
        differences = {}
    report = Report(out, out / "report.md", out / "report.tex")
    report.differences = differences
    report.ranks = [r for _, board in boards if (r := study_ranks(board, options.level)) is not None]
    if options.figures:  # the critical-difference diagram of each protocol report.md shows
        for ranks in report.ranks:
            if ranks.protocol in shown or ranks.protocol.worst10 and ranks.protocol.selection == "final":
                rank_figure(ranks, out, options)
    report.notes += version_notes
    beside_notes = [beside_text(store, cells) for store in options.beside]
    report.notes += beside_notes
    if options.figures and not cells.empty:
        group_figures(cells, comm, out, options, report)
        if options.partitions:
            partition_figures(cells, out, options, report)
        if options.cell_figures:
            for _, cell in cells.iterrows():
                report.cell_figures[cell["hash"]] = cell_figures(cell, out, options, report)
    present = set(cells["dataset"].astype(str)) if len(cells) else set()
    report.skipped = skipped_datasets(results, present)
    report.progress = progress_text(store_progress(results))
    seeds = (
        int(cells.groupby(["algorithm", "dataset", "partition", "clients"])["seed"].nunique().max())
        if len(cells)
        else 0
    )
    statuses = cells["status"].value_counts().to_dict() if len(cells) else {}
    report.markdown.write_text(
        markdown_report(
            tables,
            worst,
            comm,
            seeds=seeds,
            statuses=statuses,
            figures=report.figures,
            differences=differences,
            ranks=[r for r in report.ranks if r.protocol in shown],
            notices=[
                *([report.progress] if report.progress else []),
                *map(skipped_text, report.skipped),
                *version_notes,
                *beside_notes,
            ],
        )
    )
    problems = store_problems(results)
    if problems:  # damaged or foreign folders: never read as results, but never hidden either
        report.notes += [f"not read as a result: {problem} (see `pflbench store check`)" for problem in problems]
        with report.markdown.open("a") as markdown:
            markdown.write(
                "\n## Store entries not read as results\n\n"
                + "".join(f"- {problem}\n" for problem in problems)
                + "\n`pflbench run` sets a damaged cell aside and runs it again; "
                "`pflbench store check` lists these entries.\n"
            )
    report.heterogeneity = cope_tables(cells)
    if report.heterogeneity:
        with report.markdown.open("a") as markdown:
            markdown.write("\n" + heterogeneity_markdown(report.heterogeneity))
    report.latex.write_text(
        latex_report(tables, worst, comm)
        + ("\n" + heterogeneity_latex(report.heterogeneity) if report.heterogeneity else "")
    )
    report.index = write_site(cells, boards, comm, references, report, Path(results), docs_url=options.docs_url)
    return report


def rank_figure(ranks: StudyRanks, out: Path, options: ReportOptions) -> None:
    """The critical-difference diagram of one protocol's ranks (ranks.py), at figures/cd_<protocol>."""
    stem = f"figures/cd_{safe_name(ranks.protocol.name)}"
    fig.critical_difference(
        dict(zip(ranks.methods, ranks.ranks.tolist())),
        ranks.cd,
        [[ranks.methods[i] for i in group] for group in ranks.groups],
        out / stem,
        title=f"average ranks over {len(ranks.blocks)} columns, {ranks.protocol.label}",
        formats=options.formats,
    )
    ranks.figure = f"{stem}.png"


def curve_of(metrics: pd.DataFrame, column: str = "accuracy") -> pd.DataFrame:
    """A cell's mean client `column` per evaluated round (`metrics`: its metrics.parquet), as column
    "accuracy" (rounds where it was not measured, e.g. no local adaptation, are left out)."""
    if metrics.empty or column not in metrics:
        return pd.DataFrame(columns=["round", "accuracy"])
    curve = metrics.groupby("round", as_index=False)[column].mean().dropna()
    return curve.rename(columns={column: "accuracy"})


def _knobs_off(group: pd.DataFrame, title: str) -> tuple[pd.DataFrame, str]:
    """A group's cells with every heterogeneity knob off, where it has such cells besides knob-on ones:
    one line per (method x knob setting) would bury the curves (36 lines for heterogeneity.yaml); the
    knobs' effect is the "Who copes with what" table's subject."""
    from pflbench.reports.knobs import OFF, knob_columns, knob_setting

    columns = knob_columns(group)
    if not columns or group.empty:
        return group, title
    off = group.apply(lambda cell: knob_setting(cell, columns) == OFF, axis=1)
    if off.all() or not off.any():
        return group, title
    return group[off], f"{title} (heterogeneity knobs off)"


def group_figures(
    cells: pd.DataFrame, comm: list[CommTable], out: Path, options: ReportOptions, report: Report
) -> None:
    from pflbench.reports.rows import row_of_cells

    for table in comm:
        column, scheme = table.column, table.scheme
        group = cells[
            (cells["partition"] == scheme) & (cells["dataset"] == column.dataset) & (cells["clients"] == column.clients)
        ]
        if column.show_params:
            group = group[group["params"] == column.params]
        scheme_rows = row_of_cells(cells[cells["partition"] == scheme])
        group = group.assign(row=scheme_rows.loc[group.index])
        stem = group_stem(column.dataset, scheme, column.clients, column.params if column.show_params else "")
        title = f"{column.label}, {scheme}"
        group, title = _knobs_off(group, title)
        plotted = {cell["row"].label for _, cell in group.iterrows()}
        curves: list[pd.DataFrame] = []
        adapted_curves: list[pd.DataFrame] = []
        accuracies: dict[str, np.ndarray] = {}
        worst10: dict[str, list[float]] = {}
        for _, cell in group.iterrows():
            metrics = read_metrics(cell["path"])  # once per cell: its curves and final accuracies
            for found, metric in ((curves, "accuracy"), (adapted_curves, "accuracy_adapted")):
                curve = curve_of(metrics, metric)
                if len(curve):
                    found.append(curve.assign(label=cell["row"].label, seed=cell["seed"]))
            if cell["status"] == "finished" and len(metrics):
                last = metrics[metrics["round"] == metrics["round"].max()]["accuracy"].to_numpy()
                label = cell["row"].label
                accuracies[label] = np.concatenate([accuracies.get(label, np.zeros(0)), last])
                if not pd.isna(cell.get("final_worst10_accuracy")):  # as the tables: per seed, then the mean
                    worst10.setdefault(label, []).append(float(cell["final_worst10_accuracy"]))
        if curves:
            fig.learning_curves(
                pd.concat(curves, ignore_index=True),
                out / "figures" / f"curves_{stem}",
                title=f"learning curves: {title}",
                formats=options.formats,
            )
            report.figures.append((f"Learning curves: {title}", f"figures/curves_{stem}.png"))
        if adapted_curves:  # the protocol of pFedLA's tables: does the ranking after adaptation move with rounds?
            fig.learning_curves(
                pd.concat(adapted_curves, ignore_index=True),
                out / "figures" / f"curves_adapted_{stem}",
                title=f"learning curves after local adaptation: {title}",
                formats=options.formats,
                ylabel="mean client test accuracy after adaptation (%)",
            )
            report.figures.append(
                (f"Learning curves after local adaptation: {title}", f"figures/curves_adapted_{stem}.png")
            )
        if accuracies:
            fig.client_accuracy_distribution(
                accuracies,
                out / "figures" / f"clients_{stem}",
                title=f"per-client final accuracy: {title}",
                formats=options.formats,
                worst10={k: float(np.mean(v)) for k, v in worst10.items()},
            )
            report.figures.append((f"Per-client accuracy: {title}", f"figures/clients_{stem}.png"))
        points = [
            {
                "label": row.label,
                "mb_per_round": mean_or_none(e.mbytes_per_round),
                "accuracy": e.mean,
                "accuracy_std": e.std or 0.0,
            }
            for row, e in table.rows
            if e.mean is not None and e.mbytes_per_round and row.label in plotted
        ]
        paper = [
            {"label": row.label, "comm_mbytes": value.comm_mbytes, "accuracy": value.mean}
            for row, _ in table.rows
            if (e := table.papered(row)) is not None
            and (value := e.paper) is not None
            and value.comm_mbytes is not None
        ]
        if points:
            fig.communication_vs_accuracy(
                pd.DataFrame(points),
                out / "figures" / f"comm_{stem}",
                paper=pd.DataFrame(paper) if paper else None,
                title=f"communication vs accuracy: {title}",
                formats=options.formats,
            )
            report.figures.append((f"Communication vs accuracy: {title}", f"figures/comm_{stem}.png"))


PARTITION_FIELDS = (
    "dataset",
    "dataset_options",
    "partition",
    "partition_params",
    "clients",
    "seed",
    "train_fraction",
    "val_fraction",
)


def partition_figures(cells: pd.DataFrame, out: Path, options: ReportOptions, report: Report) -> None:
    """Each distinct partition's per-client label counts, rebuilt from the data root's cache."""
    from pflbench.config import CellConfig
    from pflbench.simulator.rounds import prepare_cell

    done: dict[str, str | None] = {}
    for _, cell in cells.iterrows():
        config = read_config(cell["path"]).get("cell", {})
        key = json.dumps({k: config.get(k) for k in PARTITION_FIELDS}, sort_keys=True, default=str)
        digest = hashlib.sha1(key.encode()).hexdigest()[:12]
        if digest not in done:
            done[digest] = None
            try:
                known = CellConfig(**{k: v for k, v in config.items() if k in CellConfig.model_fields})
                dataset, splits = prepare_cell(known, options.data_root, options.mirror)
                counts = splits.label_counts(dataset.labels.numpy(), dataset.num_classes)
                params = ", ".join(f"{k}={v}" for k, v in sorted((config.get("partition_params") or {}).items()))
                fig.label_distribution(
                    counts,
                    out / "figures" / "partitions" / digest,
                    formats=options.formats,
                    title=f"label distribution: {config.get('dataset')}, {config.get('partition')}"
                    + (f" ({params})" if params else "")
                    + f", {config.get('clients')} clients, seed {config.get('seed')}",
                )
                done[digest] = figure = f"figures/partitions/{digest}.png"
                report.figures.append(
                    (
                        f"Label distribution: {config.get('dataset')}, {config.get('partition')}, "
                        f"{config.get('clients')} clients, seed {config.get('seed')}",
                        figure,
                    )
                )
            except Exception as err:  # a dataset not available here: the report goes on without the figure
                report.notes.append(
                    f"no label distribution for {config.get('dataset')}/{config.get('partition')} "
                    f"seed {config.get('seed')}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                )
        if (drawn := done[digest]) is not None:
            report.partition_figures[cell["hash"]] = drawn


def cell_figures(cell: pd.Series, out: Path, options: ReportOptions, report: Report) -> list[dict]:
    folder = out / "cells" / safe_name(cell["hash"])
    rel = f"cells/{safe_name(cell['hash'])}"
    drawn = []
    try:
        artifacts = read_artifacts(cell["path"])
        layerwise = is_layerwise_alpha(artifacts)
        if layerwise:
            drawn += alpha_figures(artifacts, folder, rel, options)
        for name, rounds in artifacts.items():
            if layerwise and name in (ALPHA, ALPHA_LAYERS):
                continue
            last = max(rounds)
            if (
                fig.array_figure(
                    rounds[last],
                    folder / f"artifact_{safe_name(name)}",
                    title=f"{name}, round {last}",
                    formats=options.formats,
                )
                is not None
            ):
                drawn.append(
                    {
                        "title": f"{name} (round {last})",
                        "path": f"{rel}/artifact_{safe_name(name)}.png",
                        "kind": "artifact",
                    }
                )
    except Exception:  # one unreadable cell must not stop the report
        report.notes.append(f"cell {cell['hash']}: figures failed: {traceback.format_exc().strip().splitlines()[-1]}")
    return drawn


def is_layerwise_alpha(artifacts: dict) -> bool:
    """pFedLA's α: [clients, layers, clients] at every stored round (other algorithms may store
    something else called "alpha", e.g. APFL's per-client mixing weights, drawn generically)."""
    rounds = artifacts.get(ALPHA, {})
    return bool(rounds) and all(a.ndim == 3 and a.shape[0] == a.shape[2] for a in rounds.values())


def alpha_figures(artifacts: dict, folder: Path, rel: str, options: ReportOptions) -> list[dict]:
    """pFedLA's Figures 5, 6 and 7 for one cell."""
    alphas = artifacts[ALPHA]
    names_by_round = artifacts.get(ALPHA_LAYERS, {})
    rnd = options.alpha_round if options.alpha_round in alphas else max(alphas)
    names = names_by_round.get(rnd, next(iter(names_by_round.values()), None))
    client = min(options.target_client, alphas[rnd].shape[0] - 1)
    layer = fig.layer_index(options.alpha_layer, names, alphas[rnd].shape[1])
    layer_name = names[layer] if names is not None else str(layer)
    fig.alpha_heatmap(
        alphas[rnd],
        folder / "fig6_alpha_heatmap",
        layer=layer,
        layer_names=names,
        title=f"α of layer {layer_name}, round {rnd}",
        formats=options.formats,
    )
    fig.alpha_evolution(
        alphas, folder / "fig5_alpha_evolution", client=client, layer_names=names, formats=options.formats
    )
    fig.client_layer_weights(
        alphas[rnd],
        folder / "fig7_client_layers",
        client=client,
        layer_names=names,
        title=f"client {client}'s α per layer, round {rnd}",
        formats=options.formats,
    )
    return [
        {
            "title": f"Figure 6: aggregation weights of layer {layer_name} at round {rnd}",
            "path": f"{rel}/fig6_alpha_heatmap.png",
            "kind": "alpha",
        },
        {
            "title": f"Figure 5: client {client}'s weights over rounds",
            "path": f"{rel}/fig5_alpha_evolution.png",
            "kind": "alpha",
        },
        {
            "title": f"Figure 7: client {client}'s weights per layer at round {rnd}",
            "path": f"{rel}/fig7_client_layers.png",
            "kind": "alpha",
        },
    ]
