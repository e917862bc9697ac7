"""What a built report is: its files, figures and notes (`Report`), and how store values become file
names (`safe_name`). Shared by the builder (build.py) and the HTML site (site.py)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Report:
    out: Path
    markdown: Path
    latex: Path
    index: Path | None = None
    figures: list[tuple[str, str]] = field(default_factory=list)  # (title, path relative to out)
    cell_figures: dict[str, list[dict]] = field(default_factory=dict)  # hash -> [{title, path, kind}]
    partition_figures: dict[str, str] = field(default_factory=dict)  # hash -> path
    notes: list[str] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # datasets the run left out (progress.py)
    progress: str = ""  # cells still running or unfinished, in words
    heterogeneity: list = field(default_factory=list)  # who copes with what (heterogeneity.py), per study
    differences: dict = field(default_factory=dict)  # table id -> its difference view (differences.py)
    ranks: list = field(default_factory=list)  # ranks across the study, per protocol (ranks.py)


def safe_name(text: str) -> str:
    """A file name from any string (store values may hold anything): safe characters, plus a digest
    when something had to be replaced, so two names never collide."""
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", str(text))[:60].lstrip(".") or "_"
    return clean if clean == str(text) else f"{clean}-{hashlib.sha1(str(text).encode()).hexdigest()[:8]}"
