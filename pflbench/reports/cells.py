"""The results store as the reports see it: one row per cell with every column a report reads
(missing columns filled, e.g. `hp_source` "default" and `finetune_epochs` 0 for stores written before
they existed, every protocol's summary key (see protocols.py) NaN where a cell has none), and readers
for one cell's per-round metrics and artifacts."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from pflbench.reports.knobs import format_value
from pflbench.reports.protocols import ALL_KEYS, ROUND_KEYS
from pflbench.storage.store import ARTIFACTS, CONFIG, ERROR, METRICS, ROUNDS, load_store

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pflbench.algorithm import AnyAlgorithm
    from pflbench.card import Card
    from pflbench.data.sources import Source


# How a method is shown comes from its card (pflbench.card.Card: display_name, family, reference,
# row_order, reduces_to): the card stored with its cells' results first (so a report built from the store
# alone shows a plugin's method by its card, and a published table keeps the card it was published
# with), else its registered class's. A dataset is shown by its class (pflbench.data.sources.DATASETS'
# attributes). Built-in or plugin alike: nothing here names an algorithm. A method no store and no
# registry knows is shown by its name, after the known ones.
STORED_CARDS: dict[str, dict] = {}  # algorithm -> the card its stored cells carry (`remember_cards`)


def remember_cards(cells: pd.DataFrame) -> None:
    """Take the cards stored with `cells`' results (the latest finished, per algorithm), in place of
    those of the store read before."""
    STORED_CARDS.clear()
    if "card" not in cells or cells.empty:
        return
    stored = cells[cells["card"].map(lambda c: isinstance(c, dict))]
    if "completed_at" in stored:
        stored = stored.sort_values("completed_at", na_position="first", kind="stable")
    for algorithm, card in zip(stored["algorithm"], stored["card"]):
        STORED_CARDS[str(algorithm)] = card


def card(algorithm: str) -> Card:
    """The card `algorithm` is shown by: stored with its results, else its class's, else its name alone."""
    from pflbench.card import Card

    if algorithm in STORED_CARDS:
        return Card.from_dict(STORED_CARDS[algorithm]).named(algorithm)
    cls = algorithm_class(algorithm)
    return cls.card if cls is not None else Card().named(algorithm)


def algorithm_class(algorithm: str) -> type[AnyAlgorithm] | None:
    """The registered class of `algorithm`, or None (e.g. a plugin's, not loaded here)."""
    from pflbench.algorithm import ALGORITHMS

    return ALGORITHMS.get(algorithm) if algorithm in ALGORITHMS else None


def dataset_class(dataset: str) -> type[Source] | None:
    from pflbench.data.sources import DATASETS

    return DATASETS.get(dataset) if dataset in DATASETS else None


def display_names() -> dict[str, str]:
    """Every known algorithm's display name (registered or stored), by name."""
    from pflbench.algorithm import ALGORITHMS

    return {name: card(name).display_name for name in sorted({*ALGORITHMS.names(), *STORED_CARDS})}


class _DatasetAliases(Mapping[str, tuple[str, str]]):
    """Our dataset -> (the paper's dataset its cells are compared with, the footnote saying they differ),
    from the datasets' `paper_dataset` / `paper_dataset_note`; read like a dict."""

    def _table(self) -> dict[str, tuple[str, str]]:
        from pflbench.data.sources import DATASETS

        return {
            name: (cls.paper_dataset, cls.paper_dataset_note) for name, cls in DATASETS.items() if cls.paper_dataset
        }

    def __getitem__(self, key: str) -> tuple[str, str]:
        return self._table()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


DATASET_ALIASES = _DatasetAliases()
SUMMARY_COLUMNS = {
    "status": "failed",
    "final_accuracy": np.nan,
    "final_worst10_accuracy": np.nan,
    "best_accuracy": np.nan,
    "bytes_down_total": np.nan,
    "bytes_up_total": np.nan,
    "rounds_completed": np.nan,
    "wall_time": np.nan,
    "error": "",
    "hp_source": "default",
    "participation": 1.0,
    "rounds": np.nan,
    "finetune_epochs": 0,
    "adapt_time_total": np.nan,
    "normalization": "pool",  # stored before the field: the whole pool's statistics
    **{key: np.nan for key in (*ALL_KEYS, *ROUND_KEYS)},
}
NUMERIC_COLUMNS = (
    "final_accuracy",
    "final_worst10_accuracy",
    "best_accuracy",
    "wall_time",
    "rounds_completed",
    "adapt_time_total",
    *ALL_KEYS,
    *ROUND_KEYS,
)


def display_name(algorithm: str) -> str:
    return card(algorithm).display_name


def is_reference(algorithm: str) -> bool:
    """A reference row (bounds or calibrates the methods, never ranked among them)."""
    return bool(card(algorithm).reference)


def family(algorithm: str) -> str:
    """The figures' panel of `algorithm` ("other" when its card declares none or it is unknown)."""
    return card(algorithm).family


