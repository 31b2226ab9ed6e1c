"""GenerationService end to end: streaming, bad input, cancellation, deadlines, health."""

from __future__ import annotations

import threading

import grpc
import pytest
from e2e_kit import RunningDaemon, wait_until
from radixd_client import Chunk, End, Start

from radixd.daemon.engine.types import GenerateRequest, RequestOutput
from radixd.daemon.executor.sampling import SamplingParams

pytestmark = pytest.mark.slow
PROMPT = "The three primary colors are"


def in_use_blocks(d: RunningDaemon) -> int:
    with d.client() as c:
        return c.cache_stats().in_use_blocks


def test_health_serving(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        assert c.health() == "SERVING"
        assert c.health("radixd.v1.GenerationService") == "SERVING"


def test_stream_equals_unstreamed_engine_result(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        events = list(c.generate(PROMPT, max_tokens=12, temperature=0.0))
        ids = c.tokenize(PROMPT)
        detok = c.detokenize([t for e in events if isinstance(e, Chunk) for t in e.token_ids])
    assert isinstance(events[0], Start) and events[0].prompt_tokens == len(ids)
    assert isinstance(events[-1], End) and events[-1].finish_reason in ("length", "stop")
    chunks = [e for e in events if isinstance(e, Chunk)]
    streamed_ids = [t for e in chunks for t in e.token_ids]
    streamed_text = "".join(e.text for e in chunks)
    assert events[-1].completion_tokens == len(streamed_ids) > 0
    assert streamed_text == detok

    # The same request straight into the engine, collected whole (no gRPC, no streaming).
    done = threading.Event()
    outs: list[RequestOutput] = []

    def sink(out: RequestOutput) -> None:
        outs.append(out)
        if out.finished:
            done.set()

    req = GenerateRequest("direct-1", ids, SamplingParams(max_tokens=12, temperature=0.0))
    daemon.state.engine.submit(req, sink)
    assert done.wait(60)
    assert [t for o in outs for t in o.new_token_ids] == streamed_ids
    assert "".join(o.text_delta for o in outs) == streamed_text


def test_model_info(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        info = c.model_info()
    assert info.vocab_size > 1000 and info.block_size == 16 and info.context_length > 0
    assert "sessions" in info.features and list(info.eos_token_ids)


@pytest.mark.parametrize(
    ("prompt", "sampling", "needle"),
    [
        ("", {}, "empty"),
        ([1, -3, 5], {}, "out of range"),
        ([1, 10**7], {}, "out of range"),
        (PROMPT, {"temperature": -1.0}, "temperature"),
        (PROMPT, {"top_p": 0.0}, "top_p"),
        (PROMPT, {"max_tokens": 0}, "max_tokens"),
        (PROMPT, {"max_tokens": 10**6}, "context length"),
    ],
)
def test_bad_input_is_invalid_argument_and_daemon_keeps_serving(
    daemon: RunningDaemon, prompt: str | list[int], sampling: dict[str, float], needle: str
) -> None:
    with daemon.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            list(c.generate(prompt, **sampling))  # type: ignore[arg-type]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in err.value.details()
        assert c.complete(PROMPT, max_tokens=2, temperature=0.0).completion_tokens == 2


def test_unknown_session_is_not_found(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            list(c.session_generate("no-such-session", "hi"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no-such-session" in err.value.details()
        assert c.complete(PROMPT, max_tokens=1).completion_tokens == 1


def test_cancel_mid_stream_frees_blocks(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        stream = c.generate(PROMPT * 4, max_tokens=400, temperature=0.0, ignore_eos=True)
        it = iter(stream)
        seen = 0
        for event in it:
            if isinstance(event, Chunk):
                seen += 1
                if seen == 2:
                    assert in_use_blocks(daemon) > 0
                    break
        stream.cancel()
    wait_until(lambda: in_use_blocks(daemon) == 0, what="the cancelled request's blocks to be released")
    wait_until(lambda: daemon.state.active_streams == 0, what="the handler to finish")


def test_deadline_ends_stream_and_frees_blocks(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        with pytest.raises(grpc.RpcError) as err:
            list(c.generate(PROMPT, max_tokens=400, ignore_eos=True, timeout=1.0))
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(lambda: in_use_blocks(daemon) == 0, what="the expired request's blocks to be released")


def test_abort_by_request_id(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        stream = c.generate(PROMPT, request_id="abort-me", max_tokens=400, ignore_eos=True)
        events = iter(stream)
        assert isinstance(next(events), Start)
        c.abort("abort-me")
        rest = list(events)
    assert isinstance(rest[-1], End) and rest[-1].finish_reason == "abort"


def test_n_completions_share_one_stream(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        stream = c.generate(PROMPT, max_tokens=3, temperature=0.8, seed=1, n=2, ignore_eos=True)
        events = list(stream)
    ends = [e for e in events if isinstance(e, End)]
    assert sorted(e.index for e in ends) == [0, 1]
    assert all(len(stream.completion.token_ids[i]) == 3 for i in (0, 1))


def test_logprobs_in_chunks(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        chunks = [
            e for e in c.generate(PROMPT, max_tokens=3, temperature=0.0, logprobs=2) if isinstance(e, Chunk)
        ]
    pairs = [(tid, lp) for ch in chunks for tid, lp in zip(ch.token_ids, ch.logprobs, strict=True)]
    assert len(pairs) == 3
    for tid, (lp_tid, logprob, top) in pairs:
        assert lp_tid == tid and logprob <= 0.0 and len(top) == 2
        assert top[0][1] >= top[1][1]
