"""Built-in partition schemes, one module each; importing this package registers them in `PARTITIONS`."""
from partitions import dirichlet, dominant, flower, iid, imported, pathological  # noqa: F401
