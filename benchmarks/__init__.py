"""The specs shipped with pflbench: this folder is installed as the data package `pflbench.benchmarks`
(pyproject.toml's [tool.setuptools]); `pflbench.run.resources` finds a spec here by name."""