def reduces_to(algorithm: str) -> dict[str, str]:
    """{algorithm it can reduce to: why} as its card declares it."""
    return dict(card(algorithm).reduces_to)


def _ordered(row_order: float | None) -> float:
    return math.inf if row_order is None else float(row_order)


def algorithm_rank(algorithm: str) -> tuple:
    """Sort key: reference algorithms last, then the classes' `row_order` (pFedLA's order for its
    rows), then by name."""
    shown = card(algorithm)
    return (bool(shown.reference), _ordered(shown.row_order), algorithm)


def dataset_rank(dataset: str) -> tuple:
    cls = dataset_class(dataset)
    return (_ordered(cls.row_order if cls is not None else None), dataset)


def printed_value(value: Any) -> str | None:
    """A configuration value as the report prints it (100 and 100.0 alike: "100"), None where the cell
    has none (None or NaN); a value JSON cannot write (an array read back from parquet) as str() gives it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        return format_value(value)
    except TypeError:
        return str(value)


def params_label(row: pd.Series, prefix: str = "partition_params.") -> str:
    """ "alpha=0.3, min_samples=10" from a row's `partition_params.*` (or other prefix) columns."""
    items = {}
    for key, value in row.items():
        if key.startswith(prefix) and not (np.isscalar(value) and pd.isna(value)):
            # Integer parameters come back as floats from columns that other schemes leave empty (NaN).
            items[key.removeprefix(prefix)] = value
    return ", ".join(f"{k}={format_value(v)}" for k, v in sorted(items.items()))


