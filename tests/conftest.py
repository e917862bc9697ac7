"""Suite-wide settings."""
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
    from pflbench import plugins

    before = {p.source.id for p in plugins.loaded()}
    yield
    for loaded in plugins.loaded():
        if loaded.source.id not in before:
            plugins.unload(loaded.source.id)


@pytest.fixture
def local_ray():
    """A local Ray instance of 2 CPUs for one test. Not module-scoped: a later test must find Ray not
    initialized (tests that start or join a cluster of their own)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
