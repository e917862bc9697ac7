"""The documentation site is for users: no project process in its pages.

Every page the site builds — the pages written by hand under docs/, the repository's write-ups it mirrors
(docs/gen_reference.py's MIRRORED) and the generated reference pages as docs/hooks.py shows them — is read
for the project's own issue numbers ("issue 58") and for paths of this workplace's machines (/work/...,
/root/...); the files the site copies as they are (logs, JSON) for the paths. The maintainers' process
lives in contributing/, outside docs_dir, so the site never builds it. Each check is shown failing on a
planted line. No MkDocs needed (`make docs` builds the site).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

ISSUE = re.compile(r"\b[Ii]ssues? \d+")
MACHINE_PATH = re.compile(
    r"(?<![\w.$])/(?:work|root|tmp)/"
)  # this workplace's, a scratch folder's (a "/home/me/..." example is no one's)


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site_pages(generated_reference) -> dict[str, str]:
    """{page: its Markdown as the site renders it}: hand-written, mirrored and generated pages."""
    gen = load("gen_reference", DOCS / "gen_reference.py")
    hooks = load("docs_hooks", DOCS / "hooks.py")
    pages = {
        str(p.relative_to(ROOT)): p.read_text()
        for p in DOCS.rglob("*.md")
        if p.relative_to(DOCS).parts[0] not in ("reference", "repo")
    }
    pages |= {name: (ROOT / name).read_text() for name in gen.MIRRORED}
    for path in generated_reference.glob("*.md"):
        pages[f"docs/reference/{path.name}"] = hooks.on_page_markdown(
            path.read_text(), _Page(f"reference/{path.name}"), None, None
        )
    return pages


class _Page:  # what docs/hooks.py reads of MkDocs' page: its file's src_uri
    def __init__(self, src_uri: str):
        self.file = type("File", (), {"src_uri": src_uri})()


def process_problems(pages: dict[str, str]) -> list[str]:
    problems = []
    for name, text in pages.items():
        for number, line in enumerate(text.splitlines(), 1):
            if ISSUE.search(line):
                problems.append(f"{name}:{number}: an issue number: {ISSUE.search(line).group(0)!r}")
            if MACHINE_PATH.search(line):
                problems.append(f"{name}:{number}: a machine's path: {line.strip()[:80]!r}")
    return problems


def test_the_sites_pages_name_no_issue_and_no_machine_path(site_pages):
    assert len(site_pages) > 40  # every page, the generated ones included
    assert process_problems(site_pages) == []


def test_the_files_the_site_copies_name_no_machine_path():
    copied = [
        p
        for p in DOCS.rglob("*")
        if p.is_file()
        and p.suffix in (".log", ".json", ".csv", ".txt", ".css")
        and p.relative_to(DOCS).parts[0] not in ("reference", "repo")
    ]
    problems = [
        f"{p.relative_to(ROOT)}: {m.group(0)}"
        for p in copied
        for m in [MACHINE_PATH.search(p.read_text(errors="replace"))]
        if m
    ]
    assert problems == []


def test_a_planted_issue_number_or_machine_path_is_caught():
    pages = {
        "docs/x.md": "Measured for issue 58, item 1.\nfine\n",
        "docs/y.md": "data in /work/shared/data\n",
        "docs/z.md": "`$OUT/work/kernels.json` and results/published/x: no machine path\n",
        "docs/w.md": "`pflbench report --out /tmp/table1-full`\n",
    }
    assert process_problems(pages) == [
        "docs/x.md:1: an issue number: 'issue 58'",
        "docs/y.md:1: a machine's path: 'data in /work/shared/data'",
        "docs/w.md:1: a machine's path: '`pflbench report --out /tmp/table1-full`'",
    ]


def test_the_generated_studies_page_drops_the_manifests_issue_numbers():
    hooks = load("docs_hooks", DOCS / "hooks.py")
    note = "| Issue 58, item 1: Table 1's column (issue 40), seed 1 (issue 40; a new split, issue 58, item 3) |"
    assert hooks.without_issue_numbers(note) == "| Table 1's column, seed 1 (a new split) |"
    assert hooks.without_issue_numbers("Issue 32 control: Local") == "Control: Local"


def test_the_maintainers_process_is_outside_the_site():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))
    assert config["docs_dir"] == "docs"
    assert (ROOT / "contributing" / "inflight.md").exists() and not (DOCS / "inflight.md").exists()
    assert (ROOT / "contributing" / "gpu-check.md").exists()
    nav = yaml.safe_dump(config["nav"])
    assert "inflight" not in nav and "contributing" not in nav
    gpu = (DOCS / "howto" / "gpu.md").read_text()
    assert "--ray-address" in gpu and "resources" in gpu and "loan" not in gpu and "lent" not in gpu


def test_search_works_offline_and_tables_have_room():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    plugins = [p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]]
    assert "offline" in plugins and "search" in plugins  # Material's offline plugin: search from file://
    assert config["use_directory_urls"] is False
    css = [DOCS / path for path in config["extra_css"]]
    assert any(re.search(r"\.md-grid\s*\{[^}]*max-width:\s*\d+px", p.read_text()) for p in css)


def test_license_and_citation_agree_with_the_package():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "MIT"}
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0"
    assert {"message", "title", "authors"} <= set(citation) and citation["authors"]
    assert citation["version"] == project["version"] and citation["license"] == "MIT"


def test_the_readme_states_requirements_times_and_shows_the_leaderboard():
    import tomllib

    text = (ROOT / "README.md").read_text()
    python = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    low, high = re.fullmatch(r">=(3\.\d+),<(3\.\d+)", python).groups()
    assert f"Python {low}" in text and f"`{python}`" in text
    assert "GPU is optional" in text
    for command in ("make demo", "make test"):
        assert re.search(rf"`{command}` [^.]*\d+ minutes", text), f"no time for {command}"
    picture = re.search(r"!\[[^\]]+\]\((docs/images/[\w.-]+\.png)\)", text)
    assert picture is not None
    image = ROOT / picture.group(1)
    assert image.exists() and image.stat().st_size < 300_000 and image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "docs/results.md" in text and "LICENSE" in text and "CITATION.cff" in text