def load_cells(
    results: str | Path, beside: Sequence[str | Path] = (), plugins: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """One row per cell with a result (see `pflbench.storage.store.load_store`), every column the reports use
    present, plus `params` (the partition parameters as text) and `mbytes` (down + up, in MB). The cells
    of the `beside` stores join those of `results` (a cell id found twice is one cell: the first store's);
    their rows are told apart in the tables by what differs (an algorithm's hyperparameters, the
    budget), and each keeps its own store (`path`)."""
    cells = load_store(results)
    if beside:
        frames = [frame for frame in (cells, *(load_store(store) for store in beside)) if len(frame)]
        cells = pd.concat(frames, ignore_index=True) if frames else cells
        cells = cells.drop_duplicates("hash", keep="first").reset_index(drop=True)
    for column, default in SUMMARY_COLUMNS.items():
        if column not in cells:
            cells[column] = default
        elif isinstance(default, (str, int)):
            cells[column] = cells[column].fillna(default)
    for column in ("algorithm", "dataset", "partition", "clients", "seed", "path"):
        if column not in cells:
            cells[column] = pd.Series(dtype=object)
    if cells.empty:
        return cells.assign(params=pd.Series(dtype=str), mbytes=pd.Series(dtype=float))
    cells = cells.assign(
        params=cells.apply(params_label, axis=1),
        mbytes=(cells["bytes_down_total"].astype(float) + cells["bytes_up_total"].astype(float)) / 1e6,
    )
    for column in dict.fromkeys(NUMERIC_COLUMNS):
        cells[column] = pd.to_numeric(cells[column], errors="coerce")
    cells["finetune_epochs"] = pd.to_numeric(cells["finetune_epochs"], errors="coerce").fillna(0).astype(int)
    cells, notes = current_plugin_versions(cells, plugins or {})
    remember_cards(cells)
    order = cells.apply(
        lambda r: (
            algorithm_rank(str(r["algorithm"])),
            dataset_rank(str(r["dataset"])),
            str(r["partition"]),
            r["clients"],
            r["seed"],
        ),
        axis=1,
    )
    cells = cells.iloc[sorted(range(len(cells)), key=lambda i: order.iloc[i])].reset_index(drop=True)
    cells.attrs["notes"] = notes  # for the report's notes (pflbench.reports.build)
    return cells


PLUGIN_PREFIX = "plugin_hashes."


def current_plugin_versions(cells: pd.DataFrame, loaded: Mapping[str, str]) -> tuple[pd.DataFrame, list[str]]:
    """The cells of one version of each plugin, and a note per plugin whose other versions were left
    out. A store keeps the cells of every version of a user's plugin (each version's cells have their
    own ids); a report shows one: the version loaded now (`--plugin`), else the one whose cells
    finished last. Built-in cells have no plugin hash and are never left out. `loaded`: the plugins
    loaded in this process, id -> sha256 (`pflbench.loader.plugins.loaded_versions()`)."""
    notes = []
    for column in [c for c in cells.columns if c.startswith(PLUGIN_PREFIX)]:
        plugin = column.removeprefix(PLUGIN_PREFIX)
        versions = cells[column].dropna()
        if versions.nunique() < 2 and (plugin not in loaded or versions.empty or versions.iloc[0] == loaded[plugin]):
            continue
        if plugin in loaded:
            current, why = loaded[plugin], "the version loaded now"
        else:
            finished = cells.loc[versions.index].get("completed_at", pd.Series(index=versions.index, dtype=object))
            current = versions.loc[finished.fillna("").astype(str).idxmax()]
            why = "the version whose cells finished last (pass --plugin to choose)"
        stale = versions[versions != current].index
        if len(stale):
            notes.append(
                f"{len(stale)} cells of another version of plugin {plugin!r} are left out: the report shows "
                f"{why}, sha256 {str(current)[:12]}...; their results stay in the store under their own ids"
            )
            cells = cells.drop(index=stale)
    return cells, notes


def read_metrics(path: str | Path) -> pd.DataFrame:
    """Per eval round and trained client (empty when the cell has none, e.g. it failed before
    evaluating). Newcomers' rows (unseen clients, `newcomer` True) are left out: the curves and
    per-client charts are the trained clients'; the newcomers' numbers are in the summary."""
    try:
        metrics = pd.read_parquet(Path(path) / METRICS)
    except (FileNotFoundError, OSError, ValueError):
        return pd.DataFrame(columns=["round", "client", "accuracy"])
    return metrics[~metrics["newcomer"].astype(bool)] if "newcomer" in metrics else metrics


def read_rounds(path: str | Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(Path(path) / ROUNDS)
    except (FileNotFoundError, OSError, ValueError):
        return pd.DataFrame(columns=["round", "bytes_down", "bytes_up"])


def read_config(path: str | Path) -> dict:
    try:
        return json.loads((Path(path) / CONFIG).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def read_error(path: str | Path) -> str:
    try:
        return (Path(path) / ERROR).read_text()
    except FileNotFoundError:
        return ""


ROUND_KEY = re.compile(r"^(?P<name>.+)_round(?P<round>\d+)$")


@lru_cache(maxsize=8)
def _read_npz(path: str) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def read_artifacts(path: str | Path) -> dict[str, dict[int, np.ndarray]]:
    """{name: {round: array}} from artifacts/arrays.npz (keys `{name}_round{r:05d}`); a key without a
    round suffix is filed under round 0. {} when the cell has no artifacts or they cannot be read."""
    file = Path(path) / ARTIFACTS
    if not file.exists():
        return {}
    try:
        arrays = _read_npz(str(file))
    except (OSError, ValueError):
        return {}
    grouped: dict[str, dict[int, np.ndarray]] = {}
    for key, array in arrays.items():
        match = ROUND_KEY.match(key)
        name, rnd = (match["name"], int(match["round"])) if match else (key, 0)
        grouped.setdefault(name, {})[rnd] = array
    return {name: dict(sorted(rounds.items())) for name, rounds in sorted(grouped.items())}


TIMING_PARTS = (
    ("train", "local training"),
    ("server", "server (configure, receive, send, aggregate)"),
    ("eval", "evaluation"),
    ("adapt", "local adaptation (protocol)"),
)


def execution_text(summary: dict) -> str | None:
    """How the cell was executed, in words (device, training path, memory layout, client threads,
    compiled or eager step); None for stores written before these were recorded."""

    def known(key: str) -> Any:
        value = summary.get(key)
        return None if value is None or (isinstance(value, float) and pd.isna(value)) else value

    if known("client_batching") is None:
        return None
    parts = [
        f"on {known('device') or 'an unrecorded device'}",
        "clients batched" if summary["client_batching"] == "batched" else "a client loop",
    ]
    if known("channels_last"):  # (off: no convolution, a GPU, or switched off)
        parts.append("channels-last convolutions")
    threads = known("client_threads")
    if threads is not None and int(threads) > 1:
        parts.append(f"{int(threads)} clients side by side (one torch thread each)")
    if known("compiled_training") is not None:
        parts.append("compiled training step" if summary["compiled_training"] else "eager training step")
    return "Ran " + ", ".join(parts) + "."


def timing_breakdown(rounds: pd.DataFrame, compile_seconds: float | None = None) -> list[dict] | None:
    """Seconds per round of each part of a round (rounds.parquet's `*_time` columns): one row per part
    with its mean per round and total, and the seconds spent compiling the training step (part of
    local training; summary `compile_seconds`). None for stores written before the breakdown existed."""
    if not len(rounds) or "train_time" not in rounds:
        return None
    rows = []
    for key, label in TIMING_PARTS:
        column = f"{key}_time"
        if column in rounds:
            values = pd.to_numeric(rounds[column], errors="coerce")
            if key == "adapt" and not values.fillna(0).any():
                continue
            rows.append({"part": label, "per_round": float(values.mean()), "total": float(values.sum())})
    if compile_seconds is not None and not pd.isna(compile_seconds) and compile_seconds > 0:
        rows.append(
            {"part": "of which compiling the training step", "per_round": None, "total": float(compile_seconds)}
        )
    return rows
