"""The units of work `make test` hands to its processes (tests/conftest.py): every member of a serial group
names tests that exist, so that a renamed file or test cannot silently leave its group and run beside the
others; and a test is in its group, else in its module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import LONG_UNITS, SERIAL_GROUPS, first_units, unit_of_work

ROOT = Path(__file__).resolve().parents[1]


def names_of_tests(path: Path) -> set[str]:
    return {
        node.name
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


@pytest.mark.parametrize("group, member", [(g, m) for g, members in SERIAL_GROUPS.items() for m in members])
def test_every_member_of_a_serial_group_names_tests_that_exist(group, member):
    file, _, name = member.partition("::")
    assert (ROOT / file).is_file(), f"{group}: no file {file}"
    tests = names_of_tests(ROOT / file)
    assert tests, f"{group}: {file} has no test"
    if name:
        assert name in tests, f"{group}: {file} has no test {name}"


def test_a_test_is_in_its_group_else_in_its_module():
    assert unit_of_work("tests/test_multinode.py::test_a_node_lost_mid_matrix_loses_nothing") == "ray-clusters"
    cluster = "tests/test_ray_cluster.py::test_a_cluster_started_with_ray_start_runs_the_matrix_as_in_process"
    assert unit_of_work(cluster) == "ray-clusters"
    assert (
        unit_of_work("tests/test_plugins.py::test_a_plugin_algorithm_runs_on_ray_as_in_process")
        == "tests/test_plugins.py"
    )
    assert (
        unit_of_work("tests/test_privacy.py::test_central_noise_is_on_the_sum[add_remove-1.0]")
        == "tests/test_privacy.py"
    )


@pytest.mark.parametrize("unit", sorted(LONG_UNITS))
def test_every_long_unit_is_a_group_or_a_test_file(unit):
    assert unit in SERIAL_GROUPS or names_of_tests(ROOT / unit), f"LONG_UNITS: {unit} is no group and no test file"


def test_the_longest_units_are_handed_out_first_and_every_group_before_the_rest():
    order = first_units()
    assert order[0] == max(LONG_UNITS, key=LONG_UNITS.get)
    assert [LONG_UNITS[u] for u in order if u in LONG_UNITS] == sorted(LONG_UNITS.values(), reverse=True)
    assert set(SERIAL_GROUPS) <= set(order)
