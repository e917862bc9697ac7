"""pflbench: a benchmark suite and leaderboard harness for personalized federated learning.

The modules at the top of the package are the method API (what a plugin subclasses and the types it names);
every other layer is a folder (docs/explanation/house.md says which to open for which change).
"""

from pflbench.loader import moved as _moved

# Import paths of 0.1 keep working until 0.3, each with a warning naming its new path.
_moved.install()

# The registries (algorithms, datasets, partition schemes, models) fill themselves with the built-ins and
# the installed packages' plugins before they are first read: the loader installs itself on import.
from pflbench.loader import plugins as _plugins  # noqa: E402, F401
