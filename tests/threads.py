"""A fixture for tests that run tiny torch problems in the test process."""

import pytest


@pytest.fixture
def one_thread():
    """Tiny problems run fastest on one thread; on a busy 2-core machine, two threads that wait on each
    other in every parallel region make them hundreds of times slower. (CLI tests set OMP_NUM_THREADS=1
    for their workers for the same reason.)"""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
