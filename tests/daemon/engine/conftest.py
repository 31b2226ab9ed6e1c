"""Engine test fixtures: the session's SmolLM2 (from tests/daemon/conftest.py), one torch thread, and a
started engine over a test module's own `core` fixture.

NOTE: one intra-op thread keeps the tests fast and stable on a small shared machine (OpenMP worker
spinning under contention costs far more than the second core gains for these tiny batches).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from invariance_kit import MODES, Rig, make_rig

from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.engine import Engine
from radixd.daemon.loaders import LoadedModel


@pytest.fixture(autouse=True, scope="module")
def _engine_tests_on_one_thread(one_torch_thread: None) -> None:
    """Every engine test module runs torch on one thread (tests/daemon/conftest.py)."""


@pytest.fixture
def engine(core: EngineCore) -> Iterator[Engine]:
    """A started engine thread over the module's `core` fixture, shut down after the test."""
    eng = Engine(core)
    eng.start()
    yield eng
    eng.shutdown(drain_timeout_s=5.0)


@pytest.fixture(scope="session", params=MODES)
def rig(request: pytest.FixtureRequest, smollm: LoadedModel) -> Rig:
    """One execution mode `auto` can pick (invariance_kit.MODES), with its model; pytest runs the
    tests of one mode together, so one extra model is loaded at a time."""
    return make_rig(request.param, smollm)
