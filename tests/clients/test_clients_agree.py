"""Client and AsyncClient send the same requests and return the same results, over real loopback gRPC.

The server here answers every method of the three services from a table and records what each call
sent (method, request bytes, metadata), so a test can compare the two clients call for call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from radixd_client import AsyncClient, Client
from radixd_client._pb import cache_admin_pb2, common_pb2, generation_pb2, session_pb2

Sent = tuple[str, bytes, tuple[tuple[str, str], ...]]
SESSION_A = session_pb2.Session(session_id="a", num_tokens=3)
SESSION_B = session_pb2.Session(session_id="b", parent_id="a")


def _events(kind: Any) -> list[Message]:
    start = common_pb2.GenerationStart(request_id="r1", prompt_tokens=3, cached_tokens=1)
    chunk = common_pb2.GenerationChunk(index=0, token_ids=[7, 8], text="hi")
    end = common_pb2.GenerationEnd(
        index=0, finish_reason=common_pb2.FINISH_REASON_LENGTH, usage=common_pb2.Usage(prompt_tokens=3)
    )
    return [kind(start=start), kind(chunk=chunk), kind(end=end)]


def _page(request: bytes) -> list[Message]:
    first = not session_pb2.ListSessionsRequest.FromString(request).page_token
    page = [SESSION_A] if first else [SESSION_B]
    return [session_pb2.ListSessionsResponse(sessions=page, next_page_token="p2" if first else "")]


ANSWERS: dict[str, Callable[[bytes], list[Message]]] = {
    "GenerationService/Generate": lambda _: _events(generation_pb2.GenerateResponse),
    "GenerationService/Tokenize": lambda _: [generation_pb2.TokenizeResponse(token_ids=[1, 2])],
    "GenerationService/Detokenize": lambda _: [generation_pb2.DetokenizeResponse(text="ab")],
    "GenerationService/GetModelInfo": lambda _: [generation_pb2.GetModelInfoResponse(model_name="m")],
    "SessionService/CreateSession": lambda _: [session_pb2.CreateSessionResponse(session=SESSION_A)],
    "SessionService/Generate": lambda _: _events(session_pb2.SessionServiceGenerateResponse),
    "SessionService/ForkSession": lambda _: [session_pb2.ForkSessionResponse(children=[SESSION_B])],
    "SessionService/GetSession": lambda _: [session_pb2.GetSessionResponse(session=SESSION_B)],
    "SessionService/ListSessions": _page,
    "SessionService/CloseSession": lambda _: [session_pb2.CloseSessionResponse(freed_blocks=4)],
    "CacheAdminService/Evict": lambda _: [cache_admin_pb2.EvictResponse(evicted_blocks=2)],
    "CacheAdminService/Flush": lambda _: [cache_admin_pb2.FlushResponse(evicted_blocks=5)],
    "CacheAdminService/Pin": lambda _: [cache_admin_pb2.PinResponse(pinned_tokens=6)],
    "CacheAdminService/GetCacheStats": lambda _: [cache_admin_pb2.GetCacheStatsResponse(nodes=9)],
    "CacheAdminService/LookupPrefix": lambda _: [cache_admin_pb2.LookupPrefixResponse(cached_tokens=3)],
    "CacheAdminService/GetLoad": lambda _: [cache_admin_pb2.GetLoadResponse(running_requests=1)],
    "CacheAdminService/SubscribeCacheEvents": lambda _: [
        cache_admin_pb2.SubscribeCacheEventsResponse(sequence=s) for s in (1, 2)
    ],
}
STREAMS = {"GenerationService/Generate", "SessionService/Generate", "CacheAdminService/SubscribeCacheEvents"}
EMPTY = {
    "GenerationService/Abort": generation_pb2.AbortResponse,
    "CacheAdminService/Unpin": cache_admin_pb2.UnpinResponse,
}


class Recorder(grpc.GenericRpcHandler):
    """Answers each method from ANSWERS (the health check with SERVING) and records what was sent."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path: str = details.method  # type: ignore[attr-defined]
        name = path.rsplit(".", 1)[-1]
        if path == "/grpc.health.v1.Health/Check":
            return grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: self._log(path, req, ctx) or b"\x08\x01"
            )
        if name in STREAMS:
            return grpc.unary_stream_rpc_method_handler(
                lambda req, ctx: iter(self._answer(name, path, req, ctx))
            )
        if name in ANSWERS or name in EMPTY:
            return grpc.unary_unary_rpc_method_handler(lambda req, ctx: self._answer(name, path, req, ctx)[0])
        return None

    def _answer(self, name: str, path: str, request: bytes, context: grpc.ServicerContext) -> list[bytes]:
        self._log(path, request, context)
        answer = ANSWERS[name](request) if name in ANSWERS else [EMPTY[name]()]
        return [m.SerializeToString() for m in answer]

    def _log(self, path: str, request: bytes, context: grpc.ServicerContext) -> None:
        md = tuple((k, v) for k, v in context.invocation_metadata() if k == "authorization")
        self.sent.append((path, request, md))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Recorder, str]]:
    recorder = Recorder()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[recorder])
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        yield recorder, f"127.0.0.1:{port}"
    finally:
        srv.stop(None)


