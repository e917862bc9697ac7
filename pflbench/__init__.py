"""pflbench: a benchmark suite and leaderboard harness for personalized federated learning."""

# The registries (algorithms, datasets, partition schemes, models) fill themselves with the built-ins and
# the installed packages' plugins before they are first read: the loader installs itself on import.
from pflbench import plugins as _plugins  # noqa: F401
