"""`pflbench` of a pinned worktree from before the relayout (e.g. 0759e6a, the GPU rows' commit), run with
main's venv. Those commits keep algorithms/, partitions/ and benchmarks/ as top-level folders that their
setup.py maps into pflbench.*; main's editable install maps those names to main's folders instead. This
loads the three from the worktree (PFLBENCH_WORKTREE), without symlinks that would make the checkout dirty
(a cell records whether its code was), then runs the worktree's CLI:

    PFLBENCH_WORKTREE=/work/wt-q5 /work/main/.venv/bin/python contributing/lanes/old_layout.py run SPEC ...
"""

import importlib.util
import os
import sys

tree = os.environ["PFLBENCH_WORKTREE"].rstrip("/")
sys.path.insert(0, tree)
import pflbench  # noqa: E402

assert pflbench.__file__.startswith(tree + "/"), pflbench.__file__
for name in ("partitions", "benchmarks", "algorithms"):
    spec = importlib.util.spec_from_file_location(
        f"pflbench.{name}", f"{tree}/{name}/__init__.py", submodule_search_locations=[f"{tree}/{name}"]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    setattr(pflbench, name, module)
    spec.loader.exec_module(module)

from pflbench.cli import main  # noqa: E402

sys.exit(main())
