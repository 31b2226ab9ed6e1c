"""CacheAdminService and tenants end to end: auth, evict, flush modes, pins, events, isolation, metrics."""

from __future__ import annotations

import socket
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from e2e_kit import ADMIN_TOKEN, RunningDaemon, serve_args, start_daemon, stop_daemon, wait_until
from radixd_client import Chunk, Client

from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow
PROMPT = "Prefix caching keeps the KV of shared prompt prefixes so later requests skip their prefill."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tenants(loaded_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """A daemon with an API-keys file (tenants alice and bob) and metrics on a loopback port."""
    args = serve_args(tmp_path_factory.mktemp("tenants"), "--metrics-port", str(_free_port()), api_keys=True)
    d = start_daemon(loaded_model, args, api_key="key-alice")
    try:
        yield d
    finally:
        stop_daemon(d)


def _busy_stream(c: Client, started: threading.Event, done: threading.Event) -> tuple[threading.Thread, Any]:
    """A long request streaming on a thread; returns once it produced its first chunk."""
    stream = c.generate(PROMPT, max_tokens=60, ignore_eos=True, temperature=0.0)

    def run() -> None:
        try:
            for event in stream:
                if isinstance(event, Chunk):
                    started.set()
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.CANCELLED
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(60)
    return t, stream


def test_admin_needs_the_token(tenants: RunningDaemon) -> None:
    with tenants.client(admin_token=None) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.cache_stats()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with tenants.client(admin_token="not-the-token") as c:
        with pytest.raises(grpc.RpcError) as err:
            c.flush()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with tenants.client(admin_token=ADMIN_TOKEN) as c:
        assert c.cache_stats().total_blocks > 0


def test_public_port_needs_an_api_key(tenants: RunningDaemon) -> None:
    for key in (None, "key-mallory"):
        with tenants.client(api_key=key) as c:
            with pytest.raises(grpc.RpcError) as err:
                c.complete(PROMPT, max_tokens=1)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_tenants_do_not_share_cache(tenants: RunningDaemon) -> None:
    prompt = "Tenant isolation test: " + PROMPT
    with tenants.client("key-alice") as alice, tenants.client("key-bob") as bob:
        assert alice.complete(prompt, max_tokens=2).cached_tokens == 0
        assert bob.complete(prompt, max_tokens=2).cached_tokens == 0
        assert alice.complete(prompt, max_tokens=2).cached_tokens > 0
        assert alice.lookup_prefix(prompt, namespace="alice").cached_tokens > 0
        assert alice.lookup_prefix(prompt, namespace="carol").cached_tokens == 0
        s = alice.create_session("alice's secret context")
        with pytest.raises(grpc.RpcError) as err:
            bob.get_session(s.id)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert s.id not in [x.session_id for x in bob.list_sessions()]
        s.close()


def test_evict_frees_the_blocks_stats_report(tenants: RunningDaemon) -> None:
    with tenants.client() as c:
        c.flush()
        c.complete("Eviction test. " + PROMPT, max_tokens=8)
        before = c.cache_stats()
        assert before.cached_blocks > 0 and before.in_use_blocks == 0
        evicted = c.evict(num_blocks=before.cached_blocks)
        after = c.cache_stats()
        assert evicted == before.cached_blocks
        assert after.cached_blocks == 0
        assert after.free_blocks == before.free_blocks + evicted
        assert after.evictions["lru"] >= before.evictions["lru"] + evicted


def test_evict_by_prefix_and_session(tenants: RunningDaemon) -> None:
    with tenants.client() as c:
        c.flush()
        c.complete("Prefix eviction. " + PROMPT, max_tokens=4)
        assert c.evict(prefix="Prefix eviction.", namespace="alice") > 0
        assert c.lookup_prefix("Prefix eviction. " + PROMPT, namespace="alice").cached_tokens == 0
        s = c.create_session("Session eviction. " + PROMPT)
        s.send(" Go.", max_tokens=4).collect()
        context = s.refresh().num_tokens
        assert c.evict(session_id=s.id) > 0
        # The session's own tail is gone and is recomputed; it stays open.
        assert s.send(" Again.", max_tokens=2).collect().cached_tokens < context - 1
        s.close()


def test_flush_evict_unlocked_keeps_running_requests(tenants: RunningDaemon) -> None:
    with tenants.client() as c:
        c.complete("Flush test. " + PROMPT, max_tokens=4)
        started, done = threading.Event(), threading.Event()
        t, stream = _busy_stream(c, started, done)
        assert c.flush("evict_unlocked") > 0
        assert c.cache_stats().in_use_blocks > 0  # the running request kept its blocks
        stream.cancel()
        t.join(60)
        assert done.is_set()


def test_flush_refuse_if_busy(tenants: RunningDaemon) -> None:
    with tenants.client() as c:
        started, done = threading.Event(), threading.Event()
        t, stream = _busy_stream(c, started, done)
        with pytest.raises(grpc.RpcError) as err:
            c.flush("refuse_if_busy")
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "in flight" in err.value.details()
        stream.cancel()
        t.join(60)
        wait_until(lambda: c.load().running_requests + c.load().waiting_requests == 0, what="idle")
        c.flush("refuse_if_busy")  # idle now: accepted


def test_flush_wait_for_idle(tenants: RunningDaemon) -> None:
    with tenants.client() as c:
        started, done = threading.Event(), threading.Event()
        t, _stream = _busy_stream(c, started, done)
        with pytest.raises(grpc.RpcError) as err:
            c.flush("wait_for_idle", timeout_s=0.05)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        c.flush("wait_for_idle", timeout_s=120)
        assert done.is_set() or t.join(1) is None
        stats = c.cache_stats()
        assert stats.cached_blocks == 0 and stats.in_use_blocks == 0
        t.join(10)


def test_pin_survives_flush(tenants: RunningDaemon) -> None:
    prompt = "Pinned prefix. " + PROMPT
    with tenants.client() as c:
        c.complete(prompt, max_tokens=2)
        assert c.pin(prompt, namespace="alice") > 0
        c.flush()
        assert c.lookup_prefix(prompt, namespace="alice").cached_tokens > 0
        c.unpin(prompt, namespace="alice")
        c.flush()
        assert c.lookup_prefix(prompt, namespace="alice").cached_tokens == 0


STORED, REMOVED, CLEARED = 1, 2, 3


def test_cache_events_mirror_the_cache(tenants: RunningDaemon) -> None:
    """A router that reads only the event stream knows exactly which prefixes are cached, LRU
    evictions included (the tree itself reports every change)."""
    with tenants.client() as c:
        c.flush()  # start from an empty cache, so the stream below describes all of it
        before = tenants.state.events.num_subscribers
        kv = tenants.state.engine.core.kv
        # Nobody subscribes yet: the tree has no listener, so its changes cost no translation.
        wait_until(lambda: not kv.listening, what="no cache listener without subscribers")
        stream = c.cache_events(timeout=60)
        got: list[Any] = []
        ready = threading.Event()

        def read() -> None:
            ready.set()
            try:
                for e in stream:
                    got.append(e)
            except grpc.RpcError:
                pass  # cancelled below

        t = threading.Thread(target=read, daemon=True)
        t.start()
        ready.wait(5)
        # The stream carries only events after it registers: act once the server has registered it.
        wait_until(lambda: tenants.state.events.num_subscribers > before, what="the subscription to register")
        assert kv.listening  # installed before the subscription registered, so no event is missed
        prompts = ["Events test one. " + PROMPT, "Events test one. " + PROMPT + " And another turn."]
        for p in prompts:
            c.complete(p, max_tokens=3, temperature=0.0)
        evicted = c.evict(num_blocks=1)
        wait_until(lambda: any(e.kind == REMOVED and e.reason == "lru" for e in got), timeout=10)
        cover: dict[tuple[str, tuple[int, ...]], int] = {}
        for e in got:
            sign = {STORED: 1, REMOVED: -1}.get(e.kind, 0)
            for i in range(e.start + 1, len(e.token_ids) + 1):
                key = (e.namespace, tuple(e.token_ids[:i]))
                cover[key] = cover.get(key, 0) + sign
        cached = {key for key, n in cover.items() if n > 0}
        for p in [*prompts, "Events test two."]:
            ids = tuple(c.tokenize(p))
            mirrored = max(i for i in range(len(ids) + 1) if i == 0 or ("alice", ids[:i]) in cached)
            assert mirrored == c.lookup_prefix(p, namespace="alice").cached_tokens, p
        c.flush()

        def blocks(kind: int) -> int:
            return sum(e.num_blocks for e in list(got) if e.kind == kind)

        # A flush removes leaf by leaf, one event per node, so wait for the whole cascade to arrive
        # rather than the first removal; lost or missing events leave this unbalanced and time out.
        wait_until(lambda: blocks(REMOVED) == blocks(STORED), timeout=10, what="flush removals to arrive")
        stream.cancel()
        t.join(10)
        wait_until(lambda: not kv.listening, what="the last unsubscribe to remove the listener")
    kinds = {e.kind for e in got}
    # An unlocked flush removes leaf by leaf (a locked node would stay); CLEARED means a forced drop.
    assert STORED in kinds and REMOVED in kinds and CLEARED not in kinds
    assert evicted >= 1
    assert all(e.namespace == "alice" for e in got if e.kind != CLEARED)
    seqs = [e.sequence for e in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    stored = sum(e.num_blocks for e in got if e.kind == STORED)
    removed = sum(e.num_blocks for e in got if e.kind == REMOVED)
    assert stored == removed > 0  # the cache started and ended empty
    assert any(e.kind == REMOVED and e.reason == "flush" for e in got)


def test_metrics_endpoint(tenants: RunningDaemon) -> None:
    with tenants.client() as c:
        c.complete(PROMPT, max_tokens=3)
    port = tenants.daemon.metrics_port
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for name in (
        "radixd_requests_total",
        "radixd_ttft_seconds_bucket",
        "radixd_blocks{",
        "radixd_generated_tokens",
    ):
        assert name in body, name
    wait_until(lambda: tenants.state.active_streams == 0)
