"""The documentation cannot drift from the code (issue 61).

The reference pages are generated from the code (docs/gen_reference.py): these tests run the generator
and check that each page carries what the code declares (every algorithm with each hyperparameter's
default, every subcommand and option, every cell key, scheme, dataset and published study). The pages
written by hand (README.md, docs/**/*.md) are checked against the code where they name it: every
`pflbench SUBCOMMAND --option` they show is an option of that subcommand, every `make TARGET` a target,
every study they name one in results/published/, every relative link a file. Each check is also shown
failing on a planted mismatch. No network, no MkDocs (`make docs` builds the site; CI runs it).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen():
    return load_generator()


@pytest.fixture(scope="module")
def pages(generated_reference):
    return {path.name: path.read_text() for path in generated_reference.glob("*.md")}


# ---- the generated reference against the code -------------------------------------------------------


def section(page: str, heading: str) -> str:
    """The text of the `## heading` section of a page (up to the next `## `)."""
    start = page.index(f"## {heading}")
    end = page.find("\n## ", start + 1)
    return page[start : end if end >= 0 else len(page)]


def algorithm_problems(page: str) -> list[str]:
    from pflbench.algorithm import ALGORITHMS, get_algorithm

    get_algorithm("fedavg")
    problems = []
    for name, cls in ALGORITHMS.items():
        if f"## `{name}`" not in page:
            problems.append(f"{name}: no section")
            continue
        text = section(page, f"`{name}`")
        for key, field in cls.Hyperparams.model_fields.items():
            default = field.get_default(call_default_factory=True)
            if not re.search(rf"\| `{re.escape(key)}` \| `{re.escape(repr(default))}` \|", text):
                problems.append(f"{name}.{key}: default {default!r} not on its page")
        for key, space in cls.search_space.items():
            if space[0] not in text:
                problems.append(f"{name}.{key}: search space {space!r} not on its page")
        if cls.card.paper and cls.card.paper.split(",")[0] not in text:
            problems.append(f"{name}: paper {cls.card.paper!r} not on its page")
    return problems


def test_every_algorithm_has_its_card_defaults_and_search_space(pages):
    assert algorithm_problems(pages["algorithms.md"]) == []


def test_a_planted_default_mismatch_is_caught(pages):
    page = pages["algorithms.md"]
    planted = page.replace("| `hn_lr` | `0.01` |", "| `hn_lr` | `0.02` |", 1)
    assert planted != page
    assert any("hn_lr" in problem for problem in algorithm_problems(planted))


def test_every_subcommand_and_option_is_on_the_cli_page(gen, pages):
    page = pages["cli.md"]
    commands = gen.cli_commands()
    assert {
        "run",
        "list",
        "report",
        "sweep",
        "data prepare",
        "bench",
        "publish",
        "verify",
        "rerun",
        "watch",
        "leaderboard",
        "new algorithm",
    } <= set(commands)
    for path, parser in commands.items():
        assert f"`pflbench {path}`" in page, path
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in page or f", {option}" in page, f"pflbench {path} {option}"


def test_every_cell_key_and_spec_part_is_on_the_spec_page(pages):
    from pflbench.run import spec_schema
    from pflbench.config import CellConfig

    page = pages["spec.md"]
    for key in CellConfig.model_fields:
        assert f"| `{key}` |" in page, key
    for key, field in spec_schema.SpecFile.model_fields.items():
        assert f"| `{field.alias or key}` |" in page, key


def test_every_scheme_dataset_and_study_has_a_section(pages):
    from pflbench.data import DATASETS
    from pflbench.data.partitioning import PARTITIONS
    from pflbench.loader.plugins import load_builtins

    load_builtins()
    for name in PARTITIONS.names():
        assert f"## `{name}`" in pages["partitions.md"], name
    for name in DATASETS.names():
        assert f"## `{name}`" in pages["datasets.md"], name
    for manifest in (ROOT / "results" / "published").glob("*/manifest.json"):
        assert f"| `{manifest.parent.name}` |" in pages["studies.md"], manifest.parent.name


def test_the_api_page_names_every_public_module(gen, pages):
    for module in gen.PUBLIC_MODULES:
        assert f"::: {module}" in pages["api.md"]
        assert importlib.util.find_spec(module) is not None


# ---- the pages written by hand against the code ------------------------------------------------------


def hand_written() -> list[Path]:
    docs = [
        p for p in (ROOT / "docs").rglob("*.md") if p.relative_to(ROOT / "docs").parts[0] not in ("reference", "repo")
    ]
    return [ROOT / "README.md", *sorted(docs)]


def command_lines(text: str) -> list[str]:
    """The `pflbench ...` and `make ...` commands a page shows: in code blocks and in inline code."""
    found = []
    fenced = False
    block: list[str] = []
    for line in text.splitlines():
        if re.match(r"^\s*(```|~~~)", line):
            fenced = not fenced
            continue
        if fenced:
            block.append(line)
    joined = "\n".join(block).replace("\\\n", " ")
    found += [line.split(" #", 1)[0] for line in joined.splitlines()]
    found += re.findall(r"`([^`\n]*(?:pflbench|make) [^`\n]*)`", text)
    return [line for line in found if re.search(r"(^|[\s/;(])(pflbench|make) ", line)]


def cli_option_problems(text: str, where: str) -> list[str]:
    from pflbench.cli import build_parser

    problems = []
    top = build_parser()
    for line in command_lines(text):
        try:
            tokens = shlex.split(line)
        except ValueError:
            tokens = line.split()
        for start, token in enumerate(tokens):
            if token.endswith("pflbench") and token.rsplit("/", 1)[-1] == "pflbench":
                parser, path = top, []
                rest = tokens[start + 1 :]
                while rest:
                    subs = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
                    if rest[0] not in subs:
                        break
                    parser, path, rest = subs[rest[0]], [*path, rest[0]], rest[1:]
                if not path:
                    continue
                options = {o for a in parser._actions for o in a.option_strings}
                for word in rest:
                    if word in ("|", "&&", ";", "||") or word.endswith(("pflbench", ";")):
                        break
                    option = word.strip("[]").split("=", 1)[0]
                    if option.startswith("--") and option not in options:
                        problems.append(f"{where}: `pflbench {' '.join(path)} {option}`: no such option")
    return problems


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    targets = set()
    for match in re.finditer(r"^([\w. -]+?):(?!=)", text, flags=re.M):
        targets.update(match.group(1).split())
    return targets


def make_problems(text: str, where: str) -> list[str]:
    targets = makefile_targets()
    problems = []
    for line in command_lines(text):
        for target in re.findall(r"(?:^|[\s;(])make ([a-z][\w-]*)", line):
            if target not in targets:
                problems.append(f"{where}: `make {target}`: no such target")
    return problems


STUDY = re.compile(r"`((?:table[12]|demo|survey|crosscheck|heterogeneity)[\w-]*)`")


def study_problems(text: str, where: str) -> list[str]:
    published = {p.name for p in (ROOT / "results" / "published").iterdir() if p.is_dir()}
    problems = [
        f"{where}: results/published/{name}: no such study"
        for name in re.findall(r"results/published/([\w.-]*\w)", text)
        if "." not in name and name not in published
    ]  # files there (fingerprints.json) are made by commands
    for name in STUDY.findall(text):
        looks_like_study = not re.search(r"\.(ya?ml|py|md|csv)$", name) and name not in ("table1", "table2")
        if (
            looks_like_study
            and name not in published
            and f"{name}.yaml" not in {p.name for p in (ROOT / "benchmarks").glob("*.yaml")}
        ):
            problems.append(f"{where}: study `{name}` is not in results/published/")
    return problems


def link_problems(text: str, path: Path) -> list[str]:
    problems = []
    for target in re.findall(r"\]\(([^)\s#:]+)(?:#[^)]*)?\)", text):
        resolved = (path.parent / target).resolve()
        generated = (
            resolved.is_relative_to(ROOT / "docs" / "reference")  # made by `make docs`
            or resolved == ROOT / "docs" / "results.md"
        )  # (docs/gen_reference.py)
        if not resolved.exists() and not generated:
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            problems.append(f"{where}: link to {target}, which does not exist")
    return problems


def test_hand_written_pages_show_only_options_targets_studies_and_links_that_exist():
    problems = []
    for path in hand_written():
        text, where = path.read_text(), str(path.relative_to(ROOT))
        problems += cli_option_problems(text, where) + make_problems(text, where)
        problems += study_problems(text, where) + link_problems(text, path)
    assert problems == []


def test_planted_mismatches_in_a_hand_written_page_are_caught(tmp_path):
    page = tmp_path / "page.md"
    text = (
        "```bash\npflbench run SPEC --dry-run --workerz 2\nmake reproduce-table3\n```\n"
        "The study `demo-ci-synthetic`, see [the guide](missing.md) and `pflbench report --no-such`.\n"
    )
    page.write_text(text)
    assert cli_option_problems(text, "page") == [
        "page: `pflbench run --workerz`: no such option",
        "page: `pflbench report --no-such`: no such option",
    ]
    assert make_problems(text, "page") == ["page: `make reproduce-table3`: no such target"]
    assert study_problems(text, "page") == ["page: study `demo-ci-synthetic` is not in results/published/"]
    assert len(link_problems(text, page)) == 1


def test_the_readme_is_short_and_says_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "make demo" in text and "make test" in text
