"""The tutorial's commands, run as written, print what the tutorial shows (docs/tutorial.md).

Steps 1-3 run in a fresh folder exactly as the page gives them: `pflbench new algorithm`, the page's
`mine.yaml`, `pflbench run mine.yaml --dry-run`, `pflbench run mine.yaml --no-ray` and `pflbench report`.
Every line of each output block the page shows (`...` aside) must be a line of the real run's output, up to
the wall-clock times (seconds, ETA) it contains; the cell id and accuracies must match to the digit. Step 4
(the published quick Table 1 with the method added) is checked the same way where Fashion-MNIST can be
loaded. A planted change of a shown number is caught.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"
TIMES = (
    (re.compile(r"\(\d+(?:\.\d+)? s\)"), "(T s)"),
    (re.compile(r"ETA [\dhms]+"), "ETA T"),
    (re.compile(r"in \d+(?:\.\d+)? s\)"), "in T s)"),
)


def blocks(text: str) -> list[tuple[str, str]]:
    """The page's fenced blocks in order: (language, body)."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)]


def after(text: str, command_start: str) -> tuple[str, str]:
    """The command (a bash block's line starting `command_start`, continuations joined) and the text block
    that follows that bash block."""
    found = blocks(text)
    for i, (language, body) in enumerate(found):
        joined = body.replace("\\\n", " ")
        lines = [line.split("  #")[0].strip() for line in joined.splitlines()]
        commands = [line for line in lines if line.startswith(command_start)]
        if language == "bash" and commands:
            shown = found[i + 1][1] if i + 1 < len(found) and found[i + 1][0] == "text" else ""
            return commands[0], shown
    raise AssertionError(f"no bash block with {command_start!r} in the tutorial")


def normalized(line: str) -> str:
    line = " ".join(line.split())
    for pattern, replacement in TIMES:
        line = pattern.sub(replacement, line)
    return line


def missing_lines(shown: str, output: str) -> list[str]:
    """Lines the page shows that the real output does not have (times aside)."""
    real = {normalized(line) for line in output.splitlines()}
    return [
        line for line in shown.splitlines() if line.strip() and line.strip() != "..." and normalized(line) not in real
    ]


def pflbench(command: str, cwd: Path, env: dict | None = None, returncode: int = 0) -> str:
    words = shlex.split(command)
    assert words[0] == "pflbench", command
    env = dict(env or os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))  # this checkout's pflbench
    done = subprocess.run(
        [sys.executable, "-m", "pflbench.cli", *words[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == returncode, f"{command}: {done.stderr[-3000:]}"
    return done.stdout + done.stderr


def test_missing_lines_ignores_times_but_not_numbers():
    output = "finished fedavg · seed 0 · 0ae8442dc3ca  acc 76.2% (adapted 91.9%)  (3.4 s)  [1/6, ETA 21s]\n"
    shown = "finished fedavg · seed 0 · 0ae8442dc3ca  acc 76.2% (adapted 91.9%)  (3.0 s)  [1/6, ETA 16s]\n...\n"
    assert missing_lines(shown, output) == []
    assert missing_lines(shown.replace("76.2%", "76.3%"), output) != []


@pytest.fixture(scope="module")
def new_algorithm(tmp_path_factory) -> tuple[Path, str]:
    """Step 1, `pflbench new algorithm` as the page gives it, run once for the steps that build on it: the
    folder it wrote its files in (copied into each test's folder) and what it printed."""
    folder = tmp_path_factory.mktemp("new")
    output = pflbench(after(TUTORIAL.read_text(), "pflbench new algorithm")[0], folder)
    return folder, output


@pytest.mark.slow
def test_the_tutorials_first_three_steps_print_what_it_shows(tmp_path, new_algorithm):
    text = TUTORIAL.read_text()
    _, shown_new = after(text, "pflbench new algorithm")
    written, output = new_algorithm
    assert missing_lines(shown_new, output) == []
    shutil.copytree(written, tmp_path, dirs_exist_ok=True)
    spec = next(body for language, body in blocks(text) if language == "yaml" and body.startswith("name: mine"))
    (tmp_path / "mine.yaml").write_text(spec)
    dry, _ = after(text, "pflbench run mine.yaml --dry-run")
    assert re.search(r"\b6 cells\b", pflbench(dry, tmp_path))  # "It prints the 6 cells"
    run, shown_run = after(text, "pflbench run mine.yaml --no-ray")
    assert missing_lines(shown_run, pflbench(run, tmp_path)) == []
    report, _ = after(text, "pflbench report --results results")
    output = pflbench(report, tmp_path)
    shown_table = next(body for language, body in blocks(text) if language == "text" and body.startswith("## Accuracy"))
    assert missing_lines(shown_table, output) == []
    planted = shown_table.replace("75.26", "75.62")
    assert planted != shown_table and missing_lines(planted, output) != []


@pytest.mark.slow
def test_the_tutorials_table1_step_prints_what_it_shows(tmp_path, new_algorithm):
    from pflbench.data import DATASETS

    mirror = Path(os.environ.get("PFLBENCH_DATA_MIRROR", "/nonexistent"))
    if not (mirror / "fashion-mnist").exists():
        pytest.skip("Fashion-MNIST is not in $PFLBENCH_DATA_MIRROR: step 4 needs it")
    assert "fmnist" in DATASETS.names()
    text = TUTORIAL.read_text()
    shutil.copytree(new_algorithm[0], tmp_path, dirs_exist_ok=True)
    shutil.copytree(ROOT / "results" / "published" / "table1-quick", tmp_path / "t1")
    run, shown = after(text, "pflbench run table1 --scale quick")
    env = dict(os.environ, PFLBENCH_DATA=str(tmp_path / "data"))
    assert missing_lines(shown, pflbench(run, tmp_path, env)) == []


OWN_METHOD = ROOT / "docs" / "howto" / "own-method.md"


def old_form_example() -> tuple[str, str, str]:
    """docs/howto/own-method.md's old-form plugin: its file, the command the page runs it with (in its folder),
    and the notice the page shows (its wrapped lines joined)."""
    found = blocks(OWN_METHOD.read_text())
    (i,) = [i for i, (language, body) in enumerate(found) if language == "python" and "class OldAvg" in body]
    (language, command), (shown_language, shown) = found[i + 1], found[i + 2]
    assert (language, shown_language) == ("bash", "text")
    folder, _, command = command.strip().partition(" && ")
    assert folder == "cd /home/me", folder
    return found[i][1], command, " ".join(shown.split())


@pytest.mark.slow
def test_the_old_form_refusal_on_the_own_method_page_is_what_the_command_prints(tmp_path):
    plugin, command, shown = old_form_example()
    (tmp_path / "old_avg.py").write_text(plugin)
    output = pflbench(command + f" --results {tmp_path / 'results'}", tmp_path, returncode=2)
    refusals = [line for line in output.splitlines() if "retired forms" in line]
    assert len(refusals) == 1 and len(output.strip().splitlines()) == 1, output  # one line, before any work
    assert shown == refusals[0].replace(str(tmp_path), "/home/me")
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir()), "nothing may run"
    planted = shown.replace("old_avg.py:13", "old_avg.py:12")
    assert planted != refusals[0].replace(str(tmp_path), "/home/me")
