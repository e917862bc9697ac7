"""The specs shipped with pflbench: this folder is installed as the data package `pflbench.benchmarks`
(pyproject.toml's [tool.setuptools]); `pflbench.resources` finds a spec here by name."""
