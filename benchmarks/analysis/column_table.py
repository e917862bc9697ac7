"""One column of pFedLA's Tables 1-2 from published study folders: the Markdown table of a column's
write-ups in docs/reproduction/, every number from the stored per-client values.

The cells of the stores given (one column: a dataset, partition and client count; several stores may
hold one column's cells, e.g. a study and its second seed) are grouped into rows: an algorithm and the
settings in which its cells depart from the algorithm's defaults and from Local's budget
(versus_local.departures), one split; the cells of a row are its seeds. Per row:

- *delivered*, *adapted*: the mean client accuracy (%) at the cell's last evaluated round (round 600
  for a finished paper-scale cell), as delivered and after local adaptation, the mean of the unrounded
  per-client values; with several seeds the mean over seeds ± their standard deviation, each seed's
  value after it;
- *paper*: the paper's number for the row's algorithm, dataset, partition and client count
  (benchmarks/reference/*.csv, pflbench.reports.reference), `–` where it has none;
- *Δ delivered − paper*, *Δ adapted − paper*: our unrounded mean minus the paper's number, printed
  with two decimals (never a difference of rounded numbers; with several seeds, that of the mean over
  seeds, each seed's after it); in parentheses where a setting the paper states differs from the
  row's (reference.compare; the differences are listed under the table);
- *− Local*: the per-client difference to Local's cell of the same split and seed, ± one standard
  error, with the clients up / down (pflbench.reports.stats.paired: seeds pooled as (seed, client)
  pairs); with several seeds, the per-seed mean differences' mean ± standard deviation beside it;
- *wall*: each seed's cell time, and the round the cell was last resumed from where it was.

    python benchmarks/analysis/column_table.py results/published/table1-full results/published/table1-full-seed1 \
        results/published/table1-full-pfedhn-official ... [--references benchmarks/reference]
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from versus_local import departures, find_local, last_round_clients, read_cell, text  # noqa: E402

from pflbench.reports.cells import algorithm_rank, display_name, is_reference, load_cells  # noqa: E402
from pflbench.reports.reference import (PaperValue, compare, default_reference_dir, find_paper_value,  # noqa: E402
                                        load_references)
from pflbench.reports.stats import Paired, Sample, paired  # noqa: E402

MINUS = "\u2212"
READINGS = (("delivered", "accuracy"), ("adapted", "accuracy_adapted"))


def signed(value: float) -> str:
    """+1.23 / −1.23 (a minus sign, as the README's tables print it)."""
    return f"{value:+.2f}".replace("-", MINUS)


@dataclass
class Seed:
    """One cell of a row: its folder, configuration, summary, per-client accuracies (% , by reading)."""
    folder: Path
    cell: dict
    summary: dict
    clients: dict[str, dict[int, float] | None]
    local: Path | None

    def mean(self, reading: str) -> float | None:
        values = self.clients[reading]
        return None if values is None else float(np.mean(list(values.values())))


@dataclass
class Row:
    algorithm: str
    label: str
    frame: pd.DataFrame              # the row's cells as the reports read them (load_cells' columns)
    seeds: dict[int, Seed] = field(default_factory=dict)

    def means(self, reading: str) -> list[float]:
        found = [s.mean(reading) for s in self.seeds.values()]
        return [m for m in found if m is not None]

    def mean(self, reading: str) -> float | None:
        """The mean over seeds of the per-seed means over clients (None: no seed has this reading)."""
        means = self.means(reading)
        return float(np.mean(means)) if means and len(means) == len(self.seeds) else None


def clients_or_none(folder: Path, column: str) -> dict[int, float] | None:
    """{client: accuracy in %} at the last evaluated round; None where the cell has no such scores."""
    try:
        values = last_round_clients(folder, column)
    except KeyError:
        return None
    return None if not values or any(np.isnan(v) for v in values.values()) else values


def split_text(cell: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(cell.get("partition_params", {}).items()))


def gather(stores: list[Path]) -> list[Row]:
    """The rows of the stores' cells: one per algorithm, departure from its defaults and split."""
    frame = load_cells(stores[0], beside=stores[1:])
    splits = {(c["dataset"], c["partition"], int(c["clients"])) for _, c in frame.iterrows()}
    if len(splits) > 1:
        raise SystemExit(f"the stores hold cells of more than one column ({sorted(splits)}): give one column's stores")
    params = {split_text(read_cell(Path(p))[0]) for p in frame["path"]}
    rows: dict[tuple, Row] = {}
    for index, entry in frame.iterrows():
        folder = Path(entry["path"])
        cell, summary = read_cell(folder)
        local = find_local(cell, stores)
        settings = departures(cell, read_cell(local)[0] if local not in (None, folder) else None)
        split = split_text(cell)
        parts = [] if settings == "defaults" else [settings]
        if len(params) > 1:
            parts.append(split)
        if summary.get("status") != "finished":
            last = int(pd.read_parquet(folder / "metrics.parquet")["round"].max())
            parts.append(f"{summary.get('status')} at round {summary.get('diverged_round')}: its round-{last} numbers")
        name = display_name(cell["algorithm"])
        label = f"{name} ({'; '.join(parts)})" if parts else name
        if is_reference(cell["algorithm"]):  # a bound, never ranked (its display name says so)
            label = f"*{label}*"
        key = (cell["algorithm"], settings, split, summary.get("status"))
        row = rows.setdefault(key, Row(cell["algorithm"], label, frame.iloc[0:0]))
        if cell["seed"] in row.seeds:
            raise SystemExit(f"{folder}: a second cell of row {label!r} at seed {cell['seed']} "
                             f"({row.seeds[cell['seed']].folder}): give each setting's cells once")
        row.frame = pd.concat([row.frame, frame.loc[[index]]])
        row.seeds[cell["seed"]] = Seed(folder, cell, summary,
                                       {r: clients_or_none(folder, c) for r, c in READINGS},
                                       None if local == folder else local)
    for row in rows.values():
        row.seeds = dict(sorted(row.seeds.items()))
    return sorted(rows.values(), key=lambda r: (algorithm_rank(r.algorithm), r.label != display_name(r.algorithm),
                                                r.label))


def accuracy_text(row: Row, reading: str) -> str:
    means = row.means(reading)
    if not means or len(means) < len(row.seeds):
        return "–"
    if len(means) == 1:
        return f"{means[0]:.2f}"
    return f"{np.mean(means):.2f} ± {np.std(means, ddof=1):.2f} (seeds {' / '.join(f'{m:.2f}' for m in means)})"


def versus_local(row: Row, reading: str) -> str:
    """The per-client difference to Local (seeds pooled) and, with several seeds, the per-seed means' mean ± SD."""
    ours, theirs, per_seed = {}, {}, []
    for seed, entry in row.seeds.items():
        if entry.local is None or entry.clients[reading] is None:
            continue
        local = clients_or_none(entry.local, dict(READINGS)[reading])
        if local is None:
            continue
        ours[seed], theirs[seed] = entry.clients[reading], local
        shared = sorted(set(ours[seed]) & set(local))
        per_seed.append(float(np.mean([ours[seed][c] - local[c] for c in shared])))
    if not ours:
        return "–"
    found: Paired | None = paired(Sample(ours, {s: float(np.mean(list(v.values()))) for s, v in ours.items()}),
                                  Sample(theirs, {s: float(np.mean(list(v.values()))) for s, v in theirs.items()}))
    shown = text(found).replace("-", MINUS)
    if len(per_seed) > 1:
        shown += f"; over seeds {signed(float(np.mean(per_seed)))} ± {np.std(per_seed, ddof=1):.2f} SD"
    return shown


def paper_of(row: Row, references) -> tuple[PaperValue | None, tuple[str, ...]]:
    """The paper's number for the row and the settings in which the row's cells differ from the paper's."""
    first = next(iter(row.seeds.values())).cell
    paper = find_paper_value(references, algorithm=row.algorithm, dataset=first["dataset"],
                             partition=first["partition"], clients=int(first["clients"]), cells=row.frame)
    if paper is None:
        return None, ()
    return paper, compare(paper, row.frame, paper.protocol).differences


def delta_text(row: Row, reading: str, paper: PaperValue | None, differences: tuple[str, ...]) -> str:
    """Our unrounded mean minus the paper's number (with several seeds: the mean over seeds, then each
    seed's); in parentheses where a setting the paper states differs."""
    mean = row.mean(reading)
    if paper is None or mean is None:
        return "–"
    shown = signed(mean - paper.mean)
    if len(row.seeds) > 1:
        each = " / ".join(signed(m - paper.mean) for m in row.means(reading))
        shown += f"; seeds {each}" if differences else f" (seeds {each})"
    return f"({shown})" if differences else shown


def wall_text(row: Row) -> str:
    parts = []
    for entry in row.seeds.values():
        wall = entry.summary.get("wall_time")
        shown = "–" if wall is None else f"{wall:.0f} s"
        if entry.summary.get("resumed_from_round"):
            shown += f" (last resumed at round {entry.summary['resumed_from_round']})"
        parts.append(shown)
    return " / ".join(parts)


def table(stores: list[Path], references) -> str:
    rows = gather(stores)
    lines = ["| row | study | seeds | delivered | adapted | paper | Δ delivered − paper | Δ adapted − paper "
             "| − Local, delivered | − Local, adapted | wall |",
             "|---|---|---|---:|---:|---:|---:|---:|---|---|---|"]
    notes = []
    for row in rows:
        paper, differences = paper_of(row, references)
        if differences:
            notes.append(f"{row.label}: {', '.join(differences)}")
        studies = " / ".join(dict.fromkeys(f"`{e.folder.parent.name}`" for e in row.seeds.values()))
        lines.append(
            f"| {row.label} | {studies} | {', '.join(map(str, row.seeds))} | {accuracy_text(row, 'delivered')} | "
            f"{accuracy_text(row, 'adapted')} | {'–' if paper is None else f'{paper.mean:.2f}'} | "
            f"{delta_text(row, 'delivered', paper, differences)} | {delta_text(row, 'adapted', paper, differences)} | "
            f"{versus_local(row, 'delivered')} | {versus_local(row, 'adapted')} | {wall_text(row)} |")
    if notes:
        lines += ["", "Δ in parentheses: a setting the paper states differs (ours vs the paper's): " + "; ".join(notes)
                  + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", nargs="+", help="study folders (stores) holding one column's cells")
    parser.add_argument("--references", default=None,
                        help="folder of the papers' numbers (default: benchmarks/reference)")
    args = parser.parse_args(argv)
    references = load_references(args.references or default_reference_dir())
    print(table([Path(s) for s in args.stores], references))
    return 0


if __name__ == "__main__":
    sys.exit(main())
