"""Where datasets live: the data root (torchvision's layout plus our cache) and an optional offline mirror."""

from __future__ import annotations

import os
from pathlib import Path

ROOT_ENV = "PFLBENCH_DATA"
MIRROR_ENV = "PFLBENCH_DATA_MIRROR"


class DatasetNotFoundError(FileNotFoundError):
    """A dataset is neither cached, nor in the data root, nor in the mirror, nor downloadable here."""


def data_root(root: str | Path | None = None) -> Path:
    """The data root as an absolute path: `root`, else $PFLBENCH_DATA, else ./data (from the current directory)."""
    chosen = root if root is not None else os.environ.get(ROOT_ENV) or "data"
    return Path(chosen).expanduser().resolve()


def data_mirror(mirror: str | Path | None = None) -> Path | None:
    """The offline mirror (a folder laid out like ../shared/data): `mirror`, else $PFLBENCH_DATA_MIRROR, else None."""
    chosen = mirror if mirror is not None else os.environ.get(MIRROR_ENV) or None
    return None if chosen is None else Path(chosen).expanduser().resolve()
