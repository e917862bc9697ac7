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
