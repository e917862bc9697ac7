"""Built-in partition schemes, one module each; importing this package registers them in `PARTITIONS`."""

from pflbench.partitions import dirichlet, dominant, flower, iid, imported, pathological, random_classes  # noqa: F401
