"""Admin and session commands: applied on the engine thread, typed results, unknown ones refused."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest
from engine_kit import greedy, make_core

from radixd.daemon.engine.commands import (
    AddCacheListener,
    CloseSession,
    Command,
    CreateSession,
    Evict,
    ForkSession,
    GetSession,
    GetStats,
    ListSessions,
    LookupPrefix,
    RemoveCacheListener,
    Submit,
)
from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.engine import Engine
from radixd.daemon.engine.stats import EngineStats
from radixd.daemon.engine.types import GenerateRequest, RequestOutput
from radixd.daemon.errors import InvalidRequest, TooManySessions, UnknownSession
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Bogus(Command[int]):
    """A command no engine component handles."""


class Waiter:
    """A thread-safe sink that signals when its request finished."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def __call__(self, out: RequestOutput) -> None:
        if out.finished:
            self.done.set()


@pytest.fixture
def core(smollm: LoadedModel) -> EngineCore:
    return make_core(smollm, num_blocks=64)


def test_a_command_runs_on_the_engine_thread_and_returns_its_result(
    engine: Engine, core: EngineCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    real = core.execute

    def recording(cmd: Command[Any]) -> Any:
        threads.append(threading.current_thread().name)
        return real(cmd)

    monkeypatch.setattr(core, "execute", recording)
    info = engine.execute(CreateSession("alice", [1, 2, 3], session_id="s")).result(10)
    assert info.session_id == "s" and info.namespace == "alice" and info.tokens == (1, 2, 3)
    assert engine.execute(GetSession("s", "alice")).result(10).num_tokens == 3
    load = engine.execute(GetStats()).result(10)
    assert isinstance(load, EngineStats) and load.sessions == 1 and load.free_blocks == load.total_blocks
    assert engine.execute(LookupPrefix([1, 2, 3], "alice")).result(10) == 0  # nothing computed yet
    children = engine.execute(ForkSession("s", 2, "alice")).result(10)
    assert [c.parent_id for c in children] == ["s", "s"]
    assert len(engine.execute(ListSessions("alice")).result(10)) == 3
    assert engine.execute(CloseSession("s", "alice")).result(10) == 0
    assert threads and set(threads) == {"radixd-engine"}


def test_unknown_and_invalid_commands_are_refused_clearly(engine: Engine) -> None:
    with pytest.raises(InvalidRequest, match=r"Bogus is not an engine command; the engine runs .*Evict"):
        engine.execute(Bogus()).result(10)
    not_a_command: Any = lambda core: core  # noqa: E731 (what `Engine.call` used to take)
    refused = engine.execute(not_a_command)
    assert refused.done()  # refused on the caller's thread, never queued
    with pytest.raises(InvalidRequest, match="takes an engine command"):
        refused.result(0)
    unchecked = engine.execute(Submit(GenerateRequest("x", [1], greedy()), lambda out: None))
    with pytest.raises(InvalidRequest, match=r"with Engine\.submit"):  # checked and counted there only
        unchecked.result(0)
    assert engine.running  # the engine goes on


def test_session_commands_keep_tenants_apart_and_respect_the_limit(core: EngineCore) -> None:
    """Driven on this thread: `EngineCore.execute` applies a command at once."""
    core.execute(CreateSession("alice", [5, 6], session_id="a"))
    with pytest.raises(UnknownSession):
        core.execute(GetSession("a", "bob"))
    with pytest.raises(UnknownSession):
        core.execute(CloseSession("a", "bob"))
    assert core.execute(GetSession("a")).namespace == "alice"  # None: the admin sees every tenant
    with pytest.raises(TooManySessions, match="1 sessions are open and at most 2 may be"):
        core.execute(ForkSession("a", 2, "alice", max_sessions=2))
    with pytest.raises(TooManySessions):
        core.execute(CreateSession("bob", max_sessions=1))
    assert [s.session_id for s in core.execute(ListSessions())] == ["a"]


class Recorder:
    """A cache listener that records what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        self.events.append(("stored", len(tokens)))

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        self.events.append(("removed", len(tokens)))


def test_cache_listeners_are_installed_by_command_and_only_while_added(
    engine: Engine, core: EngineCore
) -> None:
    assert not core.kv.listening  # nobody listens: a tree change costs one test, nothing more
    engine.execute(CreateSession(tokens=[3] * 40, session_id="warm")).result(10)
    w = Waiter()
    engine.submit(GenerateRequest("g", [3] * 40, greedy(2)), w)
    assert w.done.wait(60) and not core.kv.listening
    a, b = Recorder(), Recorder()
    engine.execute(AddCacheListener(a, replay=True)).result(10)
    assert a.events and {kind for kind, _ in a.events} == {"stored"}  # the cached content, replayed
    engine.execute(AddCacheListener(b)).result(10)
    assert b.events == []  # no replay asked: only changes from now on
    engine.execute(Evict(1000)).result(10)
    assert a.events[-1][0] == b.events[-1][0] == "removed"
    engine.execute(RemoveCacheListener(a)).result(10)
    assert core.kv.listening
    engine.execute(RemoveCacheListener(b)).result(10)
    assert not core.kv.listening and core.kv.tree.listener is None
