"""Faults injected into a real daemon's engine thread, over real gRPC: the affected request fails with
INTERNAL and its id is logged, the daemon goes on serving; a dead engine thread turns health
NOT_SERVING, new work UNAVAILABLE, and `radixd serve` exits 1."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from e2e_kit import RunningDaemon, build, serve_args, start_daemon, stop_daemon, wait_until
from faultkit import fail_once, json_logs
from radixd_client import Client

from radixd.daemon.loaders import LoadedModel
from radixd.daemon.server.app import ADMIN_SERVICE, PUBLIC_SERVICES, _serve

pytestmark = pytest.mark.slow
PROMPT = "Engine faults must fail only the requests they touch."


@pytest.fixture
def fresh(loaded_model: LoadedModel, tmp_path: Path) -> Iterator[RunningDaemon]:
    """A daemon of its own for each test (a fault may leave it dead)."""
    d = start_daemon(loaded_model, serve_args(tmp_path, "--num-blocks", "64"))
    try:
        yield d
    finally:
        stop_daemon(d)


def test_an_engine_fault_fails_its_request_with_internal_and_the_next_one_is_served(
    fresh: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    raised = fail_once(monkeypatch, fresh.state.engine.core, "step")
    with json_logs() as logs, fresh.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            c.complete(PROMPT, request_id="doomed", max_tokens=4, temperature=0.0)
        assert raised and err.value.code() == grpc.StatusCode.INTERNAL
        assert "injected fault in step" in (err.value.details() or "")
        lines = logs()
    # The server's lines for the RPC carry the client's id and the engine's; the engine's line says
    # which request it failed.
    engine_ids = {x.get("engine_request_id") for x in lines if x.get("request_id") == "doomed"} - {None}
    assert len(engine_ids) == 1, lines
    failed = [x for x in lines if x["event"] == "engine.request_failed"]
    assert [x["request_id"] for x in failed] == list(engine_ids)
    with fresh.client() as c:
        done = c.complete(PROMPT, max_tokens=4, temperature=0.0, ignore_eos=True)
        assert done.finish_reason == "length" and done.completion_tokens == 4
        assert c.health() == "SERVING"
    assert fresh.state.engine.running and fresh.daemon.exit_code == 0


def _health(address: str, service: str) -> str:
    with Client(address) as c:
        return c.health(service)


def test_a_dead_engine_thread_turns_health_not_serving_and_refuses_work(
    fresh: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step fails and so does the guard failing its requests: the engine thread is lost."""
    core = fresh.state.engine.core
    fail_once(monkeypatch, core, "step")
    fail_once(monkeypatch, core.requests, "fail")
    with fresh.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            c.complete(PROMPT, max_tokens=4)
        assert err.value.code() == grpc.StatusCode.INTERNAL
        wait_until(lambda: fresh.daemon.stopping.is_set(), what="the daemon to give up")
        for address, services in (
            (fresh.address, ("", *PUBLIC_SERVICES)),
            (fresh.admin_address, ("", ADMIN_SERVICE)),
        ):
            for service in services:
                assert _health(address, service) == "NOT_SERVING", (address, service)
        with pytest.raises(grpc.RpcError) as err:
            c.complete(PROMPT, max_tokens=4)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError) as err:
            c.load()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert fresh.daemon.exit_code == 1 and not fresh.state.engine.running


def test_serve_exits_1_when_the_engine_thread_dies(
    loaded_model: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`radixd serve`'s loop (`_serve`, here on the main thread for its signal handlers): a request
    kills the engine thread, the client gets INTERNAL, and the exit code is 1."""
    ready = tmp_path / "ready.json"
    args = serve_args(tmp_path, "--num-blocks", "64", "--ready-file", str(ready), "--grace-period", "5")
    built = build(loaded_model, args)
    fail_once(monkeypatch, built.core, "step")
    fail_once(monkeypatch, built.core.requests, "fail")
    codes: list[grpc.StatusCode] = []

    def client() -> None:
        wait_until(ready.exists, timeout=60, what="the ready file")
        with Client(json.loads(ready.read_text())["address"]) as c:
            try:
                c.complete(PROMPT, max_tokens=4)
            except grpc.RpcError as exc:
                codes.append(exc.code())

    t = threading.Thread(target=client, daemon=True)
    t.start()
    assert asyncio.run(asyncio.wait_for(_serve(args, built), 120)) == 1
    t.join(30)
    assert codes == [grpc.StatusCode.INTERNAL]
