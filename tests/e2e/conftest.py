"""Fixtures: the real model (once per session), one daemon per test module (see e2e_kit), and one
`radixd cluster` of one replica that the OpenAI-API modules share (cluster_kit)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cluster_kit import Cluster, start_cluster
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


# Enough blocks for an agent's growing history to stay cached; requests name their max_tokens or get 16.
ONE_REPLICA = ("--num-blocks", "256", "--default-max-tokens", "16", "--max-num-seqs", "8")


@pytest.fixture(scope="session")
def one_replica_cluster(
    loaded_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """smg in front of one replica, shared by the modules that drive the OpenAI API (a start is ~10 s)."""
    c = start_cluster(tmp_path_factory.mktemp("one-replica"), 1, *ONE_REPLICA)
    try:
        yield c
    finally:
        c.ensure_stopped()
