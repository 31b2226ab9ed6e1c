"""Limits: a full queue answers RESOURCE_EXHAUSTED; a slow reader's stream buffer is bounded."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import grpc
import pytest
from e2e_kit import RunningDaemon, serve_args, start_daemon, stop_daemon, wait_until
from radixd_client import Chunk

from radixd.daemon.engine.types import RequestOutput
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.server.common.bridge import OutputBridge
from radixd.daemon.server.common.errors import RpcFailure


@pytest.fixture(scope="module")
def small_queue(
    loaded_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningDaemon]:
    d = start_daemon(loaded_model, serve_args(tmp_path_factory.mktemp("limits"), "--max-queue", "1"))
    try:
        yield d
    finally:
        stop_daemon(d)


@pytest.mark.slow
def test_queue_full_is_resource_exhausted_then_recovers(small_queue: RunningDaemon) -> None:
    with small_queue.client() as c, small_queue.client() as c2:
        busy = c.generate("Busy:", max_tokens=200, ignore_eos=True)
        events = iter(busy)
        while not isinstance(next(events), Chunk):
            pass
        with pytest.raises(grpc.RpcError) as err:
            c2.complete("second", max_tokens=2)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "retry" in err.value.details()
        busy.cancel()
        # Once the cancelled request has left the engine, the next request runs.
        wait_until(lambda: small_queue.state.active_streams == 0, what="the cancelled stream to end")
        for _ in range(100):
            try:
                assert c2.complete("after", max_tokens=2).completion_tokens == 2
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                threading.Event().wait(0.1)
        else:
            pytest.fail("the queue never drained")


def _output(i: int, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", 0, [i], "x", None, 1, 0, i + 1, finished, "length" if finished else None)


def test_bridge_overflow_aborts_and_ends_with_resource_exhausted() -> None:
    aborted = threading.Event()

    async def scenario() -> list[int]:
        loop = asyncio.get_running_loop()
        bridge = OutputBridge(loop, 4, aborted.set)
        # The engine thread produces 10 outputs while nobody reads.
        producer = threading.Thread(target=lambda: [bridge.sink(_output(i)) for i in range(10)])
        producer.start()
        producer.join()
        await asyncio.sleep(0.05)  # let the scheduled puts run
        got = []
        with pytest.raises(RpcFailure) as err:
            while True:
                got.append((await bridge.get()).new_token_ids[0])
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        return got

    assert asyncio.run(scenario()) == [0, 1, 2, 3]
    assert aborted.is_set()


def test_bridge_delivers_in_order_without_overflow() -> None:
    async def scenario() -> list[int]:
        bridge = OutputBridge(asyncio.get_running_loop(), 4, lambda: None)
        threading.Thread(target=lambda: [bridge.sink(_output(i, i == 2)) for i in range(3)]).start()
        return [(await bridge.get()).new_token_ids[0] for _ in range(3)]

    assert asyncio.run(scenario()) == [0, 1, 2]
