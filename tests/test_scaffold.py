"""`pflbench new algorithm|partition`: the files it writes are plugins that load, and the tests it
writes pass (run by pytest as a user would, outside this repository); bad names are refused."""
from __future__ import annotations

import subprocess
import sys

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
    assert "lowercase letters, digits and single dashes" in capsys.readouterr().err
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

    from pflbench import plugins
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
                    assert vars(cls)[hook].__pflbench_hook__ == "new"
        finally:
            plugins.unload(path.name)  # a plugin's id is its file name
