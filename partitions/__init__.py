"""Built-in partition schemes, one module each; importing this package registers them in `PARTITIONS`.

Installed, this folder is the package `pflbench.partitions` (setup.py); imported by its folder name
from a checkout (`import partitions`), it stands for `pflbench.partitions` (see algorithms/__init__.py)."""
import sys
from importlib import import_module

if __name__ == "partitions":
    _package = import_module("pflbench.partitions")
    sys.modules[__name__] = _package
    for _name, _module in list(sys.modules.items()):
        if _name.startswith("pflbench.partitions."):
            sys.modules["partitions." + _name.removeprefix("pflbench.partitions.")] = _module
else:
    from pflbench.partitions import dirichlet, dominant, flower, iid, imported, pathological  # noqa: F401
