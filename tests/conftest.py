"""Suite-wide settings, and how `make test` spreads the suite over processes (pytest-xdist)."""

import os

import pytest
import torch

# Ray lowers its workers to niceness 15 (its default `worker_niceness`), so that on a machine whose
# cores other work keeps busy at niceness 0 a cell on a Ray worker gets ~1/30 of a core (CFS weights
# 36 vs 1024): tests that wait for a Ray worker took minutes and ran past their bounds (a lost-worker
# test: 95 s at niceness 0, over 400 s at 15, pinned to one core beside one busy loop). The suite's
# workers run at the suite's own priority. Set before any Ray starts: the raylet and its workers
# inherit it, and the tests that start clusters with `ray start` keep it in their environment.
os.environ.setdefault("RAY_worker_niceness", "0")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One intra-op thread per test process: the suite's models are tiny, and on a shared 2-core
    machine torch's default threads oversubscribe the cores (tests ran 10-100x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fresh_plugins():
    """Plugins a test loads are forgotten afterwards (test files that load plugins use it for every test)."""
    from pflbench.loader import plugins

    before = {p.source.id for p in plugins.loaded()}
    yield
    for loaded in plugins.loaded():
        if loaded.source.id not in before:
            plugins.unload(loaded.source.id)


@pytest.fixture(scope="session")
def generated_reference(tmp_path_factory):
    """The folder of reference pages docs/gen_reference.py writes (as `make docs` does, its results page and
    figures beside it), generated once: the modules that read it are one unit of work (SERIAL_GROUPS)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "gen_reference", Path(__file__).resolve().parents[1] / "docs" / "gen_reference.py"
    )
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    out = tmp_path_factory.mktemp("docs") / "reference"
    assert gen.main([str(out)]) == 0
    return out


@pytest.fixture
def local_ray():
    """A local Ray instance of 2 CPUs for one test. Not module-scoped: a later test must find Ray not
    initialized (tests that start or join a cluster of their own)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


# ---- units of work for pytest-xdist (`make test`: `-n 3 --dist loadscope`) ------------------------------
# A test module is one unit: it runs whole, in its file's order, in one process, so that its module-scoped
# fixtures (reference runs, a built wheel, a Ray instance of its own) are built once, as in a plain run.
# The modules and tests of one group below are one unit too: they run one after another, never at once.
SERIAL_GROUPS: dict[str, tuple[str, ...]] = {
    # Ray clusters of their own, started with `ray start` in network namespaces (about ten processes a
    # node): one at a time, so that their start-ups, gates and deadlines are those of one cluster on the
    # machine, never of two competing for its cores.
    "ray-clusters": ("tests/test_multinode.py::", "tests/test_ray_cluster.py::"),
    # The modules that read the generated reference pages (the `generated_reference` fixture): in one process,
    # so that the generator (half a minute or more: the results page draws its figures) runs once.
    "docs-generated": ("tests/test_docs_site.py::", "tests/test_docs_for_users.py::"),
}


# The longest units, with the seconds of their tests among the 25 slowest of a whole `make test` (--durations:
# three processes, load 5-6 on 2 cores; a unit's other tests come on top); handed out first, longest first.
# pytest-xdist hands out the modules with the most tests first, and these have few tests each (a subprocess
# or a cluster per test): last in its queue, a 3-minute module started when the others were nearly done, and
# the other processes waited idle while it ran. Units not listed follow in pytest-xdist's order; a list a
# little out of date only costs a little of that tail.
LONG_UNITS: dict[str, float] = {
    "tests/test_tutorial_outputs.py": 159.8,
    "ray-clusters": 131.6,
    "tests/test_sweep_checkpoints.py": 126.2,
    "tests/test_packaging.py": 70.5,
    "tests/test_checkpoint_kill.py": 59.8,
    "tests/test_preemption.py": 59.6,
    "tests/test_disk_full.py": 43.8,
    "tests/test_gpu_carry.py": 39.0,
    "tests/test_out_of_memory.py": 33.4,
    "tests/test_gpu_column.py": 33.1,
    "tests/test_preemption_job.py": 31.8,
    "docs-generated": 31.5,  # the generator's setup, once for both modules
    "tests/test_store.py": 31.1,
    "tests/test_scaffold.py": 26.6,
    "tests/test_checkpoint_ray.py": 26.3,
    "tests/test_gpu_graphs.py": 25.0,
}


def unit_of_work(nodeid: str) -> str:
    """The unit a test belongs to: its group in SERIAL_GROUPS, else its module."""
    for group, members in SERIAL_GROUPS.items():
        if nodeid.startswith(members):
            return group
    return nodeid.split("::", 1)[0]


def first_units() -> list[str]:
    """The units handed out before all others, in order: LONG_UNITS longest first, then any group not listed."""
    ranked = sorted(LONG_UNITS, key=lambda unit: -LONG_UNITS[unit])
    return ranked + [group for group in SERIAL_GROUPS if group not in LONG_UNITS]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hooks: a plain `pytest` run without it never calls them
def pytest_xdist_setupnodes():
    """The processes start with the environment the suite sees (os.environ). Once imported, readline puts
    COLUMNS=80 and LINES=24 into the C environment when there is no terminal, which os.environ does not show
    but new processes inherit: the workers' consoles would wrap at 80 columns where a plain run's do not
    (pflbench.run.display.make_console), and the tests reading their lines fail."""
    for name in ("COLUMNS", "LINES"):
        if name not in os.environ:
            os.unsetenv(name)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` hands out this suite's units of work (unit_of_work), the longest first (LONG_UNITS,
    the groups among them): a long unit handed out last would leave the other processes idle at the end.
    (pytest-xdist's own `xdist_group` marks do not group under pytest 9, whose node ids they cannot amend.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SuiteScheduling(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the work queue is complete when the first unit is handed out
                self.ordered = True
                for unit in reversed(first_units()):
                    if unit in self.workqueue:
                        self.workqueue.move_to_end(unit, last=False)
            super()._assign_work_unit(node)

    return SuiteScheduling(config, log)
