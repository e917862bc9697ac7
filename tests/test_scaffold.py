"""`pflbench new algorithm|partition`: the files it writes are plugins that load, and the tests it
writes pass (run by pytest as a user would, outside this repository); they pass the repository's own
`ruff check` and `mypy` and override only what their starting point changes; the method is named as the
user spells it or as the built-ins spell its words; bad names are refused. The README's FedAvgM is the
scaffold's output filled in, passes the same lint, and its commands run as written."""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import shlex
import subprocess
import tokenize
import sys
from pathlib import Path

import pytest

from pflbench.cli import main


@pytest.mark.slow
def test_every_scaffold_writes_a_plugin_whose_own_test_passes(tmp_path, capsys):
    for base in ("fedavg", "fedprox", "fedper", "ditto"):
        assert main(["new", "algorithm", f"my-{base}", "--from", base, "--out", str(tmp_path)]) == 0
    assert main(["new", "partition", "my-shards", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "--plugin" in out and "algorithm+=[my-fedprox]" in out
    assert sorted(p.name for p in tmp_path.glob("*.py")) == [
        "my_ditto.py",
        "my_fedavg.py",
        "my_fedper.py",
        "my_fedprox.py",
        "my_shards.py",
        "test_my_ditto.py",
        "test_my_fedavg.py",
        "test_my_fedper.py",
        "test_my_fedprox.py",
        "test_my_shards.py",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    assert "14 passed" in done.stdout  # each algorithm's three tests, the resume check among them; the partition's two
    for base in ("fedavg", "fedprox", "fedper", "ditto"):
        written = (tmp_path / f"test_my_{base}.py").read_text()
        assert "from pflbench.run.testing import check_resume" in written and "check_resume(" in written


def test_a_scaffold_refuses_a_taken_or_malformed_name_and_existing_files(tmp_path, capsys):
    assert main(["new", "algorithm", "fedavg", "--out", str(tmp_path)]) == 2
    assert "algorithm 'fedavg' already exists (built-in)" in capsys.readouterr().err
    assert main(["new", "partition", "Dirichlet Two", "--out", str(tmp_path)]) == 2
    assert "letters, digits and single dashes" in capsys.readouterr().err
    assert main(["new", "algorithm", "FedAvg", "--out", str(tmp_path)]) == 2  # registered in lowercase: taken
    assert "algorithm 'fedavg' already exists (built-in)" in capsys.readouterr().err
    assert main(["new", "partition", "stripes", "--out", str(tmp_path)]) == 0
    before = (tmp_path / "stripes.py").read_text()
    assert main(["new", "partition", "stripes", "--out", str(tmp_path)]) == 2
    assert "exists; nothing was written" in capsys.readouterr().err
    assert (tmp_path / "stripes.py").read_text() == before
    assert not list(tmp_path.glob("*.pyc")) and not (tmp_path / "stripes").exists()


def test_a_scaffold_refuses_the_built_ins_folders(capsys):
    """A scaffold is a plugin and its test: in pflbench/algorithms or pflbench/partitions the package would
    import the test file as a built-in, so the scaffold says so and writes nothing."""
    package = Path(__file__).resolve().parents[1] / "pflbench"
    for kind, folder in (("algorithm", "algorithms"), ("partition", "partitions")):
        before = sorted(p.name for p in (package / folder).iterdir())
        assert main(["new", kind, "my-thing", "--out", str(package / folder)]) == 2
        err = capsys.readouterr().err
        assert f"new {kind}: " in err and "is the folder of pflbench's built-in" in err and "--out" in err
        assert sorted(p.name for p in (package / folder).iterdir()) == before


def test_the_scaffold_writes_the_hooks_in_their_current_form(tmp_path):
    """The written methods use the round's context (no retired form) and annotate it;
    their hyperparameters are the class's generic argument (`self.hp` is typed)."""
    import inspect

    from pflbench.loader import plugins
    from pflbench.loader import retired
    from pflbench.algorithm import ALGORITHMS, ClientRound, Round
    from pflbench.cli.scaffold import BASES, identifiers, write_scaffold

    for base in BASES:
        path, _ = write_scaffold("algorithm", f"current-{base}", tmp_path, base=base)
        plugins.load([str(path)])
        try:
            cls = ALGORITHMS.get(f"current-{base}")
            for hook in ("configure", "receive", "local_train", "send", "aggregate"):
                if hook in vars(cls):
                    first = list(inspect.signature(vars(cls)[hook]).parameters.values())[1]
                    assert first.name == "rnd" and first.annotation in ("Round", "ClientRound", Round, ClientRound), (
                        base,
                        hook,
                    )
            hp_class = identifiers(f"current-{base}")["class_name"] + "HP"  # e.g. CurrentFedAvgHP
            assert cls.Hyperparams.__name__ == hp_class  # Algorithm[XHP] made XHP its Hyperparams
            assert retired.old_forms(cls) == []
        finally:
            plugins.unload(path.name)  # a plugin's id is its file name


ROOT = Path(__file__).resolve().parents[1]
HOOKS = (
    "configure",
    "receive",
    "local_train",
    "send",
    "aggregate",
    "personalized",
    "evaluate",
    "adapt_locally",
    "newcomer_models",
    "setup",
    "is_local",
)


def ruff_problems(folder: Path) -> str:
    """`ruff check` with the repository's settings (pyproject.toml) on `folder`: its report, "" when clean."""
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[lint]', as `make lint` does)")
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr


def mypy_problems(*files: Path) -> str:
    """`mypy` with the repository's settings (pyproject.toml's [tool.mypy]) on `files`: its report, "" when
    clean. Its cache is the repository's (warm after `make lint`: seconds; cold: a minute or two)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[lint]', as `make lint` does)")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--python-executable",
            sys.executable,
            *map(str, files),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr


def code_lines(source: str) -> list[str]:
    """The code of `source`, line by line and stripped: no comments, docstrings or blank lines."""
    docstrings = {
        line
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
    }
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    return [line.strip() for number, line in enumerate(lines, 1) if number not in docstrings and line.strip()]


def _tiny_cell(name: str, **hp):
    from pflbench.run.spec import resolve_cell

    return resolve_cell(
        {
            "algorithm": name,
            "dataset": "synthetic",
            "dataset_options": {"num_samples": 1000},
            "partition": "pathological",
            "partition_params": {"classes_per_client": 3},
            "clients": 5,
            "rounds": 3,
            "local_epochs": 1,
            "batch_size": 16,
            "lr": 0.05,
            "hp": hp,
        }
    )


def test_the_written_files_pass_the_repositorys_ruff_check_and_fedavgs_pastes_no_hook(tmp_path):
    from pflbench.loader import plugins
    from pflbench.algorithm import ALGORITHMS
    from pflbench.simulator.rounds import run_cell
    from pflbench.cli.scaffold import BASES, write_scaffold

    for base in BASES:
        write_scaffold("algorithm", f"lint-{base}", tmp_path, base=base)
    write_scaffold("partition", "lint-shards", tmp_path)
    assert ruff_problems(tmp_path) == ""
    path = tmp_path / "lint_fedavg.py"
    plugins.load([str(path)])
    try:
        cls = ALGORITHMS.get("lint-fedavg")
        assert not [hook for hook in HOOKS if hook in vars(cls)]  # FedAvg is the base class: nothing pasted
        assert "self.weighted_mean(upload)" in path.read_text()  # where a server step of its own starts
        result = run_cell(_tiny_cell("lint-fedavg"), data_root=tmp_path)  # one tiny cell of the new method
        assert result.status == "finished", result.error
    finally:
        plugins.unload(path.name)


def test_the_method_is_named_as_spelled_or_as_the_built_ins_spell_its_words(tmp_path, capsys):
    from pflbench.cli.scaffold import identifiers

    def named(name, display=None):
        values = identifiers(name, "algorithm", display)
        return values["name"], values["class_name"], values["display_name"]

    assert named("fedavgm") == ("fedavgm", "FedAvgM", "FedAvgM")
    assert named("FedAvgM") == ("fedavgm", "FedAvgM", "FedAvgM")
    assert named("lg-fedavgm") == ("lg-fedavgm", "LGFedAvgM", "LGFedAvgM")
    assert named("LG-FedAvgM") == ("lg-fedavgm", "LGFedAvgM", "LG-FedAvgM")
    assert named("pfedmex") == ("pfedmex", "PFedMeX", "pFedMeX")  # a class name starts with a capital
    assert named("my-method") == ("my-method", "MyMethod", "MyMethod")
    assert named("localsgd") == ("localsgd", "Localsgd", "Localsgd")  # "Local" says nothing a capital does not
    assert named("srv-mom", "FedAvg (server momentum)") == (
        "srv-mom",
        "FedAvgServerMomentum",
        "FedAvg (server momentum)",
    )
    assert main(["new", "algorithm", "FedAvgM", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pflbench run quickstart --plugin" in out and "algorithm+=[fedavgm]" in out
    text = (tmp_path / "fedavgm.py").read_text()
    assert '@ALGORITHMS.register("fedavgm"' in text and "class FedAvgM(FedAvg[FedAvgMHP]):" in text
    assert "class FedAvgMHP(Hyperparams):" in text
    assert 'display_name="FedAvgM"' in text and (tmp_path / "test_fedavgm.py").is_file()
    assert main(["new", "algorithm", "odd", "--display-name", 'Say "hi"', "--out", str(tmp_path)]) == 0
    assert ruff_problems(tmp_path) == ""  # a display name with quotes is still a valid literal


def test_every_starting_point_passes_ruff_and_mypy_and_runs_a_cell(tmp_path):
    """From FedAvg (no hook), Ditto (a personal model and a custom objective) and FedProx (a custom
    objective) and FedPer: the method and its test pass the repository's ruff and mypy (typed `self.hp`,
    annotated objectives), and the method runs one tiny cell."""
    from pflbench.loader import plugins
    from pflbench.simulator.rounds import run_cell
    from pflbench.cli.scaffold import BASES, identifiers, write_scaffold

    assert {"fedavg", "ditto", "fedprox"} <= set(BASES)
    written = [path for base in BASES for path in write_scaffold("algorithm", f"typed-{base}", tmp_path, base=base)]
    assert ruff_problems(tmp_path) == ""
    assert mypy_problems(*written) == ""
    for base in BASES:
        path = tmp_path / f"typed_{base}.py"
        text = path.read_text()
        hp = identifiers(f"typed-{base}")["class_name"] + "HP"  # e.g. TypedFedAvgHP
        assert f"class {hp}(Hyperparams):" in text and f"(FedAvg[{hp}]):" in text
        assert "    class Hyperparams" not in text  # the nested form mypy cannot resolve
        plugins.load([str(path)])
        try:
            result = run_cell(_tiny_cell(f"typed-{base}"), data_root=tmp_path)
            assert result.status == "finished", (base, result.error)
            assert 0.0 <= result.summary["final_accuracy"] <= 1.0
        finally:
            plugins.unload(path.name)


def test_mypy_sees_a_wrong_hyperparameter_or_a_hook_of_the_wrong_type_in_a_written_method(tmp_path):
    """The check above is not vacuous: a hook reading a field its hyperparameters do not have fails mypy,
    and so does a hook handing the next one another type than the method declares (`Algorithm`'s
    Received / Trained parameters: a FedAvg-based method's client hooks hand each other a State)."""
    from pflbench.cli.scaffold import write_scaffold

    path, _ = write_scaffold("algorithm", "typo-prox", tmp_path, base="fedprox")
    path.write_text(path.read_text().replace("mu = self.hp.mu", "mu = self.hp.nu"))
    listed, _ = write_scaffold("algorithm", "listed-prox", tmp_path, base="fedprox")
    text = listed.read_text()
    text = text.replace("state: State) -> State:", "state: State) -> list[State]:")
    text = text.replace(
        "return self.engine.train(rnd, rnd.clients, state, objective=objective, aux=anchor).state",
        "return [self.engine.train(rnd, rnd.clients, state, objective=objective, aux=anchor).state]",
    )
    assert "-> list[State]:" in text and "return [self.engine.train(" in text
    listed.write_text(text)
    problems = mypy_problems(path, listed)
    assert '"TypoProxHP" has no attribute "nu"' in problems
    assert 'Return type "list[dict[str, Tensor]]" of "local_train" incompatible with return type' in problems


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Benchmark your own method")
    return text[start : text.index("\n## ", start + 1)]


def readme_block(language: str) -> str:
    block = re.search(rf"```{language}\n(.*?)```", readme_section(), re.S)
    assert block is not None, f"no {language} block in the README's 'Benchmark your own method'"
    return block.group(1)


def test_the_readmes_fedavgm_is_the_scaffolds_output_filled_in_and_passes_the_lint(tmp_path):
    """Every code line `pflbench new algorithm FedAvgM` writes is in the README's file, in order, but those
    a user fills in (the card's texts, the hyperparameters, the search space, the imports the new hook
    needs); the commented-out hook it shows is the one the README fills in, over `weighted_mean`. The
    README's file passes ruff and mypy."""
    from pflbench.cli.scaffold import write_scaffold

    code = readme_block("python")
    scaffold, _ = write_scaffold("algorithm", "FedAvgM", tmp_path / "scaffold")
    written = scaffold.read_text()
    filled_in = ("family=", "paper=", "personalizes=", "search_space =", "from pflbench.algorithm import")
    kept = [line for line in code_lines(written) if not line.startswith(filled_in)]
    readme_lines = iter(code_lines(code))
    missing = [line for line in kept if line not in readme_lines]  # in order: `in` consumes the iterator
    assert not missing, f"the README's FedAvgM drifted from the scaffold's output: {missing}"
    lines = written.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\s*#\s+def ", line))  # the commented hook
    hook = [line.strip().lstrip("#").split("  #")[0].strip() for line in lines[start : start + 3]]
    assert hook[:2] == [
        "def aggregate(self, rnd: ClientRound, upload: Payload) -> None:",
        "average = self.weighted_mean(upload)",
    ]
    assert all(line in code_lines(code) for line in hook[:2]) and "train_sizes" not in code
    imported = re.search(r"^from pflbench.algorithm import (.*)$", written, re.M)
    assert imported is not None and f"from pflbench.algorithm import {imported.group(1)}" not in code
    assert set(imported.group(1).split(", ")) < set(
        re.search(r"^from pflbench.algorithm import (.*)$", code, re.M).group(1).split(", ")
    )
    (tmp_path / "readme").mkdir()
    path = tmp_path / "readme" / "fedavgm.py"
    path.write_text(code)
    assert ruff_problems(path.parent) == ""
    assert mypy_problems(path) == ""
    assert len(code_lines(code)) <= 30  # the method, its hyperparameters and card: one screen


def test_the_readmes_fedavgm_at_zero_momentum_is_fedavg(tmp_path):
    """At momentum 0 and server_lr 1 the README's method is FedAvg (up to rounding: w - (w - mean) is not
    always mean); with momentum it differs."""
    from pflbench.loader import plugins
    from pflbench.algorithm import ALGORITHMS
    from pflbench.simulator.rounds import run_cell

    path = tmp_path / "fedavgm.py"
    path.write_text(readme_block("python"))
    plugins.load([str(path)])
    try:
        assert ALGORITHMS.get("fedavgm").card.display_name == "FedAvgM"
        momentum = run_cell(_tiny_cell("fedavgm"), data_root=tmp_path)
        assert momentum.status == "finished", momentum.error
        plain = run_cell(_tiny_cell("fedavgm", momentum=0.0), data_root=tmp_path)
        fedavg = run_cell(_tiny_cell("fedavg"), data_root=tmp_path)
        assert abs(plain.summary["final_accuracy"] - fedavg.summary["final_accuracy"]) < 0.02
        assert momentum.summary["final_accuracy"] != fedavg.summary["final_accuracy"]
    finally:
        plugins.unload(path.name)


@pytest.mark.slow
def test_the_readmes_commands_run_as_written(tmp_path, monkeypatch, capsys):
    """The README's file and its two commands, exactly, in a fresh folder: the quickstart spec with the
    method added runs 6 cells (FedAvg and FedAvgM x 3 seeds), every one finished, and the report ranks both."""
    from pflbench.loader import plugins

    (tmp_path / "fedavgm.py").write_text(readme_block("python"))
    commands = [line.split("  #")[0] for line in readme_block("bash").splitlines() if line.strip()]
    assert [shlex.split(c)[:2] for c in commands] == [["pflbench", "run"], ["pflbench", "report"]]
    monkeypatch.chdir(tmp_path)
    try:
        for command in commands:
            assert main(shlex.split(command)[1:]) == 0, command
    finally:
        plugins.unload("fedavgm.py")
    from pflbench.storage.store import load_store

    cells = load_store(tmp_path / "results")
    assert sorted(zip(cells["algorithm"], cells["seed"])) == [
        (algorithm, seed) for algorithm in ("fedavg", "fedavgm") for seed in (0, 1, 2)
    ]
    assert set(cells["status"]) == {"finished"}
    report = (tmp_path / "reports" / "report.md").read_text()
    assert "FedAvgM" in report and "FedAvg " in report
