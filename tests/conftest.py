"""Fixtures shared by several test files."""
import pytest
import torch


@pytest.fixture
def one_torch_thread():
    "torch on one thread for the test, restored after: the offset fits compare numbers that thread count can change."
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
