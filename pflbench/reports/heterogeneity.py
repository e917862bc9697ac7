"""Who copes with what: the survey's Table III ("Ubiquitous: statistical, system, privacy, model,
task"), measured instead of argued.

Cells that differ only in the heterogeneity knobs beyond label skew (`pflbench.config.
HETEROGENEITY_FIELDS`: feature_shift, concept_shift, system, privacy, unseen_fraction) form one
*study*: everything else equal (dataset, partition, clients, rounds, model, lr, ...). In a study, a
row per algorithm (and hyperparameter setting) and a column per knob setting; the first column is
the knob-off cell. Each entry: the accuracy (as delivered, final round, mean over clients; for
`unseen_fraction`, the newcomers' accuracy where the cells report it, `NEWCOMER_KEY`) and the change
against the same algorithm's knob-off cell, paired by seed (mean over the seeds both have).

Newcomers are compared like with like: the baseline of a newcomer entry is the knob-off cell's
accuracy *on the same clients* (the same partition ids, read from the knob-off cell's per-client
metrics at its final round), not its mean over all clients. The partition is the same with and
without the knob (pflbench.newcomers) and the newcomers are drawn from the seed, so the pair differs
only in whether those clients took part in training. Against the all-client mean, a method that
serves newcomers exactly as it trains everyone (Local) was marked as not coping whenever the drawn
clients happened to be harder than average (-5.6 points on the heterogeneity study).
Where the knob-off cell has no per-client row for every newcomer, the entry is not judged.

The rule for "copes" (stated in every caption): an algorithm copes with a knob setting when it loses
at most `TOLERANCE` percentage points against its own knob-off accuracy (✓), else ✗; a method that
diverged under the setting does not cope (✗), a cell that crashed is not judged (–). It is a
robustness rule, as Table III's is (can the method handle this kind of heterogeneity?), not a
ranking: a method weak without the knob stays weak; the accuracies are shown beside the marks so
both readings are there. 5 points: above the seed-to-seed spread of a small CPU cell (about 1-3
points on fmnist in this repository's quick specs) and well below the losses the knobs are built to
cause (a global model under concept shift with 4 clusters loses tens of points).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pflbench.config import HETEROGENEITY_FIELDS
from pflbench.simulator.privacy import privacy_caption
from pflbench.reports.cells import is_reference
from pflbench.reports.knobs import OFF, knob_columns, knob_setting, show_value as _show  # noqa: F401 (OFF: read by others)
from pflbench.reports.rows import Row, row_of_cells, row_order
from pflbench.reports.tables import CONFIG_COLUMNS, mean_or_none

TOLERANCE = 5.0  # percentage points lost against the knob-off cell that still count as coping
ACCURACY_KEY = "final_accuracy"
# The newcomers' accuracy (held-out clients, `unseen_fraction`): scored in place of the training
# clients' accuracy where a cell has it (the unseen-clients branch's `*_newcomers` summary keys).
NEWCOMER_KEY = "final_accuracy_newcomers"


def knobs_of(setting: str) -> tuple[str, ...]:
    """The knob fields a setting turns on (for grouping columns by knob)."""
    if setting == OFF:
        return ()
    return tuple(dict.fromkeys(item.split("=")[0].split(".")[0] for item in setting.split(", ")))


@dataclass
class CopeEntry:
    """One algorithm under one knob setting: its accuracy and the change against its knob-off cells."""

    values: list[float] = field(default_factory=list)  # % per finished seed
    deltas: list[float] = field(default_factory=list)  # % points vs the knob-off cell, per paired seed
    problems: dict[str, int] = field(default_factory=dict)  # failed / diverged / refused counts
    newcomers: bool = False  # the values are the newcomers' accuracy
    hashes: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float | None:
        return mean_or_none(self.values)

    @property
    def delta(self) -> float | None:
        return mean_or_none(self.deltas)

    def copes(self, tolerance: float = TOLERANCE) -> bool | None:
        """True/False by the rule in the module doc; None when there is no knob-off cell to compare.
        A method that diverged under the knob (and finished no seed) does not cope; a crash says
        nothing about the method, so a failed cell stays unjudged."""
        if self.delta is None:
            return False if self.problems.get("diverged") and not self.values else None
        return self.delta >= -tolerance

    def text(self, tolerance: float = TOLERANCE, baseline: bool = False) -> str:
        problems = ", ".join(f"{n} {status}" for status, n in sorted(self.problems.items()))
        if self.mean is None:
            return (problems or "–") + (" ✗" if not baseline and self.copes(tolerance) is False else "")
        value = f"{self.mean:.1f}" + ("ⁿ" if self.newcomers else "")
        if not baseline:
            copes = self.copes(tolerance)
            if copes is not None:
                value += f" ({self.delta:+.1f}) {'✓' if copes else '✗'}"
        return value + (f" [{problems}]" if problems else "")


@dataclass
class CopeTable:
    """One study: rows (algorithms), columns (knob settings, "off" first), entries."""

    context: str  # what the study's cells share, in words
    settings: list[str]
    rows: list[Row]
    entries: dict[tuple, CopeEntry] = field(default_factory=dict)  # (row.key, setting) -> entry
    tolerance: float = TOLERANCE

    def entry(self, row: Row, setting: str) -> CopeEntry | None:
        return self.entries.get((row.key, setting))

    @property
    def caption(self) -> str:
        text = (
            f"Accuracy (%, as delivered, final round, mean over clients; ⁿ: the newcomers' accuracy, held-out "
            f"clients) under each heterogeneity setting, and in brackets the change against the same algorithm's "
            f"knob-off cell (percentage points, paired by seed). Copes (✓): loses at most {self.tolerance:g} points "
            f"against its own knob-off accuracy; ✗: loses more, or diverged."
        ) + privacy_caption(self.settings)
        if any(entry.newcomers for entry in self.entries.values()):
            text += (
                " Newcomers (ⁿ) are compared with the knob-off cell's accuracy on the same clients (the same "
                "partition ids, trained there), not with its mean over all clients."
            )
        return text

    def copes_summary(self) -> dict[str, dict[str, bool | None]]:
        """algorithm label -> knob field -> copes with every setting of that knob (None: not measured)."""
        out: dict[str, dict[str, bool | None]] = {}
        for row in self.rows:
            verdicts: dict[str, list[bool]] = {}
            for setting in self.settings:
                entry = self.entry(row, setting)
                if setting == OFF or entry is None or entry.copes(self.tolerance) is None:
                    continue
                for knob in knobs_of(setting):
                    verdicts.setdefault(knob, []).append(bool(entry.copes(self.tolerance)))
            out[row.label] = {
                knob: (all(verdicts[knob]) if knob in verdicts else None) for knob in HETEROGENEITY_FIELDS
            }
        return out


# Set per algorithm in a spec (e.g. pFedHN's small lr): a method's own setting, not another study. A
# method's knob-on cells are still compared with its knob-off cells at the same value (`_pairing`).
PER_METHOD = ("algorithm", "seed", "hp_source", "lr")


def _context_columns(cells: pd.DataFrame, knobs: list[str]) -> list[str]:
    """Configuration columns that must be equal within a study: all but the algorithm, its
    hyperparameters and learning rate, the seed and the knobs."""
    return [
        c
        for c in cells.columns
        if c.split(".")[0] in CONFIG_COLUMNS and c not in knobs and c not in PER_METHOD and not c.startswith("hp.")
    ]


def _pairing(cell: pd.Series) -> tuple:
    """What a knob-on cell and its knob-off cell share besides everything the study shares."""
    return cell["seed"], cell.get("lr")


def _value(cell: pd.Series, key: str) -> float | None:
    value = cell.get(key)
    return None if value is None or pd.isna(value) else float(value) * 100


def same_clients_accuracy(off_cell: pd.Series, client_ids: Iterable[int]) -> float | None:
    """The knob-off cell's mean accuracy (%) over `client_ids` (partition ids) at its final evaluation
    round, from its per-client metrics; None when any of them has no scored row there."""
    from pflbench.reports.cells import read_metrics

    ids = [int(c) for c in client_ids]
    metrics = read_metrics(off_cell.get("path", ""))
    if not ids or metrics.empty:
        return None
    last = metrics[metrics["round"] == metrics["round"].max()]
    values = last.set_index(last["client"].astype(int))["accuracy"]
    if not all(c in values.index for c in ids) or values.loc[ids].isna().any():
        return None
    return float(values.loc[ids].mean()) * 100


def _newcomer_ids(cell: pd.Series) -> list[int] | None:
    """The partition ids of a cell's newcomers (its summary's `newcomers`), None if it has none."""
    ids = cell.get("newcomers")
    if ids is None or (not isinstance(ids, (list, tuple, np.ndarray)) and pd.isna(ids)):
        return None
    return [int(c) for c in ids]


def cope_tables(cells: pd.DataFrame, tolerance: float = TOLERANCE) -> list[CopeTable]:
    """A CopeTable per study that has at least one knob turned on (none when the store has no
    heterogeneity cells: the section is then left out of the report)."""
    knobs = knob_columns(cells)
    if cells.empty or not knobs:
        return []
    cells = cells.assign(setting=cells.apply(lambda c: knob_setting(c, knobs), axis=1))
    if (cells["setting"] == OFF).all():
        return []
    context_columns = _context_columns(cells, knobs)
    keys = cells[context_columns].apply(
        lambda r: json.dumps([None if (not isinstance(v, (list, dict)) and pd.isna(v)) else v for v in r], default=str),
        axis=1,
    )
    tables = []
    for _, study in cells.groupby(keys, sort=False):
        if (study["setting"] == OFF).all():
            continue
        study = study.assign(row=row_of_cells(study, knobs=False))
        settings = sorted(set(study["setting"]), key=lambda s: (s != OFF, knobs_of(s), s))
        rows = sorted(set(study["row"]), key=row_order)
        first = study.iloc[0]
        varying = [
            c for c in context_columns if c in ("dataset", "partition", "clients") or c.startswith("partition_params.")
        ]
        context = ", ".join(
            f"{c}={_show(first[c])}"
            for c in varying
            if not (not isinstance(first[c], (list, dict)) and pd.isna(first[c]))
        )
        table = CopeTable(context, settings, rows, tolerance=tolerance)
        for row in rows:
            mine = study[study["row"] == row]
            off_cells = {
                _pairing(cell): cell
                for _, cell in mine[mine["setting"] == OFF].iterrows()
                if cell["status"] == "finished"
            }
            off = {pairing: _value(cell, ACCURACY_KEY) for pairing, cell in off_cells.items()}
            for setting in settings:
                group = mine[mine["setting"] == setting]
                if group.empty:
                    continue
                entry = CopeEntry()
                for _, cell in group.iterrows():
                    entry.hashes.append(str(cell["hash"]))
                    newcomer = "unseen_fraction" in knobs_of(setting) and _value(cell, NEWCOMER_KEY) is not None
                    value = _value(cell, NEWCOMER_KEY if newcomer else ACCURACY_KEY)
                    if cell["status"] != "finished" or value is None:
                        status = str(cell["status"]) if cell["status"] != "finished" else "no result"
                        entry.problems[status] = entry.problems.get(status, 0) + 1
                        continue
                    entry.values.append(value)
                    entry.newcomers |= newcomer
                    if setting == OFF or _pairing(cell) not in off_cells:
                        continue
                    if newcomer:  # like with like: the same clients, trained, in the knob-off cell
                        ids = _newcomer_ids(cell)
                        baseline = None if ids is None else same_clients_accuracy(off_cells[_pairing(cell)], ids)
                    else:
                        baseline = off[_pairing(cell)]
                    if baseline is not None:
                        entry.deltas.append(value - baseline)
                table.entries[(row.key, setting)] = entry
        tables.append(table)
    return tables


def markdown_section(tables: list[CopeTable]) -> str:
    """The report.md section: per study, the full table, then the survey's Table III layout
    (algorithm x knob: ✓ / ✗ / – not measured)."""
    if not tables:
        return ""
    parts = [
        "## Who copes with what (heterogeneity beyond label skew)",
        "",
        "The survey's Table III, measured: each algorithm under each heterogeneity knob "
        '(benchmarks/README.md, "Heterogeneity beyond label skew"), against its own knob-off cell.',
    ]
    for table in tables:
        header = ["algorithm", *table.settings]
        lines = ["| " + " | ".join(_md(h) for h in header) + " |", "|---|" + "---:|" * (len(header) - 1)]
        for row in table.rows:
            texts = []
            for setting in table.settings:
                entry = table.entry(row, setting)
                texts.append("–" if entry is None else entry.text(table.tolerance, baseline=setting == OFF))
            lines.append("| " + " | ".join([_md(row.label), *map(_md, texts)]) + " |")
        summary = table.copes_summary()
        measured = [k for k in HETEROGENEITY_FIELDS if any(v[k] is not None for v in summary.values())]
        short = ["| algorithm | " + " | ".join(measured) + " |", "|---|" + ":---:|" * len(measured)]
        for label, verdicts in summary.items():
            short.append(
                f"| {_md(label)} | "
                + " | ".join({True: "✓", False: "✗", None: "–"}[verdicts[k]] for k in measured)
                + " |"
            )
        parts += [
            "",
            f"### {_md(table.context)}",
            "",
            table.caption,
            "",
            *lines,
            "",
            f"Copes with every setting of the knob (✓), not with some (✗: or diverged under it), not measured (–); "
            f"rule: at most {table.tolerance:g} points lost against the algorithm's own knob-off cell.",
            "",
            *short,
        ]
    return "\n".join(parts) + "\n"


def latex_section(tables: list[CopeTable]) -> str:
    """The same tables for report.tex (booktabs; \\checkmark needs amssymb)."""
    from pflbench.reports.text import tex_text

    def tex(text: str) -> str:
        return tex_text(str(text)).replace("✓", r"$\checkmark$").replace("✗", r"$\times$").replace("ⁿ", r"$^{n}$")

    parts = []
    for table in tables:
        columns = ["algorithm", *table.settings]
        lines = [
            r"\begin{table}[t]",
            r"\centering",
            r"\small",
            rf"\caption{{Who copes with what: {tex(table.context)}. {tex(table.caption)}}}",
            r"\begin{tabular}{l" + "r" * len(table.settings) + "}",
            r"\toprule",
            " & ".join(tex(c) for c in columns) + r" \\",
            r"\midrule",
        ]
        for row in table.rows:
            cells = [tex(row.label)]
            for setting in table.settings:
                entry = table.entry(row, setting)
                cells.append("--" if entry is None else tex(entry.text(table.tolerance, baseline=setting == OFF)))
            lines.append(" & ".join(cells) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + ("\n" if parts else "")


def _md(text: str) -> str:
    return str(text).replace("|", "\\|")


def site_tables(tables: list[CopeTable]) -> list[dict]:
    """Plain data for the leaderboard template (no markup made here: the template escapes)."""
    out = []
    for table in tables:
        rows = []
        for row in table.rows:
            entries = []
            for setting in table.settings:
                entry = table.entry(row, setting)
                copes = None if entry is None or setting == OFF else entry.copes(table.tolerance)
                entries.append(
                    {
                        "text": "–" if entry is None else entry.text(table.tolerance, baseline=setting == OFF),
                        "copes": copes,
                        "sort": None if entry is None else entry.mean,
                    }
                )
            rows.append(
                {
                    "label": row.label,
                    "algorithm": row.algorithm,
                    "reference": is_reference(row.algorithm),
                    "entries": entries,
                }
            )
        out.append({"context": table.context, "caption": table.caption, "settings": table.settings, "rows": rows})
    return out
