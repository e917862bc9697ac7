"""The specs shipped with pflbench: this folder is installed as the package data of
`pflbench.benchmarks` (see setup.py); `pflbench.resources` finds a spec here by name."""
