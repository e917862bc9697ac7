"""Built-in partition schemes, one module each; importing this package registers them in `PARTITIONS`.

Installed, this folder is the package `pflbench.partitions` (setup.py); imported by its folder name
from a checkout (`import partitions`), it stands for `pflbench.partitions` (see algorithms/__init__.py)."""
if __name__ == "partitions":
    from pflbench.resources import stand_for

    stand_for(__name__, "pflbench.partitions")
else:
    from pflbench.partitions import dirichlet, dominant, flower, iid, imported, pathological, random_classes  # noqa: F401
