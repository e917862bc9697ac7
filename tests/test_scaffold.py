"""`pflbench new algorithm|partition`: the files it writes are plugins that load, and the tests it
writes pass (run by pytest as a user would, outside this repository); they pass the repository's own
`ruff check` and override only what their starting point changes; the method is named as the user spells
it or as the built-ins spell its words; bad names are refused. The README's FedAvgM, written from the
scaffold's output, passes the same lint and runs."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pflbench.cli import main


@pytest.mark.slow
def test_every_scaffold_writes_a_plugin_whose_own_test_passes(tmp_path, capsys):
    for base in ("fedavg", "fedprox", "fedper"):
        assert main(["new", "algorithm", f"my-{base}", "--from", base, "--out", str(tmp_path)]) == 0
    assert main(["new", "partition", "my-shards", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "--plugin" in out and "algorithm+=[my-fedprox]" in out
    assert sorted(p.name for p in tmp_path.glob("*.py")) == [
        "my_fedavg.py", "my_fedper.py", "my_fedprox.py", "my_shards.py",
        "test_my_fedavg.py", "test_my_fedper.py", "test_my_fedprox.py", "test_my_shards.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "8 passed" in done.stdout


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


def test_the_scaffold_writes_the_hooks_in_their_current_form(tmp_path):
    """The written methods use the round's context (no DeprecationWarning when loaded) and annotate it."""
    import inspect
    import warnings

    from pflbench import legacy_hooks, plugins
    from pflbench.algorithm import ALGORITHMS, Round
    from pflbench.scaffold import BASES, write_scaffold

    for base in BASES:
        path, _ = write_scaffold("algorithm", f"current-{base}", tmp_path, base=base)
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            plugins.load([str(path)])
        try:
            cls = ALGORITHMS.get(f"current-{base}")
            for hook in ("configure", "receive", "local_train", "send", "aggregate"):
                if hook in vars(cls):
                    first = list(inspect.signature(vars(cls)[hook]).parameters.values())[1]
                    assert first.name == "rnd" and first.annotation in ("Round", Round), (base, hook)
            assert not legacy_hooks.old_forms(cls) and cls.__module__ != "pflbench.legacy_hooks"  # not adapted
        finally:
            plugins.unload(path.name)  # a plugin's id is its file name


ROOT = Path(__file__).resolve().parents[1]
HOOKS = ("configure", "receive", "local_train", "send", "aggregate", "personalized", "evaluate", "adapt_locally",
         "newcomer_models", "setup", "is_local")


def ruff_problems(folder: Path) -> str:
    """`ruff check` with the repository's settings (pyproject.toml) on `folder`: its report, "" when clean."""
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[lint]', as `make lint` does)")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config",
                           str(ROOT / "pyproject.toml"), str(folder)], capture_output=True, text=True, timeout=120)
    return "" if done.returncode == 0 else done.stdout + done.stderr


def _tiny_cell(name: str, **hp):
    from pflbench.spec import resolve_cell

    return resolve_cell({"algorithm": name, "dataset": "synthetic", "dataset_options": {"num_samples": 1000},
                         "partition": "pathological", "partition_params": {"classes_per_client": 3},
                         "clients": 5, "rounds": 3, "local_epochs": 1, "batch_size": 16, "lr": 0.05, "hp": hp})


def test_the_written_files_pass_the_repositorys_ruff_check_and_fedavgs_pastes_no_hook(tmp_path):
    from pflbench import plugins
    from pflbench.algorithm import ALGORITHMS
    from pflbench.rounds import run_cell
    from pflbench.scaffold import BASES, write_scaffold

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
    from pflbench.scaffold import identifiers

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
    assert named("srv-mom", "FedAvg (server momentum)") == ("srv-mom", "FedAvgServerMomentum",
                                                            "FedAvg (server momentum)")
    assert main(["new", "algorithm", "FedAvgM", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pflbench run quickstart --plugin" in out and "algorithm+=[fedavgm]" in out
    text = (tmp_path / "fedavgm.py").read_text()
    assert '@ALGORITHMS.register("fedavgm"' in text and "class FedAvgM(Algorithm):" in text
    assert 'display_name="FedAvgM"' in text and (tmp_path / "test_fedavgm.py").is_file()
    assert main(["new", "algorithm", "odd", "--display-name", 'Say "hi"', "--out", str(tmp_path)]) == 0
    assert ruff_problems(tmp_path) == ""  # a display name with quotes is still a valid literal


def readme_fedavgm() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Benchmark your own method"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readmes_fedavgm_passes_the_lint_and_reuses_fedavgs_weighted_mean(tmp_path):
    """The README's example: the scaffold's imports and registration, one hook over `weighted_mean`; at
    momentum 0 and server_lr 1 it is FedAvg (up to rounding: w - (w - mean) is not always mean)."""
    from pflbench import plugins
    from pflbench.algorithm import ALGORITHMS
    from pflbench.rounds import run_cell

    code = readme_fedavgm()
    assert len(code.splitlines()) <= 30 and "self.weighted_mean(upload)" in code and "train_sizes" not in code
    path = tmp_path / "fedavgm.py"
    path.write_text(code)
    assert ruff_problems(tmp_path) == ""
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
