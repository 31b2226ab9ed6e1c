"""Fixtures: the real model (once per session) and one daemon per test module (see e2e_kit)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_kit import RunningDaemon, serve_args, start_daemon, stop_daemon

from radixd.daemon.loaders import LoadedModel


@pytest.fixture(scope="session")
def loaded_model(smollm: LoadedModel) -> LoadedModel:
    """The session's model (tests/conftest.py), under the name the e2e kit uses."""
    return smollm


@pytest.fixture(scope="module")
def daemon(loaded_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """The module's daemon with default flags (single tenant)."""
    d = start_daemon(loaded_model, serve_args(tmp_path_factory.mktemp("daemon")))
    try:
        yield d
    finally:
        stop_daemon(d)
