"""Package layout (everything else is in pyproject.toml).

The repository keeps `algorithms/`, `partitions/` and `benchmarks/` at its top level (the layout is
part of the design); installed, they live inside the pflbench namespace as `pflbench.algorithms`,
`pflbench.partitions` and `pflbench.benchmarks`, so a user's environment gets no top-level modules
called `algorithms` or `partitions`. The specs, reference numbers and tuned configurations under
benchmarks/ ship as package data (`pflbench run table1` finds them: pflbench/resources.py).
Subpackages of pflbench/ are found, so a new one needs no entry here.
"""
from setuptools import find_packages, setup

MAPPED = {"pflbench.algorithms": "algorithms", "pflbench.partitions": "partitions",
          "pflbench.benchmarks": "benchmarks"}

setup(
    packages=[*find_packages(include=["pflbench", "pflbench.*"]), *MAPPED],
    package_dir={"pflbench": "pflbench", **MAPPED},
)
