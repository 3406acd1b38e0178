import os

import pytest
import torch

# Two CPU cores in CI: keep torch from oversubscribing them.
torch.set_num_threads(min(2, os.cpu_count() or 1))

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


@pytest.fixture
def shared_data():
    """Path to ../shared/data; skips the test when it is absent."""
    path = os.environ.get("HYPERPLEX_DATA", SHARED_DATA)
    if not os.path.isdir(path):
        pytest.skip(f"shared data folder not found at {path}")
    return path
