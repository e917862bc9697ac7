"""A column of the results page (pflbench.reports.glance) built from its studies: which studies are
columns, and each column's rows, their variants and the paper's orderings judged on its cells.

The row is the algorithm's row holding the column study's own cells (the paper's settings); its other
rows (a hyperparameter variant from a study beside it) are listed folded under it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from pflbench.loader.plugins import loaded_versions
from pflbench.reports.cells import display_name, load_cells
from pflbench.reports.columns import Column
from pflbench.reports.glance_data import GlanceColumn, GlanceRow
from pflbench.reports.orderings import judge_claims
from pflbench.reports.protocols import ADAPTED, DEFAULT, Protocol
from pflbench.reports.reference import PaperValue, Reference, compare
from pflbench.reports.rows import Row
from pflbench.reports.tables import Entry, Table, accuracy_tables

COLUMN_STUDY = re.compile(r"^table(?P<table>\d+)-full(?:-(?P<dataset>.+))?$")


def reference_of(references: Sequence[Reference], number: str) -> Reference | None:
    for ref in references:
        table = ref.meta.get("table", [""])[0]
        if re.match(rf"Table {re.escape(number)}\b", table) and not ref.communication:
            return ref
    return None


def column_studies(published: Path) -> list[tuple[Path, str]]:
    """(study folder, table number) of every reproduced column (pflbench.reports.glance's doc)."""
    from pflbench.studies.publish import studies

    out = []
    for folder in studies(published):
        match = COLUMN_STUDY.match(folder.name)
        if match is None:
            continue
        dataset = match.group("dataset")
        if dataset is not None:
            cells = load_cells(folder, (), plugins=loaded_versions())
            if cells.empty or set(cells["dataset"].astype(str)) != {dataset}:
                continue  # a variant of a column (`table1-full-175`), not a dataset of its own
        out.append((folder, match.group("table")))
    return out


def _column_cells(cells: pd.DataFrame) -> tuple[Column, str] | None:
    """The column (dataset, clients) and scheme most of the study's cells are on."""
    if cells.empty:
        return None
    key = cells.groupby(["dataset", "clients", "partition"]).size().idxmax()
    return Column(str(key[0]), int(key[1])), str(key[2])


def build_column(
    folder: Path, beside: Sequence[Path], reference: Reference | None, table: str, level: float, variant_of: str = ""
) -> GlanceColumn | None:
    cells = load_cells(folder, beside, plugins=loaded_versions())
    found = _column_cells(cells)
    if found is None:
        return None
    column, scheme = found
    cells = cells[
        (cells["dataset"] == column.dataset) & (cells["clients"] == column.clients) & (cells["partition"] == scheme)
    ].reset_index(drop=True)
    refs = [reference] if reference is not None else []
    paper_rows = (
        pd.DataFrame()
        if reference is None
        else reference.rows[
            (reference.rows["dataset"] == column.paper_dataset)
            & (reference.rows["partition"] == scheme)
            & (reference.rows["clients"].astype(int) == column.clients)
        ]
    )
    protocols = [Protocol.parse(p) for p in paper_rows.get("protocol", pd.Series(dtype=str)).dropna().unique()]
    paper_protocol = protocols[0] if len(protocols) == 1 else ADAPTED
    tables: dict[Protocol, Table | None] = {}
    waiting = still_to_run(folder)

    def table_of(protocol: Protocol) -> Table | None:
        if protocol not in tables:
            made = accuracy_tables(cells, refs, protocol, level)
            tables[protocol] = made[0] if made else None
        return tables[protocol]

    own = str(folder.resolve())

    def base_row(t: Table | None, algorithm: str) -> Row | None:
        """The algorithm's row holding the column study's own cells; else its only row."""
        if t is None:
            return None
        rows = [r for r in t.rows if r.algorithm == algorithm]
        for row in rows:
            entry = t.entry(row, t.columns[0])
            if entry is not None and any(str(Path(p).parent.resolve()) == own for p in entry.paths):
                return row
        return rows[0] if len(rows) == 1 else None

    def entry_of(t: Table | None, row: Row | None) -> Entry | None:
        return None if t is None or row is None else t.entry(row, t.columns[0])

    delivered = table_of(DEFAULT)
    algorithms = list(
        dict.fromkeys(
            [
                *paper_rows.get("algorithm", pd.Series(dtype=str)).astype(str),
                *[r.algorithm for r in (delivered.rows if delivered else []) if not r.reference],
            ]
        )
    )
    rows: list[GlanceRow] = []
    for algorithm in algorithms:
        paper_line = paper_rows[paper_rows["algorithm"] == algorithm] if len(paper_rows) else paper_rows
        protocol = (
            Protocol.parse(paper_line["protocol"].iloc[0])
            if len(paper_line) and "protocol" in paper_line and not pd.isna(paper_line["protocol"].iloc[0])
            else paper_protocol
        )
        ours_table = table_of(protocol)
        row = base_row(ours_table, algorithm) or base_row(delivered, algorithm)
        ours = entry_of(ours_table, row)
        paper = ours.paper if ours is not None else None
        if paper is None and len(paper_line):
            line = paper_line.iloc[0]
            paper = PaperValue(
                float(line["mean"]),
                None if pd.isna(line.get("std")) else float(line["std"]),
                None,
                reference.short if reference is not None else table,
                protocol,
            )
        if variant_of:
            paper = None  # settings differ from the paper's: the column is judged on orderings only
        glance_row = GlanceRow(
            algorithm,
            display_name(algorithm) + (" †" if row is not None and row.tuned else ""),
            paper,
            ours,
            entry_of(delivered, row),
            other_dataset=column.paper_dataset != column.dataset,
            reason=ours.comparison.reason
            if ours is not None and ours.comparison is not None and not ours.comparison.comparable
            else "",
            waiting=algorithm in waiting,
        )
        for t in (ours_table,):
            for other in t.rows if t is not None else []:
                if other.algorithm == algorithm and other != row:
                    entry = entry_of(t, other)
                    glance_row.variants.append(
                        GlanceRow(
                            algorithm,
                            variant_label(other, row),
                            entry.paper if entry is not None and not variant_of else None,
                            entry,
                            entry_of(delivered, other),
                            other_dataset=glance_row.other_dataset,
                            reason=entry.comparison.reason
                            if entry is not None and entry.comparison is not None and not entry.comparison.comparable
                            else "",
                            variant=True,
                        )
                    )
        if row is None and not len(paper_line):
            continue
        rows.append(glance_row)
    seeds = sorted({s for r in rows if r.ours is not None for s in r.ours.seeds}, key=str)
    differences: tuple[str, ...] = ()
    if variant_of and reference is not None and len(paper_rows):
        # what the variant changes against the paper's settings (read off its first paper row's cells)
        first = paper_rows.iloc[0]
        value = PaperValue(
            float(first["mean"]),
            None,
            None,
            reference.short,
            paper_protocol,
            tuple(
                (n, first[n])
                for n in ("samples_per_client", "rounds", "local_epochs", "lr", "batch_size")
                if n in first and not pd.isna(first[n])
            ),
        )
        same = cells[cells["algorithm"] == first["algorithm"]]
        differences = compare(value, same if len(same) else cells, paper_protocol).differences
        differences = tuple(d for d in differences if not d.startswith("finetune_epochs"))
        params = cells.filter(like="partition_params.").iloc[0].dropna().to_dict() if len(cells) else {}
        shown = [d.split(" vs ")[0].replace(" ", "=") for d in differences]
        extra = [
            f"{k.removeprefix('partition_params.')}={v:g}"
            if isinstance(v, float)
            else f"{k.removeprefix('partition_params.')}={v}"
            for k, v in params.items()
            if not any(k.removeprefix("partition_params.") in s for s in shown)
            and k.removeprefix("partition_params.") in _varied_params(folder)
        ]
        differences = tuple(shown + extra)
    claims, chain = judge_claims(paper_rows, cells, table_of, base_row, entry_of, waiting)
    return GlanceColumn(
        folder.name,
        table,
        reference,
        column,
        scheme,
        [folder.name, *(p.name for p in beside)],
        rows,
        claims,
        chain,
        paper_protocol,
        seeds,
        variant_of,
        differences,
    )


def variant_label(row: Row, base: Row | None) -> str:
    """A variant row's label by what it changes against the base row ("pFedHN (batch_size=64, ...)")."""
    mine = [part for part in row.variant.split(", ") if part]
    common = set(base.variant.split(", ")) if base is not None else set()
    changed = [part for part in mine if part not in common] or mine
    return display_name(row.algorithm) + (f" ({', '.join(changed)})" if changed else "") + (" †" if row.tuned else "")


def still_to_run(folder: Path) -> frozenset[str]:
    """The algorithms of the cells the study's command plans that have no result yet (its manifest's
    `missing`: a study published cell by cell as it runs), from the command expanded again; empty where
    nothing is missing or the command no longer expands."""
    from pflbench.config import cell_hash
    from pflbench.studies.publish import read_manifest, spec_path
    from pflbench.run.spec import load_spec
    from pflbench.run.spec_axes import parse_sets

    manifest = read_manifest(folder) or {}
    missing = set(manifest.get("missing") or [])
    if not missing or not manifest.get("spec"):
        return frozenset()
    try:
        plan = load_spec(
            spec_path(manifest["spec"]), parse_sets(list(manifest.get("sets") or [])), scale=manifest.get("scale")
        )
    except ValueError:  # SpecError included: the study is stale (its page says so)
        return frozenset()
    return frozenset(cell.algorithm for cell in plan.cells if cell_hash(cell) in missing)


def _varied_params(folder: Path) -> set[str]:
    """The partition parameters the study's command sets (`--set partition_params.X=...`)."""
    from pflbench.studies.publish import read_manifest

    command = (read_manifest(folder) or {}).get("command", "")
    return set(re.findall(r"partition_params\.(\w+)=", command))
