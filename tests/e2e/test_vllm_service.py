"""The vLLM worker protocol (`vllm.grpc.engine.VllmEngine`) on the public port, over real loopback gRPC.

Every answer is checked against radixd's own API (`radixd.v1`) or the model's own tokenizer.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from e2e_kit import ADMIN_TOKEN, RunningDaemon, serve_args, start_daemon, stop_daemon, wait_until
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from tokenizers import Tokenizer

from radixd.daemon.loaders import LoadedModel
from radixd.daemon.server.common.kv_events import chain
from radixd.daemon.server.vllm.tool_template import with_tool_rendering

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome. The"


@pytest.fixture(scope="module")
def stub(daemon: RunningDaemon) -> Iterator[vllm_engine_pb2_grpc.VllmEngineStub]:
    with grpc.insecure_channel(daemon.address) as channel:
        yield vllm_engine_pb2_grpc.VllmEngineStub(channel)


def _request(ids: list[int], rid: str, stream: bool = False, **sampling: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(**sampling),  # type: ignore[arg-type]
        stream=stream,
    )


def _in_use(daemon: RunningDaemon) -> int:
    return daemon.client().cache_stats().in_use_blocks


def test_vllm_health_model_and_server_info(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, daemon: RunningDaemon
) -> None:
    health = stub.HealthCheck(pb.HealthCheckRequest())
    assert health.healthy, health.message
    info = stub.GetModelInfo(pb.GetModelInfoRequest())
    own = daemon.client().model_info()
    assert info.served_model_name == "SmolLM2-135M-Instruct"
    assert info.max_context_length == own.context_length and info.vocab_size == own.vocab_size
    assert list(info.eos_token_ids) == list(own.eos_token_ids)
    assert Path(info.model_path).exists()
    assert sorted(p.name for p in Path(info.tokenizer_path).iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    server = stub.GetServerInfo(pb.GetServerInfoRequest())
    assert server.block_size == own.block_size and server.max_num_seqs == 64
    assert server.server_type == "vllm-grpc" and server.data_parallel_size == 1


def test_vllm_greedy_generate_equals_radixd_api_streamed_and_not(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, daemon: RunningDaemon, loaded_model: LoadedModel
) -> None:
    ids = loaded_model.tokenizer.encode(PROMPT)
    own = daemon.client().complete(ids, max_tokens=8, temperature=0.0)
    [whole] = list(stub.Generate(_request(ids, "whole", temperature=0.0, max_tokens=8)))
    assert whole.WhichOneof("response") == "complete"
    assert list(whole.complete.output_ids) == own.token_ids[0]
    assert whole.complete.finish_reason == own.ends[0].finish_reason == "length"
    assert whole.complete.prompt_tokens == len(ids) and whole.complete.completion_tokens == 8
    assert whole.complete.cached_tokens > 0  # the radixd.v1 run cached the prompt
    streamed = list(stub.Generate(_request(ids, "streamed", True, temperature=0.0, max_tokens=8)))
    chunks = [r.chunk for r in streamed if r.WhichOneof("response") == "chunk"]
    assert [r.WhichOneof("response") for r in streamed][-1] == "complete"
    assert [t for c in chunks for t in c.token_ids] == own.token_ids[0]
    assert [c.completion_tokens for c in chunks] == list(range(1, 9))
    assert streamed[-1].complete.finish_reason == "length" and not streamed[-1].complete.output_ids


def test_vllm_n_samples_stop_ids_stop_strings_and_logprobs(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, loaded_model: LoadedModel
) -> None:
    tok = loaded_model.tokenizer
    ids = tok.encode(PROMPT)
    completes = [r.complete for r in stub.Generate(_request(ids, "n3", n=3, seed=5, max_tokens=6))]
    assert sorted(c.index for c in completes) == [0, 1, 2]
    assert all(len(c.output_ids) == c.completion_tokens == 6 for c in completes)
    [greedy] = stub.Generate(_request(ids, "g", temperature=0.0, max_tokens=8))
    out = list(greedy.complete.output_ids)
    stop_id = out[2]
    [by_id] = stub.Generate(_request(ids, "sid", temperature=0.0, max_tokens=8, stop_token_ids=[stop_id]))
    assert list(by_id.complete.output_ids) == out[: out.index(stop_id) + 1]
    assert by_id.complete.finish_reason == "stop" and by_id.complete.matched_token_id == stop_id
    word = tok.decode(out[3:5]).strip()
    [by_str] = stub.Generate(_request(ids, "sstr", temperature=0.0, max_tokens=8, stop=[word]))
    assert by_str.complete.finish_reason == "stop" and by_str.complete.matched_stop_str == word
    assert word in tok.decode(list(by_str.complete.output_ids))
    assert len(by_str.complete.output_ids) < 8
    [lp] = stub.Generate(_request(ids, "lp", temperature=0.0, max_tokens=3, logprobs=2))
    logprobs = lp.complete.output_logprobs
    assert list(logprobs.token_ids) == out[:3] and len(logprobs.token_logprobs) == 3
    assert all(len(top.token_ids) == 2 for top in logprobs.top_logprobs)


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"logit_bias": {5: 200.0}}, "sampling_params: logit_bias[5] must be in [-100, 100]"),
        ({"json_schema": "[]"}, "sampling_params.json_schema must be a JSON object"),
        ({"regex": ""}, "sampling_params.regex is empty"),
        ({"prompt_logprobs": -1}, "sampling_params.prompt_logprobs"),
        ({"logprobs": -1}, "sampling_params.logprobs"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 1000}, "sampling_params.n"),
        ({"max_tokens": 10**6}, "sampling_params.max_tokens"),
        ({"truncate_prompt_tokens": 0}, "sampling_params.truncate_prompt_tokens"),
    ],
)
def test_vllm_unsupported_or_invalid_sampling_is_refused_naming_the_field(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, sampling: dict[str, object], field: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(_request([1, 2, 3], "bad", **sampling)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.value.details() or "")


def test_vllm_multimodal_input_is_refused(stub: vllm_engine_pb2_grpc.VllmEngineStub) -> None:
    req = _request([1, 2, 3], "mm")
    req.mm_inputs.im_token_id = 7
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(req))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "mm_inputs" in (err.value.details() or "")


def test_vllm_truncate_prompt_keeps_the_last_tokens(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, loaded_model: LoadedModel
) -> None:
    ids = loaded_model.tokenizer.encode(PROMPT)
    [r] = stub.Generate(_request(ids, "trunc", max_tokens=1, temperature=0.0, truncate_prompt_tokens=5))
    assert r.complete.prompt_tokens == 5


def test_vllm_abort_ends_the_stream_and_releases_its_blocks(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, daemon: RunningDaemon, loaded_model: LoadedModel
) -> None:
    ids = loaded_model.tokenizer.encode(PROMPT + " one more time")
    call = stub.Generate(_request(ids, "to-abort", True, max_tokens=400, ignore_eos=True))
    first = next(call)
    assert first.WhichOneof("response") == "chunk"
    stub.Abort(pb.AbortRequest(request_ids=["to-abort", "unknown-id"]))
    rest = list(call)
    assert rest[-1].complete.finish_reason == "abort"
    assert sum(len(r.chunk.token_ids) for r in rest) < 399
    wait_until(lambda: _in_use(daemon) == 0, what="the aborted request's blocks to be released")


def test_vllm_cancelled_call_releases_its_blocks(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, daemon: RunningDaemon, loaded_model: LoadedModel
) -> None:
    ids = loaded_model.tokenizer.encode(PROMPT + " cancel")
    call = stub.Generate(_request(ids, "to-cancel", True, max_tokens=400, ignore_eos=True))
    next(call)
    call.cancel()
    wait_until(lambda: _in_use(daemon) == 0, what="the cancelled request's blocks to be released")


def test_vllm_get_loads_and_tokenizer_bundle(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, loaded_model: LoadedModel
) -> None:
    loads = stub.GetLoads(pb.GetLoadsRequest())
    assert loads.dp_rank_count == 1 and loads.loads[0].max_total_num_tokens > 0
    chunks = list(stub.GetTokenizer(common_pb2.GetTokenizerRequest()))
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    assert all(not c.sha256 for c in chunks[:-1])
    files = zipfile.ZipFile(io.BytesIO(data))
    tok = Tokenizer.from_str(files.read("tokenizer.json").decode())
    text = "Hello, world! Ünïcödé and code: def f(x): return x**2"
    assert tok.encode(text, add_special_tokens=False).ids == loaded_model.tokenizer.encode(text)
    config = json.loads(files.read("tokenizer_config.json"))
    # the model's template, with the tool-call rendering it lacks put before it
    template = with_tool_rendering(loaded_model.tokenizer.chat_template)
    assert template.endswith(loaded_model.tokenizer.chat_template)
    assert config["chat_template"] == template
    assert files.read("chat_template.jinja").decode() == template
    assert json.loads(files.read("config.json"))["vocab_size"] == loaded_model.config.vocab_size


def _subscribe(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, start: int = 0, metadata: tuple[tuple[str, str], ...] = ()
) -> tuple[list[common_pb2.KvEventBatch], threading.Thread, grpc.Future]:
    """Collect a subscription's batches on a thread; cancel the returned call to stop it."""
    call = stub.SubscribeKvEvents(
        common_pb2.SubscribeKvEventsRequest(
            start_sequence_number=start, load_records_before_first_batch=True
        ),
        metadata=metadata,
    )
    seen: list[common_pb2.KvEventBatch] = []

    def read() -> None:
        try:
            for batch in call:
                seen.append(batch)
        except grpc.RpcError:
            pass

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return seen, thread, call


