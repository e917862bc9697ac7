"""What makes a row of the tables: an algorithm, the setting its cells were run with, tuned or not.

An algorithm's cells of one column whose hyperparameters (`hp.*`) or budget fields (`BUDGET_FIELDS`)
differ get one row per setting, labelled by what differs ("HeurpFedLA (retain_layers=1)"); cells run
with tuned hyperparameters get their own row, marked †; a heterogeneity knob's setting is part of
the row. Values compare as the labels print them: 100 and 100.0 are one value, a key set to None is
the value "null" (`hp.inner_steps: null`), and a hyperparameter a cell's configuration lacks (an
option added after the cell ran) is the algorithm's default, as `pflbench rerun` resolves it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from pflbench.config import TRAINING_FIELDS
from pflbench.reports.cells import algorithm_rank, display_name, is_reference, printed_value
from pflbench.reports.knobs import format_value

TUNED = "†"


@dataclass(frozen=True)
class Row:
    algorithm: str
    variant: str = ""  # "retain_layers=1" when the algorithm's cells differ in hyperparameters
    tuned: bool = False
    # The heterogeneity knob setting ("unseen_fraction=0.2"; "" when off), also part of `variant`: rows
    # of different settings are different experiments, ranked apart (`mark_best`).
    setting: str = field(default="", compare=False)

    @property
    def key(self) -> tuple:
        return (self.algorithm, self.variant, self.tuned)

    @property
    def label(self) -> str:
        text = display_name(self.algorithm) + (f" ({self.variant})" if self.variant else "")
        return text + (f" {TUNED}" if self.tuned else "")

    @property
    def reference(self) -> bool:
        """A reference algorithm (`centralized`): listed apart, never ranked."""
        return is_reference(self.algorithm)


def row_order(row: Row) -> tuple:
    return (algorithm_rank(row.algorithm), row.tuned, row.variant)


# Cell fields of the budget and protocol: where one algorithm's cells of one column differ in one of
# them (a 100-round validation run beside a 600-round cell, an MLP beside the CNN), they are different
# rows, never seeds of one entry.
BUDGET_FIELDS = (
    *TRAINING_FIELDS,
    "train_fraction",
    "val_fraction",
    "finetune_epochs",
    "participation",
    "model",
    "normalization",
)


def current_defaults(algorithm: str) -> dict[str, str]:
    """{"hp.<name>": the default as the labels print it} of a registered algorithm ({} when it is not
    registered here, e.g. a plugin not loaded, or has no defaults for every hyperparameter)."""
    from pflbench.algorithm import get_algorithm

    try:
        values = get_algorithm(algorithm).parse_hyperparams({}).model_dump()
    except (ValueError, KeyError):
        return {}
    return {f"hp.{k}": "null" if v is None else format_value(v) for k, v in values.items()}


def row_of_cells(cells: pd.DataFrame, knobs: bool = True) -> pd.Series:
    """The Row of each cell: algorithm, its varying hyperparameters (default-hp cells only) and budget
    fields (`BUDGET_FIELDS`), tuned; with `knobs`, also its heterogeneity knob setting where an
    algorithm's cells differ in it (a knob-on cell is another experiment, never one more seed of the
    knob-off one)."""
    from pflbench.reports.knobs import OFF, knob_columns, knob_setting

    rows = pd.Series(index=cells.index, dtype=object)
    hp_columns = [c for c in cells.columns if c.startswith("hp.")]
    budget_columns = [c for c in BUDGET_FIELDS if c in cells.columns]
    knob_cols = knob_columns(cells) if knobs else []

    nulls = cells["null_fields"].fillna("").str.split(",") if "null_fields" in cells else None

    defaults = {name: current_defaults(str(name)) for name in cells["algorithm"].dropna().unique()}

    def shown(column: str) -> pd.Series:
        # The values as the labels print them (100 and 100.0, an int column read beside a float one,
        # are one value); a key set to None is the value "null" (`hp.inner_steps: null`, a setting of
        # its own). A hyperparameter the cell's configuration lacks (an option added after the cell
        # ran) is the algorithm's default, as `pflbench rerun` resolves it; another key it lacks
        # (a budget field, another algorithm's option) is no value (NaN).
        text = cells[column].astype(object).map(printed_value)
        if nulls is not None:
            text = text.mask(nulls.map(lambda fields: column in fields), "null")
        if column.startswith("hp."):
            default = cells["algorithm"].map(lambda name: defaults.get(name, {}).get(column, math.nan))
            text = text.fillna(default.astype(text.dtype))  # both str (pandas 3 refuses an object filler)
        return text

    texts = pd.DataFrame({c: shown(c) for c in hp_columns + budget_columns}, index=cells.index)
    context = cells[["dataset", "clients", "params"]]

    def differs(group: pd.DataFrame, column: str) -> bool:
        # Only values that differ within one (dataset, clients, scheme parameters) make rows: a value
        # chosen per dataset (e.g. by a spec's override) is one setting, not several. Most columns
        # hold one value at most (another algorithm's hyperparameter, a fixed budget): no grouping then.
        values = texts.loc[group.index, column]
        if values.dropna().nunique() <= 1:
            return False
        return (
            values.groupby([context.loc[group.index, k] for k in context]).agg(lambda s: s.dropna().nunique()).max() > 1
        )

    for (algorithm, source), group in cells.groupby(["algorithm", "hp_source"], dropna=False):
        tuned = source == "tuned"
        varying = [] if tuned else [c for c in hp_columns if differs(group, c)]
        varying += [c for c in budget_columns if differs(group, c)]
        for index, cell in group.iterrows():
            variant = ", ".join(
                f"{c.removeprefix('hp.')}={texts.at[index, c]}" for c in varying if not pd.isna(texts.at[index, c])
            )
            setting = knob_setting(cell, knob_cols) if knob_cols else OFF
            if setting == OFF:
                setting = ""
            else:
                variant = ", ".join(filter(None, [variant, setting]))
            rows[index] = Row(str(algorithm), variant, tuned, setting)
    return rows
