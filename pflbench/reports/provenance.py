"""Where a published number comes from, as the pages show it: a study's facts (commit, machine, date,
wall time, state) and a cell's "Reproduce" commands. Read by the study index (studies.py) and by every
page of a study's site (site.py)."""

from __future__ import annotations

import re

from pathlib import Path

from pflbench.studies.publish import reproduce_commands, study_state


def machine_text(machine: dict) -> str:
    parts = [machine.get("cpu_model") or "CPU not recorded"]
    if machine.get("cpu_cores"):
        parts[0] += f" ({machine['cpu_cores']} cores)"
    if machine.get("gpu_model"):
        parts.append(machine["gpu_model"])
    return ", ".join(parts)


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = float(seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    return (
        f"{seconds:.0f} s"
        if seconds < 120
        else (f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h")
    )


def lead_sentence(note: str) -> tuple[str, str]:
    """A manifest's note as (what the study is, the rest): its first sentence, outside parentheses, and the
    history that follows (resumes, loads, worktrees), which a study's pages fold away."""
    depth = 0
    for i, char in enumerate(note):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "." and depth <= 0 and (i + 1 == len(note) or note[i + 1] == " ") and i >= 20:
            return note[: i + 1], note[i + 1 :].strip()
    return note, ""


ISSUE_LEAD = re.compile(r"^[Ii]ssue \d+(?:, item \d+)?(?: control)?[,:]?\s*")


def heading(lead: str) -> str:
    """A study's heading from its note's lead: without what is in parentheses and without the project's own
    issue numbers, which mean nothing to a reader ("pFedLA Table 1, FashionMNIST column, 10 clients, at the
    paper's settings, seed 0; ...")."""
    text, depth = "", 0
    for char in ISSUE_LEAD.sub("", lead):
        depth += char == "("
        if depth == 0:
            text += char
        depth -= char == ")" and depth > 0
    text = " ".join(text.split()).replace(" ,", ",").replace(" :", ":").rstrip(".,;: ")
    first = text.split(" ", 1)[0]
    return text[:1].upper() + text[1:] if first.islower() else text  # "at 600 rounds", not "pFedLA"


def banner_lead(lead: str) -> str:
    """The note's lead as the study's banner shows it: without the project's own issue number in front."""
    text = ISSUE_LEAD.sub("", lead)
    return text[:1].upper() + text[1:] if text.split(" ", 1)[0].islower() else text


def study_facts(store: str | Path) -> dict | None:
    """What every page of a published study shows about it; None for a store that is not one."""
    state = study_state(Path(store).resolve())
    if state is None:
        return None
    m = state.manifest
    commit = m.get("commit") or ""
    wall = m.get("wall_time") or {}
    return {
        "name": Path(store).name,
        "command": m.get("command") or "",
        "commit": commit,
        "commit_short": commit[:10] or "unknown",
        "dirty": bool(m.get("dirty")),
        "same_commit": bool(commit) and commit == state.commit_now,
        "machines": [f"{machine_text(x)}: {x.get('cells')} cells" for x in m.get("machines") or []],
        "versions": m.get("versions") or {},
        "date": m.get("date") or "–",
        "published_at": m.get("published_at") or "–",
        "elapsed": duration_text(wall.get("elapsed_seconds")),
        "cell_time": duration_text(wall.get("cell_seconds")),
        "statuses": m.get("statuses") or {},
        "missing": len(m.get("missing") or []),
        "cells": len(m.get("cells") or {}),
        "note": m.get("note") or "",
        "note_lead": banner_lead(lead_sentence(m.get("note") or "")[0]),
        "note_rest": lead_sentence(m.get("note") or "")[1],
        "heading": heading(lead_sentence(m.get("note") or "")[0]),
        "state": state.label,
        "stale": state.stale,
        "failed": state.failed,
        "incomplete": state.incomplete,
    }


def cell_provenance(store: str | Path, cell_id: str) -> dict | None:
    """A cell page's "Reproduce" section: the commands, and the study's facts; None outside a study."""
    from pflbench.storage.store import SUMMARY, read_json_dict

    facts = study_facts(store)
    if facts is None:
        return None
    try:
        summary = read_json_dict(Path(store) / cell_id / SUMMARY)
    except (OSError, ValueError):
        summary = {}
    machine = machine_text(summary) if summary.get("cpu_model") else None
    return {**reproduce_commands(store, cell_id), "study": facts, "machine": machine}