def _stored(batches: list[common_pb2.KvEventBatch]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for batch in batches:
        for event in batch.events:
            kind = event.WhichOneof("data")
            if kind == "cleared":
                out.clear()
            elif kind == "removed":
                for h in event.removed.block_hashes:
                    out.pop(h, None)
            else:
                for block in event.stored.blocks:
                    out[block.block_hash] = list(block.token_ids)
    return out


def test_vllm_kv_events_snapshot_live_blocks_flush_and_load_records(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, daemon: RunningDaemon, loaded_model: LoadedModel
) -> None:
    ids = loaded_model.tokenizer.encode("A fresh prefix for the event test: " + PROMPT)
    list(stub.Generate(_request(ids, "ev1", temperature=0.0, max_tokens=4)))
    seen, thread, call = _subscribe(stub)
    try:
        wait_until(lambda: any(b.HasField("snapshot") for b in seen), what="the snapshot")
        first = seen[0]
        assert first.sequence_number == 0 and first.load.load_only
        expected = chain("", ids, 16, len(ids) // 16)
        assert set(expected) <= set(_stored(seen))
        other = loaded_model.tokenizer.encode("Another prefix, long enough for two blocks of tokens. " * 3)
        list(stub.Generate(_request(other, "ev2", temperature=0.0, max_tokens=2)))
        other_ids = chain("", other, 16, len(other) // 16)
        wait_until(lambda: set(other_ids) <= set(_stored(seen)), what="the new blocks")
        live = [b for b in seen if b.events and not b.HasField("snapshot")]
        assert all(b.HasField("load") and not b.load.load_only for b in live)
        numbers = [b.sequence_number for b in seen if b.events]
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
        with pytest.raises(grpc.RpcError) as err:
            stub.FlushCache(common_pb2.FlushCacheRequest())
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert set(other_ids) <= set(_stored(seen))
        bad = (("authorization", "Bearer not-the-token"),)
        with pytest.raises(grpc.RpcError) as err:
            stub.FlushCache(common_pb2.FlushCacheRequest(), metadata=bad)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        admin = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
        flushed = stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=10), metadata=admin)
        assert flushed.success, flushed.message
        wait_until(lambda: not _stored(seen), what="the flush to remove every block")
        last = max(b.sequence_number for b in seen)
        resumed, thread2, call2 = _subscribe(stub, start=last - 1)
        wait_until(lambda: any(b.events for b in resumed), what="the replay")
        call2.cancel()
        thread2.join(5)
        replayed = [b for b in resumed if b.events]
        assert replayed[0].sequence_number == last - 1 and not replayed[0].HasField("snapshot")
    finally:
        call.cancel()
        thread.join(5)


def test_vllm_tenants_authenticate_and_see_only_their_own_blocks(
    loaded_model: LoadedModel, tmp_path: Path
) -> None:
    d = start_daemon(loaded_model, serve_args(tmp_path, api_keys=True))
    try:
        with grpc.insecure_channel(d.address) as channel:
            stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
            assert stub.HealthCheck(pb.HealthCheckRequest()).healthy  # probes need no key
            with pytest.raises(grpc.RpcError) as err:
                stub.GetModelInfo(pb.GetModelInfoRequest())
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            alice = (("authorization", "Bearer key-alice"),)
            bob = (("authorization", "Bearer key-bob"),)
            seen, thread, call = _subscribe(stub, metadata=alice)
            try:
                ids_a = loaded_model.tokenizer.encode("Alice's secret system prompt. " * 4)
                ids_b = loaded_model.tokenizer.encode("Bob's entirely different system prompt. " * 4)
                list(stub.Generate(_request(ids_b, "b", max_tokens=2), metadata=bob))
                list(stub.Generate(_request(ids_a, "a", max_tokens=2), metadata=alice))
                wait_until(lambda: len(_stored(seen)) >= len(ids_a) // 16, what="alice's blocks")
                bob_blocks = [ids_b[i * 16 : (i + 1) * 16] for i in range(len(ids_b) // 16)]
                assert not [b for b in _stored(seen).values() if b in bob_blocks]
                assert set(chain("t:alice", ids_a, 16, len(ids_a) // 16)) <= set(_stored(seen))
                assert not set(chain("t:bob", ids_b, 16, len(ids_b) // 16)) & set(_stored(seen))
            finally:
                call.cancel()
                thread.join(5)
    finally:
        stop_daemon(d)


def test_inference_extension_metric_names_are_served(
    daemon: RunningDaemon, loaded_model: LoadedModel
) -> None:
    ids = loaded_model.tokenizer.encode(PROMPT)
    call = daemon.client().generate(ids, max_tokens=200, ignore_eos=True)
    stream = iter(call)
    next(stream)  # running now: it holds blocks
    url = f"http://127.0.0.1:{daemon.daemon.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    call.cancel()
    values = {
        line.split(" ")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:")
    }
    assert values["vllm:num_requests_running"] == 1
    assert values["vllm:num_requests_waiting"] == 0
    assert 0 < values["vllm:kv_cache_usage_perc"] == values["vllm:gpu_cache_usage_perc"] < 1
    total = daemon.client().cache_stats().total_blocks
    assert f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{total}"}} 1.0' in text
