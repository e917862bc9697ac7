"""Built-in algorithms, one module each; importing this package registers them all.

Installed, this folder is the package `pflbench.algorithms` (setup.py). Imported by its folder name
from a checkout (`import algorithms`, `from algorithms.fedavg import FedAvg`: code written before the
mapping), it stands for `pflbench.algorithms` instead of loading every module a second time (which
would register every algorithm twice)."""
import sys
from importlib import import_module
from pathlib import Path

if __name__ == "algorithms":
    _package = import_module("pflbench.algorithms")
    sys.modules[__name__] = _package
    for _name, _module in list(sys.modules.items()):
        if _name.startswith("pflbench.algorithms."):
            sys.modules["algorithms." + _name.removeprefix("pflbench.algorithms.")] = _module
else:
    for _module in sorted(Path(__file__).parent.glob("[!_]*.py")):
        import_module(f"{__name__}.{_module.stem}")