def _sync_calls(c: Client) -> list[object]:
    session = c.create_session([{"role": "system", "content": "terse"}], ttl_s=9.0)
    return [
        c.generate("hi", request_id="r1", priority=2, max_tokens=4, stop=["\n"], regex="[a-z]+").collect(),
        c.abort("r1"),
        c.tokenize([5, 6]),
        c.detokenize([1, 2], skip_special_tokens=True),
        c.model_info(),
        c.health("radixd.v1.GenerationService"),
        session.info,
        session.send("more", timeout=30.0, temperature=0.5).collect(),
        [s.info for s in session.fork(1)],
        session.refresh(),
        list(c.list_sessions(page_size=1)),
        session.close(drop_cache=True),
        c.evict(num_blocks=3),
        c.evict(prefix="pre", namespace="ns"),
        c.evict(session_id="a"),
        c.flush("wait_for_idle", timeout_s=1.0),
        c.pin("pre", "ns"),
        c.unpin([4, 5]),
        c.cache_stats(),
        c.lookup_prefix("pre"),
        c.load(),
        list(c.cache_events(after_sequence=1)),
    ]


async def _async_calls(c: AsyncClient) -> list[object]:
    session = await c.create_session([{"role": "system", "content": "terse"}], ttl_s=9.0)
    return [
        await c.generate(
            "hi", request_id="r1", priority=2, max_tokens=4, stop=["\n"], regex="[a-z]+"
        ).collect(),
        await c.abort("r1"),
        await c.tokenize([5, 6]),
        await c.detokenize([1, 2], skip_special_tokens=True),
        await c.model_info(),
        await c.health("radixd.v1.GenerationService"),
        session.info,
        await session.send("more", timeout=30.0, temperature=0.5).collect(),
        [s.info for s in await session.fork(1)],
        await session.refresh(),
        [s async for s in c.list_sessions(page_size=1)],
        await session.close(drop_cache=True),
        await c.evict(num_blocks=3),
        await c.evict(prefix="pre", namespace="ns"),
        await c.evict(session_id="a"),
        await c.flush("wait_for_idle", timeout_s=1.0),
        await c.pin("pre", "ns"),
        await c.unpin([4, 5]),
        await c.cache_stats(),
        await c.lookup_prefix("pre"),
        await c.load(),
        [e async for e in c.cache_events(after_sequence=1)],
    ]


def test_both_clients_send_the_same_requests_and_return_the_same_results(
    server: tuple[Recorder, str],
) -> None:
    recorder, address = server
    options: dict[str, Any] = {"api_key": "k", "admin_address": address, "admin_token": "t"}
    recorder.sent.clear()
    with Client(address, **options) as c:
        got_sync = _sync_calls(c)
    sent_sync = list(recorder.sent)

    async def run_async() -> list[object]:
        async with AsyncClient(address, **options) as c:
            return await _async_calls(c)

    recorder.sent.clear()
    got_async = asyncio.run(run_async())
    assert recorder.sent == sent_sync
    assert got_async == got_sync
    assert len(sent_sync) == 23  # one request per call, two pages of sessions
    assert got_sync[0].text == "hi" and got_sync[0].ends[0].finish_reason == "length"  # type: ignore[attr-defined]
    assert got_sync[2:4] == [[1, 2], "ab"] and got_sync[5] == "SERVING"
    assert [s.session_id for s in got_sync[10]] == ["a", "b"]  # type: ignore[attr-defined]
    assert got_sync[11:18] == [4, 2, 2, 2, 5, 6, None]
    admin = [md for path, _, md in sent_sync if "CacheAdmin" in path]
    public = [md for path, _, md in sent_sync if "CacheAdmin" not in path and "Health" not in path]
    assert set(admin) == {(("authorization", "Bearer t"),)} and set(public) == {
        (("authorization", "Bearer k"),)
    }
    flush = next(req for path, req, _ in sent_sync if path.endswith("/Flush"))
    assert cache_admin_pb2.FlushRequest.FromString(flush).mode == cache_admin_pb2.FLUSH_MODE_WAIT_FOR_IDLE


def test_bad_arguments_fail_before_anything_is_sent(server: tuple[Recorder, str]) -> None:
    recorder, address = server
    recorder.sent.clear()
    with Client(address, admin_address=address) as c:
        with pytest.raises(ValueError, match="exactly one of"):
            c.evict(num_blocks=1, session_id="a")
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            c.evict(blocks=1)  # type: ignore[call-arg]
        with pytest.raises(ValueError, match="at most one constraint"):
            c.generate("x", regex="a", choice=["b"])
        with pytest.raises(ValueError, match="flush mode"):
            c.flush("later")
    with Client(address) as c, pytest.raises(ValueError, match="no admin_address"):
        c.load()
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        Client(address, api_token="k")  # type: ignore[call-arg]

    async def no_admin() -> None:
        async with AsyncClient(address) as c:
            await c.cache_stats()

    with pytest.raises(ValueError, match="no admin_address"):
        asyncio.run(no_admin())
    assert recorder.sent == []
