"""MkDocs hook: links written for the repository also work on the site, and a broken one fails the build.

The docs pages, and the write-ups copied under docs/repo/ by docs/gen_reference.py, link to files as the
repository lays them out (`../benchmarks/README.md`, `../../pflbench/algorithms/pfedla.py`), so they read right on
GitHub too. Here, each relative link is resolved against the file's place in the repository:

- a page of the site (under docs/, or a write-up mirrored under docs/repo/) becomes a link to that page;
- another file of the repository (a source file, a spec) becomes its path in code (the site holds no
  sources);
- anything else is left as written, and `mkdocs build --strict` fails on it (a broken link).

The generated reference pages quote the published studies' manifest notes, written while the project was
built; their mentions of the project's own issue numbers (`(issue 40)`, `Issue 58, item 1: ...`) mean
nothing to a reader of the site, so they are dropped from those pages as shown (`without_issue_numbers`;
the manifests keep them).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"(?<!\!)\[([^\]\n]+)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def source_of(src_uri: str) -> Path:
    """Where the page's text lives in the repository."""
    if src_uri.startswith("repo/"):
        return ROOT / src_uri[len("repo/"):]
    return DOCS / src_uri


def site_path(target: Path) -> Path | None:
    """The docs/ file that shows `target` on the site, if any."""
    if target.is_dir() and not any((target / name).is_file() for name in ("index.md", "README.md")):
        return None  # a folder of data files: no page shows it
    if target.is_relative_to(DOCS) and target.exists():
        return target
    mirrored = DOCS / "repo" / target.relative_to(ROOT) if target.is_relative_to(ROOT) else None
    if mirrored is not None and mirrored.exists():
        return mirrored
    return None


def rewrite(markdown: str, src_uri: str) -> str:
    page_source = source_of(src_uri)
    page_site = DOCS / src_uri

    def one(match: re.Match) -> str:
        label, url = match.group(1), match.group(2)
        if re.match(r"^[a-z]+:", url) or url.startswith(("#", "/")):
            return match.group(0)
        path, _, anchor = url.partition("#")
        target = Path(os.path.normpath(page_source.parent / path))
        shown = site_path(target)
        if shown is not None:
            rel = os.path.relpath(shown, page_site.parent).replace(os.sep, "/")
            if target.is_dir() and not rel.endswith("/"):
                rel += "/"
            return f"[{label}]({rel}{'#' + anchor if anchor else ''})"
        if target.exists() and target.is_relative_to(ROOT):
            repo_path = target.relative_to(ROOT).as_posix()
            plain = label.strip("`")
            return f"`{repo_path}`" if plain in (repo_path, path, Path(repo_path).name) else f"{label} (`{repo_path}`)"
        return match.group(0)  # broken: mkdocs --strict reports it

    out, fenced = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        out.append(line if fenced or FENCE.match(line) else LINK.sub(one, line))
    return "\n".join(out)


ISSUE_REFS = (
    (re.compile(r"\s*\([Ii]ssue \d+(?:, item \d+)?\)"), ""),            # "(issue 40)"
    (re.compile(r"\([Ii]ssue \d+(?:, item \d+)?[;,]\s*"), "("),          # "(issue 40; ..."
    (re.compile(r",\s*[Ii]ssue \d+(?:, item \d+)?\)"), ")"),             # "..., issue 58, item 3)"
    (re.compile(r"\b[Ii]ssue \d+'s "), "the "),                           # "issue 29's corrected ..."
    (re.compile(r"\b[Ii]ssue \d+ control: "), "Control: "),               # "Issue 32 control: ..."
    (re.compile(r"\b[Ii]ssue \d+(?:, item \d+)?[:,]\s*(\w)"), r"\1"),  # "Issue 58, item 1: Table"
)


def without_issue_numbers(markdown: str) -> str:
    for pattern, replacement in ISSUE_REFS:
        markdown = pattern.sub(replacement, markdown)
    return markdown


def on_page_markdown(markdown, page, config, files):
    markdown = rewrite(markdown, page.file.src_uri)
    if page.file.src_uri.startswith("reference/"):
        markdown = without_issue_numbers(markdown)
    return markdown
