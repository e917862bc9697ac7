"""Built-in algorithms, one module each; importing this package registers them all.

Installed, this folder is the package `pflbench.algorithms` (setup.py). Imported by its folder name
from a checkout (`import algorithms`, `from algorithms.fedavg import FedAvg`: code written before the
mapping), it stands for `pflbench.algorithms` instead of loading every module a second time (which
would register every algorithm twice)."""
from importlib import import_module
from pathlib import Path

if __name__ == "algorithms":
    from pflbench.resources import stand_for

    stand_for(__name__, "pflbench.algorithms")
else:
    for _module in sorted(Path(__file__).parent.glob("[!_]*.py")):
        import_module(f"{__name__}.{_module.stem}")
