"""Engine test fixtures: the session's SmolLM2 (from tests/daemon/conftest.py) and one torch thread.

NOTE: one intra-op thread keeps the tests fast and stable on a small shared machine (OpenMP worker
spinning under contention costs far more than the second core gains for these tiny batches).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
