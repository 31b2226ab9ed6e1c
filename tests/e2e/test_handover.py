"""The daemon's output handover (server/common/handover.py): outputs leave the engine thread in batches, at
the points the engine names (before each forward pass, before it waits, once it stops), in order."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest
from e2e_kit import wait_until

from radixd.daemon.engine.engine import Engine
from radixd.daemon.engine.factory import build_core
from radixd.daemon.engine.types import GenerateRequest, RequestOutput
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.server.common.bridge import OutputBridge
from radixd.daemon.server.common.errors import RpcFailure
from radixd.daemon.server.common.handover import OutputHandover


def _output(rid: str, i: int, finished: bool = False) -> RequestOutput:
    return RequestOutput(rid, 0, [i], "x", None, 1, 0, i + 1, finished, "length" if finished else None)


def test_outputs_wait_for_the_flush_then_arrive_in_order() -> None:
    async def scenario() -> tuple[list[int], list[int], int, bool]:
        loop = asyncio.get_running_loop()
        handover = OutputHandover(loop)
        a = OutputBridge(loop, 8, lambda: None, handover)
        b = OutputBridge(loop, 8, lambda: None, handover)

        def engine_thread() -> None:  # interleaved, as one step emits for several streams
            for i in range(3):
                a.sink(_output("a", i, i == 2))
                b.sink(_output("b", 10 + i, i == 2))

        t = threading.Thread(target=engine_thread)
        t.start()
        t.join()
        await asyncio.sleep(0.05)
        held = a._queue.empty() and b._queue.empty()  # nothing crossed before the flush
        threading.Thread(target=handover.flush).start()
        got_a = [(await a.get()).new_token_ids[0] for _ in range(3)]
        got_b = [(await b.get()).new_token_ids[0] for _ in range(3)]
        return got_a, got_b, handover.batches, held

    got_a, got_b, batches, held = asyncio.run(scenario())
    assert held
    assert got_a == [0, 1, 2]
    assert got_b == [10, 11, 12]
    assert batches == 1


def test_overflow_through_the_handover_aborts_and_ends_with_resource_exhausted() -> None:
    aborted = threading.Event()

    async def scenario() -> list[int]:
        loop = asyncio.get_running_loop()
        handover = OutputHandover(loop)
        bridge = OutputBridge(loop, 4, aborted.set, handover)
        producer = threading.Thread(
            target=lambda: ([bridge.sink(_output("r", i)) for i in range(10)], handover.flush())
        )
        producer.start()
        producer.join()
        await asyncio.sleep(0.05)
        got = []
        with pytest.raises(RpcFailure) as err:
            while True:
                got.append((await bridge.get()).new_token_ids[0])
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        return got

    assert asyncio.run(scenario()) == [0, 1, 2, 3]
    assert aborted.is_set()


def test_flush_after_the_loop_closed_drops_quietly() -> None:
    loop = asyncio.new_event_loop()
    handover = OutputHandover(loop)
    bridge = OutputBridge(loop, 4, lambda: None, handover)
    loop.close()
    bridge.sink(_output("r", 0, True))
    handover.flush()  # must not raise on the engine thread
    handover.flush()  # nothing left
    assert handover.batches == 1


@pytest.mark.slow
def test_engine_hands_over_before_each_forward_and_when_idle(loaded_model: LoadedModel) -> None:
    """Every output is handed over before the next forward pass starts, and the last one once the
    engine goes idle: no output waits longer than the next step's scheduling."""
    core = build_core(loaded_model, num_blocks=64)
    engine = Engine(core)
    events: list[str] = []
    lock = threading.Lock()

    def note(what: str) -> None:
        with lock:
            events.append(what)

    run = core.runner.run

    def forward(*args: object) -> object:
        note("forward")
        return run(*args)  # type: ignore[arg-type]

    core.runner.run = forward  # type: ignore[method-assign]
    engine.handover = lambda: note("handover")
    done = threading.Event()

    def sink(out: RequestOutput) -> None:
        note("emit")
        if out.finished:
            done.set()

    engine.start()
    try:
        sp = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
        engine.submit(GenerateRequest("h", loaded_model.tokenizer.encode("Hello"), sp), sink)
        assert done.wait(120)
        wait_until(lambda: events[-1] == "handover", what="the idle handover")
        time.sleep(0.05)
    finally:
        engine.shutdown(1.0)
    with lock:
        seq = list(events)
    assert seq.count("emit") == 5
    # After each emit, a handover comes before any further forward pass.
    for i, e in enumerate(seq):
        if e == "emit":
            rest = seq[i + 1 :]
            nxt = rest.index("handover")
            assert "forward" not in rest[:nxt], seq
