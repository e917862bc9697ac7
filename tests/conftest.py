"""Suite-wide settings."""
import pytest
import torch


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
