"""Built-in partition schemes, one module each; importing this package registers them in `PARTITIONS`.

Installed, this folder is the package `pflbench.partitions` (setup.py)."""
from pflbench.partitions import dirichlet, dominant, flower, iid, imported, pathological, random_classes  # noqa: F401
