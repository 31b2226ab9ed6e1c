"""The threaded `Engine`: submit / abort / execute from other threads, admin commands, flush modes, drain."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from engine_kit import SYSTEM, greedy, make_core

from radixd.daemon.engine.commands import (
    CreateSession,
    Evict,
    EvictPrefix,
    GetStats,
    ListSessions,
    LookupPrefix,
    Pin,
    Unpin,
)
from radixd.daemon.engine.engine import Engine
from radixd.daemon.engine.types import GenerateRequest, RequestOutput
from radixd.daemon.errors import EngineStopped, EngineTimeout, FlushRefused, InvalidRequest
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow


class Waiter:
    """Thread-safe sink: records outputs and signals when a request (all its indexes) finished."""

    def __init__(self, n: int = 1) -> None:
        self.n = n
        self.outs: list[RequestOutput] = []
        self.done = threading.Event()
        self.threads: set[str] = set()

    def __call__(self, out: RequestOutput) -> None:
        self.threads.add(threading.current_thread().name)
        self.outs.append(out)
        if sum(o.finished for o in self.outs) == self.n:
            self.done.set()

    def tokens(self) -> list[int]:
        return [t for o in self.outs for t in o.new_token_ids]


@pytest.fixture
def engine(smollm: LoadedModel) -> Iterator[Engine]:
    eng = Engine(make_core(smollm, num_blocks=128))
    eng.start()
    yield eng
    eng.shutdown(drain_timeout_s=5.0)


def test_submit_abort_and_admin_from_other_threads(engine: Engine, smollm: LoadedModel) -> None:
    prompt = smollm.tokenizer.encode(SYSTEM)
    a, b = Waiter(), Waiter()
    engine.submit(GenerateRequest("a", prompt, greedy(6)), a)
    engine.submit(GenerateRequest("b", prompt, greedy(200)), b)
    assert a.done.wait(60)
    assert [o.finish_reason for o in a.outs if o.finished] == ["length"] and len(a.tokens()) == 6
    assert a.threads == {"radixd-engine"}
    with pytest.raises(FlushRefused):
        engine.flush("refuse_if_busy").result(10)
    idle = engine.flush("wait_for_idle", timeout_s=60)
    engine.abort("b")
    engine.abort("b")  # idempotent
    assert b.done.wait(30) and b.outs[-1].finish_reason == "abort"
    assert idle.result(30) >= 0
    stats = engine.execute(GetStats()).result(10)
    assert stats.requests_in_flight == 0 and stats.free_blocks == 127
    assert stats.requests_aborted == 1 and stats.requests_finished == 2


def test_admin_commands(engine: Engine, smollm: LoadedModel) -> None:
    prompt = smollm.tokenizer.encode(SYSTEM)
    w = Waiter()
    engine.submit(GenerateRequest("p", prompt, greedy(3)), w)
    assert w.done.wait(60)

    cached = engine.execute(LookupPrefix(prompt + w.tokens())).result(10)
    engine.execute(Pin(prompt[:32])).result(10)
    evicted = engine.execute(Evict(1000)).result(10)  # everything but the pinned prefix
    after_pin = engine.execute(LookupPrefix(prompt)).result(10)
    engine.execute(Unpin(prompt[:32])).result(10)
    by_prefix = engine.execute(EvictPrefix(prompt[:16])).result(10)
    free = engine.execute(GetStats()).result(10).free_blocks
    assert cached == len(prompt) + 2  # prompt + all but the last of the 3 generated tokens
    assert evicted > 0 and after_pin == 32 and by_prefix == 2 and free == 127
    with pytest.raises(InvalidRequest):
        engine.submit(GenerateRequest("bad", [], greedy()), Waiter())
    engine.execute(CreateSession(session_id="s1")).result(10)
    sessions = engine.execute(ListSessions()).result(10)
    assert [s.session_id for s in sessions] == ["s1"]


def test_wait_idle_flush_times_out_and_shutdown_drains(smollm: LoadedModel) -> None:
    eng = Engine(make_core(smollm, num_blocks=128))
    eng.start()
    w = Waiter()
    eng.submit(GenerateRequest("long", smollm.tokenizer.encode(SYSTEM), greedy(400)), w)
    with pytest.raises(EngineTimeout):
        eng.flush("wait_for_idle", timeout_s=0.2).result(30)
    eng.shutdown(drain_timeout_s=0.2)  # too short for 400 tokens: the rest is aborted
    assert w.done.is_set() and w.outs[-1].finish_reason == "abort"
    with pytest.raises(EngineStopped):
        eng.submit(GenerateRequest("late", [1, 2], greedy()), Waiter())
    with pytest.raises(EngineStopped):
        eng.execute(GetStats()).result(1)


def test_queue_time_and_ttft_count_from_arrival_not_from_pickup(
    smollm: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that arrives during a step waits for that step: its queue time and TTFT say so, and
    the TTFT matches what the caller sees."""
    core = make_core(smollm, num_blocks=128)
    real_step = core.step
    in_slow_step = threading.Event()

    def slow_first_step() -> bool:
        if not in_slow_step.is_set():
            in_slow_step.set()
            time.sleep(0.5)
        return real_step()

    monkeypatch.setattr(core, "step", slow_first_step)
    eng = Engine(core)
    eng.start()
    try:
        eng.submit(GenerateRequest("busy", smollm.tokenizer.encode(SYSTEM), greedy(4)), Waiter())
        assert in_slow_step.wait(30)
        first_token_at: list[float] = []

        def sink(out: RequestOutput) -> None:
            if out.new_token_ids and not first_token_at:
                first_token_at.append(time.monotonic())
            late(out)

        late = Waiter()
        sent = time.monotonic()
        eng.submit(GenerateRequest("late", [1, 2, 3, 4], greedy(2), arrival_time=sent), sink)
        assert late.done.wait(60)
    finally:
        eng.shutdown(drain_timeout_s=5.0)
    end = late.outs[-1]
    assert end.finish_reason == "length" and end.ttft_s is not None and end.queue_time_s is not None
    seen = first_token_at[0] - sent
    assert seen > 0.3  # most of the slow step was still to run when "late" arrived
    assert end.queue_time_s > 0.3 and abs(end.ttft_s - seen) < 0.02, (end.ttft_s, seen)
