"""Client-side conversions: prompts, sampling options, stream events, health wire format."""

from __future__ import annotations

import pytest
from radixd_client._pb import cache_admin_pb2, common_pb2, generation_pb2
from radixd_client.core import decode_health_response, encode_health_request
from radixd_client.options import evict_request, flush_mode
from radixd_client.types import Chunk, End, Start, collect, from_response, to_prompt, to_sampling


def test_to_prompt_kinds() -> None:
    assert to_prompt("hi").text == "hi"
    assert list(to_prompt([1, 2, 3]).token_ids.ids) == [1, 2, 3]
    chat = to_prompt([{"role": "user", "content": "yo"}]).chat
    assert chat.messages[0].role == "user" and chat.add_generation_prompt
    with pytest.raises(TypeError, match="prompt must be"):
        to_prompt([1, "a"])  # type: ignore[list-item]


def test_to_sampling_leaves_unset_fields_unset() -> None:
    msg = to_sampling({"max_tokens": 5, "stop": ["\n"], "temperature": 0.0})
    assert msg.HasField("max_tokens") and msg.HasField("temperature")
    assert not msg.HasField("top_p") and list(msg.stop) == ["\n"]


def test_from_response_and_collect() -> None:
    msgs = [
        generation_pb2.GenerateResponse(
            start=common_pb2.GenerationStart(request_id="r", prompt_tokens=4, cached_tokens=2)
        ),
        generation_pb2.GenerateResponse(
            chunk=common_pb2.GenerationChunk(index=0, token_ids=[7, 8], text="ab")
        ),
        generation_pb2.GenerateResponse(
            end=common_pb2.GenerationEnd(
                index=0,
                finish_reason=common_pb2.FINISH_REASON_LENGTH,
                usage=common_pb2.Usage(completion_tokens=2),
            )
        ),
    ]
    events = [from_response(m) for m in msgs]
    assert isinstance(events[0], Start) and isinstance(events[1], Chunk) and isinstance(events[2], End)
    done = collect(events)
    assert (done.text, done.token_ids[0], done.cached_tokens, done.finish_reason) == (
        "ab",
        [7, 8],
        2,
        "length",
    )


def test_admin_request_helpers() -> None:
    assert flush_mode("wait_for_idle") == cache_admin_pb2.FLUSH_MODE_WAIT_FOR_IDLE
    with pytest.raises(ValueError, match="flush mode"):
        flush_mode("everything")
    assert evict_request(3, None, None, "").num_blocks == 3
    assert evict_request(None, "abc", None, "t").prefix.text == "abc"
    with pytest.raises(ValueError, match="exactly one"):
        evict_request(3, "abc", None, "")


def test_health_wire_format_matches_grpc_health() -> None:
    from grpc_health.v1 import health_pb2  # the daemon serves it; the client package must not need it

    req = health_pb2.HealthCheckRequest.FromString(encode_health_request("radixd.v1.GenerationService"))
    assert req.service == "radixd.v1.GenerationService"
    assert encode_health_request("") == health_pb2.HealthCheckRequest().SerializeToString()
    for status, name in ((1, "SERVING"), (2, "NOT_SERVING")):
        data = health_pb2.HealthCheckResponse(status=status).SerializeToString()
        assert decode_health_response(data) == name
    assert decode_health_response(b"") == "UNKNOWN"


def test_client_flush_modes_are_the_engines() -> None:
    """One flush vocabulary from the wire to the engine: the client (installable alone, so it cannot
    import the daemon) names the modes exactly as the engine's `FlushMode` does."""
    from radixd_client.options import FLUSH_MODES as CLIENT_FLUSH_MODES

    from radixd.daemon.engine.types import FLUSH_MODES

    assert sorted(CLIENT_FLUSH_MODES) == sorted(FLUSH_MODES)
