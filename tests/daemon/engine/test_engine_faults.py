"""Faults injected into the engine thread: the requests they touch fail with "internal" and their id
is logged, the engine goes on serving, and a thread that dies anyway fails everything and says so."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from engine_kit import SYSTEM, assert_all_free, greedy, make_core
from faultkit import Injected, fail_once, json_logs

from radixd.daemon.engine.commands import CreateSession, GetStats
from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.engine import Engine
from radixd.daemon.engine.types import GenerateRequest, RequestOutput
from radixd.daemon.errors import EngineStopped
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow


class Waiter:
    """Thread-safe sink: records outputs and signals when every index finished."""

    def __init__(self, n: int = 1) -> None:
        self.n = n
        self.outs: list[RequestOutput] = []
        self.done = threading.Event()

    def __call__(self, out: RequestOutput) -> None:
        self.outs.append(out)
        if sum(o.finished for o in self.outs) == self.n:
            self.done.set()

    def end(self, timeout: float = 60.0) -> RequestOutput:
        assert self.done.wait(timeout), "the request never finished"
        return self.outs[-1]


@pytest.fixture
def core(smollm: LoadedModel) -> EngineCore:
    return make_core(smollm, num_blocks=128)


def _prompt(smollm: LoadedModel) -> list[int]:
    return smollm.tokenizer.encode(SYSTEM)


def _failed(lines: list[dict[str, Any]], request_id: str) -> bool:
    return any(x["event"] == "engine.request_failed" and x.get("request_id") == request_id for x in lines)


def test_a_failing_step_fails_its_requests_and_the_next_request_is_served(
    engine: Engine, core: EngineCore, smollm: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    raised = fail_once(monkeypatch, core, "step")
    victim, nxt = Waiter(), Waiter()
    with json_logs() as logs:
        engine.submit(GenerateRequest("victim", _prompt(smollm), greedy(4)), victim)
        end = victim.end()
        assert raised and end.finish_reason == "error" and end.error_code == "internal"
        assert "Injected: injected fault in step" in (end.error or "") and "request id" in (end.error or "")
        assert _failed(logs(), "victim")
    engine.submit(GenerateRequest("next", _prompt(smollm), greedy(4)), nxt)
    assert nxt.end().finish_reason == "length" and engine.running
    assert engine.execute(GetStats()).result(10).errors == 1
    engine.shutdown(drain_timeout_s=5.0)  # the thread is gone: this thread may read the core now
    assert_all_free(core)


def test_a_failing_command_fails_only_its_request(
    engine: Engine, core: EngineCore, smollm: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submit that raises after its session turn began: that request fails, the session is free
    again, and the request already running carries on."""
    engine.execute(CreateSession(session_id="s")).result(10)
    running = Waiter()
    engine.submit(GenerateRequest("running", _prompt(smollm), greedy(40)), running)
    real_begin = core.sessions.begin_turn

    def begin_then_fail(req: GenerateRequest) -> list[int]:
        real_begin(req)  # the session is busy with "bad" from here on
        raise Injected("injected fault after begin_turn")

    monkeypatch.setattr(core.sessions, "begin_turn", begin_then_fail)
    bad = Waiter()
    with json_logs() as logs:
        engine.submit(GenerateRequest("bad", [1, 2, 3], greedy(4), session_id="s"), bad)
        end = bad.end()
        assert end.finish_reason == "error" and end.error_code == "internal"
        assert _failed(logs(), "bad")
        assert any(x["event"] == "engine.command_failed" and x.get("request_id") == "bad" for x in logs())
    assert running.end().finish_reason == "length" and running.end().completion_tokens == 40
    monkeypatch.setattr(core.sessions, "begin_turn", real_begin)
    turn = Waiter()
    engine.submit(GenerateRequest("turn", [1, 2, 3], greedy(4), session_id="s"), turn)
    assert turn.end().finish_reason == "length"  # the failed turn did not leave the session busy


def test_flush_errors_reach_the_caller_and_the_engine_goes_on(
    engine: Engine, core: EngineCore, smollm: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_once(monkeypatch, core.kv, "evict_unlocked")
    with pytest.raises(Injected):
        engine.flush("evict_unlocked").result(10)
    # A "wait_for_idle" flush is served by the engine's timers once the request below ends.
    w = Waiter()
    engine.submit(GenerateRequest("w", _prompt(smollm), greedy(8)), w)
    fail_once(monkeypatch, core.kv, "evict_unlocked")
    waiting = engine.flush("wait_for_idle", timeout_s=60)
    assert w.end().finish_reason == "length"
    with pytest.raises(Injected):
        waiting.result(30)
    assert engine.running and engine.flush("wait_for_idle", timeout_s=60).result(30) >= 0
    after = Waiter()
    engine.submit(GenerateRequest("after", [5, 6, 7], greedy(2)), after)
    assert after.end().finish_reason == "length"
    assert engine.execute(GetStats()).result(10).errors == 2


def test_a_dead_engine_thread_fails_everything_and_calls_on_fatal(
    core: EngineCore, smollm: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step fails and so does failing its requests (the guard itself): the thread is lost."""
    fail_once(monkeypatch, core, "step")
    fail_once(monkeypatch, core.requests, "fail")
    fatal: list[BaseException] = []
    died = threading.Event()
    eng = Engine(core)
    eng.on_fatal = lambda exc: (fatal.append(exc), died.set())  # type: ignore[func-returns-value]
    eng.start()
    a, b = Waiter(), Waiter(n=2)
    with json_logs() as logs:
        eng.submit(GenerateRequest("a", _prompt(smollm), greedy(4)), a)
        eng.submit(GenerateRequest("b", [1, 2, 3], greedy(4, n=2)), b)
        assert died.wait(60)
        assert any(x["event"] == "engine.thread_died" for x in logs())
    assert len(fatal) == 1 and isinstance(fatal[0], Injected) and eng.fatal_error is fatal[0]
    for w in (a, b):
        w.end()
        ends = [o for o in w.outs if o.finished]
        assert len(ends) == w.n and all(
            o.finish_reason == "error" and o.error_code == "internal" for o in ends
        )
    assert not eng.running
    with pytest.raises(EngineStopped):
        eng.submit(GenerateRequest("late", [1, 2], greedy()), Waiter())
    with pytest.raises(EngineStopped):
        eng.execute(GetStats()).result(1)
    with pytest.raises(EngineStopped):
        eng.flush().result(1)
    eng.shutdown(drain_timeout_s=1.0)  # already stopped: returns at once
