"""The aggregation weights α on the results page (pFedLA's Figures 5-6; pflbench.reports.glance): which
stored α each column shows, how much of it is exactly 0 or 1, and its figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pflbench.loader.plugins import loaded_versions
from pflbench.reports.cells import display_name, load_cells, read_artifacts
from pflbench.reports.glance_data import AlphaView, Glance

ALPHA_EXTREME = 1e-6  # an α entry this close to 0 or 1 counts as collapsed
ALPHA_ROWS = ("pfedla", "heurpfedla")  # the rows whose α a column shows (both learn it: pFedLA's Eq. 5)


def layerwise(artifacts: dict) -> bool:
    rounds = artifacts.get("alpha", {})
    return bool(rounds) and all(a.ndim == 3 and a.shape[0] == a.shape[2] for a in rounds.values())


def attach_alpha(glance: Glance, published: Path) -> None:
    """For each reproduced column: the α of its default pFedLA and HeurpFedLA cells (`ALPHA_ROWS`, those
    published; seed 0 or the first) and of every pFedLA variant with layer-wise α on the same column and
    seed in the published studies, at the same round (the last all have) and layer (the last)."""
    from pflbench.studies.publish import studies

    stores = {folder.name: load_cells(folder, (), plugins=loaded_versions()) for folder in studies(published)}
    for column in glance.reproduced:
        bases = [
            r for name in ALPHA_ROWS for r in column.rows if r.algorithm == name and r.ours is not None and r.ours.paths
        ]
        if not bases:
            continue
        base = bases[0]
        assert base.ours is not None
        seed = sorted(base.ours.seeds, key=str)[0]
        found: list[tuple[str, str, str, str]] = []  # (label, study, cell, path)
        for row in bases:
            assert row.ours is not None
            for path, cell_seed, cell in zip(row.ours.paths, row.ours.seeds, row.ours.hashes):
                if cell_seed == seed:
                    found.append((_variant_label(_cell_row(stores, path)), Path(path).parent.name, cell, path))
                    break
        rounds = _cell_value(stores, base.ours.paths[0], "rounds")
        for name, cells in sorted(stores.items()):
            if cells.empty or name in column.stores:
                continue
            same = cells[
                (cells["dataset"] == column.column.dataset)
                & (cells["clients"] == column.column.clients)
                & (cells["partition"] == column.scheme)
                & (cells["seed"] == seed)
                & (cells["status"] == "finished")
            ]
            if "partition_params.samples_per_client" in cells and base.ours.paths:
                wanted = _cell_value(stores, base.ours.paths[0], "partition_params.samples_per_client")
                same = same[same["partition_params.samples_per_client"] == wanted]
            if rounds is not None and "rounds" in same:
                same = same[same["rounds"] == rounds]
            for _, cell in same.iterrows():
                label = _variant_label(cell)
                if (
                    cell["algorithm"] == "pfedla"
                    and label not in {f[0] for f in found}
                    and layerwise(read_artifacts(cell["path"]))
                ):
                    found.append((label, name, str(cell["hash"]), str(cell["path"])))
        views = []
        arrays = {}
        for label, study, cell, path in found:
            artifacts = read_artifacts(path)
            if layerwise(artifacts):
                arrays[cell] = artifacts
                views.append((label, study, cell, path))
        if not views:
            continue
        common = set.intersection(*(set(arrays[c]["alpha"]) for _, _, c, _ in views))
        if not common:
            continue
        rnd = max(common)
        for label, study, cell, path in views:
            alpha = np.asarray(arrays[cell]["alpha"][rnd], dtype=float)
            names = arrays[cell].get("alpha_layers", {}).get(rnd)
            layer = str(names[-1]) if names is not None else str(alpha.shape[1] - 1)
            extreme = float(np.mean((alpha <= ALPHA_EXTREME) | (alpha >= 1 - ALPHA_EXTREME)))
            self_weight = float(np.mean([alpha[i, :, i] for i in range(alpha.shape[0])]))
            column.alpha.append(AlphaView(label, study, cell, path, int(rnd), layer, extreme, self_weight))


def _cell_row(stores: dict[str, pd.DataFrame], path: str) -> pd.Series:
    for cells in stores.values():
        match = cells[cells["path"] == path] if "path" in cells else cells.iloc[:0]
        if len(match):
            return match.iloc[0]
    raise KeyError(path)


def _cell_value(stores: dict[str, pd.DataFrame], path: str, column: str) -> Any:
    for cells in stores.values():
        match = cells[cells["path"] == path] if "path" in cells else cells.iloc[:0]
        if len(match) and column in match:
            return match[column].iloc[0]
    return None


def _variant_label(cell: pd.Series) -> str:
    """pFedLA with the hyperparameters its cell sets away from the defaults ("pFedLA (head=softmax)")."""
    from pflbench.reports.rows import current_defaults
    from pflbench.reports.cells import printed_value

    defaults = current_defaults(str(cell["algorithm"]))
    changed = [
        f"{k.removeprefix('hp.')}={printed_value(cell[k])}"
        for k in cell.index
        if k.startswith("hp.")
        and not (np.isscalar(cell[k]) and pd.isna(cell[k]))
        and k in defaults
        and printed_value(cell[k]) != defaults[k]
    ]
    return display_name(str(cell["algorithm"])) + (f" ({', '.join(changed)})" if changed else "")


def write_figures(glance: Glance, folder: str | Path, rel: str = "", formats: Sequence[str] = ("png",)) -> None:
    """Figure 6 (the heatmap of the last layer at the shared round) and Figure 5 (client 0's weights over
    rounds) of each α view, under `folder`; their paths (prefixed by `rel`) are set on the views."""
    from pflbench.reports import figures as fig
    from pflbench.reports.document import safe_name

    folder = Path(folder)
    for column in glance.reproduced:
        for view in column.alpha:
            artifacts = read_artifacts(view.path)
            found = artifacts.get("alpha_layers", {}).get(view.round)
            names = None if found is None else [str(n) for n in found]
            stem = safe_name(f"{column.anchor}_{view.cell}")
            fig.alpha_heatmap(
                artifacts["alpha"][view.round],
                folder / f"alpha_{stem}",
                layer=view.layer,
                layer_names=names,
                title=f"{view.label}: α of layer {view.layer}, round {view.round}",
                formats=formats,
            )
            fig.alpha_evolution(
                artifacts["alpha"],
                folder / f"evolution_{stem}",
                client=0,
                layer_names=names,
                title=f"{view.label}: client 0's α over rounds",
                formats=formats,
            )
            view.heatmap = f"{rel}alpha_{stem}.png"
            view.evolution = f"{rel}evolution_{stem}.png"
