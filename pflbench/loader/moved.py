"""Import paths of 0.1 that moved in 0.2, when the package was laid out in layer folders (CHANGELOG.md).

`import pflbench.training` (or `from pflbench.rounds import run_cell`) still works until 0.3: it gives the
module at its new path, the same module object, with a `DeprecationWarning` naming the new path. Nothing in
pflbench imports an old path; this table is the whole of the compatibility, installed by the package's
`__init__` as a finder that knows only these names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

REMOVED_IN = "0.3"

# old module under pflbench -> its path under pflbench since 0.2
MOVED = {
    "batching": "simulator.batching",
    "bench": "run.bench",
    "captured": "simulator.captured",
    "cell_method": "simulator.cell_method",
    "checkpoint": "storage.checkpoint",
    "checkpoint_relay": "run.checkpoint_relay",
    "cost": "run.cost",
    "display": "run.display",
    "execution": "simulator.execution",
    "feature_training": "kit.feature_training",
    "federation": "simulator.federation",
    "groups": "simulator.groups",
    "interop": "data.interop",
    "metrics": "simulator.metrics",
    "models": "simulator.models",
    "node_data": "run.node_data",
    "oom_kills": "run.oom_kills",
    "partitioning": "data.partitioning",
    "plugins": "loader.plugins",
    "preemption": "run.preemption",
    "privacy": "simulator.privacy",
    "publish": "studies.publish",
    "ray_cluster": "run.ray_cluster",
    "rendezvous": "simulator.rendezvous",
    "representation": "kit.representation",
    "resolve": "simulator.resolve",
    "resources": "run.resources",
    "result_relay": "run.result_relay",
    "retired": "loader.retired",
    "rounds": "simulator.rounds",
    "row_rates": "simulator.row_rates",
    "runner": "run.runner",
    "scaffold": "cli.scaffold",
    "shifts": "simulator.shifts",
    "spec": "run.spec",
    "spec_schema": "run.spec_schema",
    "static_step": "simulator.static_step",
    "steps": "kit.steps",
    "store": "storage.store",
    "sweep": "tuning.sweep",
    "sweep_stop": "tuning.sweep_stop",
    "system": "simulator.system",
    "testing": "run.testing",
    "trackers": "run.trackers",
    "training": "simulator.training",
    "verify": "studies.verify",
    "watch": "studies.watch",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new} in pflbench 0.2; the old path goes in {REMOVED_IN}",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """The module at the new path has run already."""


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds `pflbench.<old>` for the modules of `MOVED` only, as the module at its new path."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        head, _, name = fullname.partition(".")
        if head != "pflbench" or name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(f"pflbench.{MOVED[name]}"))


def install() -> None:
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
