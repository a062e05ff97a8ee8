"""Fixtures shared by the test modules."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread():
    """Small tensors: more threads only add contention on a shared machine (use with
    `pytestmark = pytest.mark.usefixtures("one_torch_thread")`)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
