"""Local training: every client trains only on its own data and never communicates."""
from pflbench.algorithm import ALGORITHMS, Algorithm


@ALGORITHMS.register("local")
class Local(Algorithm):
    name = "local"

    def is_local(self, name: str) -> bool:
        return True  # nothing is shared: no bytes up or down, nothing to aggregate
