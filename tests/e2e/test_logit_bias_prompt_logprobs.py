"""`logit_bias` and `prompt_logprobs` over real loopback gRPC: radixd's own API and the vLLM protocol.

Prompt logprobs are checked against one direct full forward of the same weights (float32), and the
two wires against each other; bad values are refused with INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import torch
from e2e_kit import RunningDaemon
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc

from radixd.daemon.executor.runner import ModelRunner, StepSeq
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
ATOL = 2e-4


@pytest.fixture(scope="module")
def stub(daemon: RunningDaemon) -> Iterator[vllm_engine_pb2_grpc.VllmEngineStub]:
    with grpc.insecure_channel(daemon.address) as channel:
        yield vllm_engine_pb2_grpc.VllmEngineStub(channel)


@pytest.fixture(scope="module")
def ids(loaded_model: LoadedModel) -> list[int]:
    return loaded_model.tokenizer.encode(PROMPT)


@pytest.fixture(scope="module")
def reference(loaded_model: LoadedModel, ids: list[int]) -> torch.Tensor:
    """log_softmax of one direct full forward over the prompt: [len(ids), vocab]."""
    blocks = len(ids) // 16 + 1
    runner = ModelRunner(loaded_model.model, num_blocks=blocks + 1, block_size=16)
    logits = runner.step_logits([StepSeq(0, ids, 0, list(range(1, blocks + 1)), None)])
    return torch.log_softmax(logits.double(), dim=1)


def test_prompt_logprobs_through_the_radixd_api(
    daemon: RunningDaemon, ids: list[int], reference: torch.Tensor
) -> None:
    with daemon.client() as c:
        warm = c.complete(ids, max_tokens=3, temperature=0.0)
        scored = c.complete(ids, max_tokens=3, temperature=0.0, prompt_logprobs=2)
        none = c.complete(ids, max_tokens=3, temperature=0.0)
    assert scored.token_ids == warm.token_ids == none.token_ids
    assert not warm.prompt_logprobs and not none.prompt_logprobs
    assert none.cached_tokens == len(ids) - 1 and scored.cached_tokens == 0  # computed, not read
    lps = scored.prompt_logprobs
    assert [t for t, _, _ in lps] == ids[1:]
    for q, (tid, lp, top) in enumerate(lps):
        assert lp == pytest.approx(float(reference[q, tid]), abs=ATOL)
        values, best = torch.topk(reference[q], 2)
        assert [t for t, _ in top] == best.tolist()
        assert [v for _, v in top] == pytest.approx(values.tolist(), abs=ATOL)


def test_logit_bias_through_the_radixd_api(
    daemon: RunningDaemon, loaded_model: LoadedModel, ids: list[int]
) -> None:
    forced = loaded_model.tokenizer.encode(" Madrid", add_special_tokens=False)[0]
    with daemon.client() as c:
        plain = c.complete(ids, max_tokens=4, temperature=0.0).token_ids[0]
        assert (
            c.complete(ids, max_tokens=4, temperature=0.0, logit_bias={forced: 100.0}).token_ids[0]
            == [forced] * 4
        )
        banned = c.complete(ids, max_tokens=4, temperature=0.0, logit_bias={plain[0]: -100.0}).token_ids[0]
        sampled = c.complete(ids, max_tokens=4, temperature=1.0, seed=3, logit_bias={forced: 100.0})
    assert banned[0] != plain[0]
    assert sampled.token_ids[0] == [forced] * 4


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"logit_bias": {5: 100.5}}, "logit_bias[5] must be in [-100, 100]"),
        ({"logit_bias": {5: float("nan")}}, "logit_bias[5] must be finite"),
        ({"logit_bias": {-1: 1.0}}, "sampling.logit_bias token id -1"),
        ({"logit_bias": {49152: 1.0}}, "sampling.logit_bias token id 49152"),
        ({"logit_bias": {i: 1.0 for i in range(301)}}, "sampling.logit_bias has 301 entries; at most 300"),
        ({"prompt_logprobs": -1}, "prompt_logprobs must be >= 0"),
        ({"prompt_logprobs": 21}, "prompt_logprobs must be <= 20"),
    ],
)
def test_bad_values_are_refused_naming_the_field(
    daemon: RunningDaemon, sampling: dict[str, object], message: str
) -> None:
    with daemon.client() as c, pytest.raises(grpc.RpcError) as err:
        c.complete([1, 2, 3], max_tokens=2, **sampling)  # type: ignore[arg-type]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (err.value.details() or "")
    with daemon.client() as c:  # and the daemon serves on
        assert c.complete([1, 2, 3], max_tokens=2, temperature=0.0).completion_tokens == 2


def _request(ids: list[int], rid: str, stream: bool = False, **sampling: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(**sampling),  # type: ignore[arg-type]
        stream=stream,
    )


def _check_input_logprobs(msg: pb.InputLogProbs, ids: list[int], reference: torch.Tensor, k: int) -> None:
    assert list(msg.token_ids) == ids
    assert len(msg.token_logprobs) == len(ids) and not msg.token_logprobs[0].HasField("value")
    for q, entry in enumerate(msg.token_logprobs[1:]):
        assert entry.value == pytest.approx(float(reference[q, ids[q + 1]]), abs=ATOL)
    if not k:
        assert not msg.top_logprobs
        return
    assert len(msg.top_logprobs) == len(ids) and not msg.top_logprobs[0].token_ids
    for q, top in enumerate(msg.top_logprobs[1:]):
        assert list(top.token_ids) == torch.topk(reference[q], k).indices.tolist()


def test_vllm_prompt_logprobs_on_every_complete_and_each_first_chunk(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, ids: list[int], reference: torch.Tensor
) -> None:
    completes = [
        r.complete for r in stub.Generate(_request(ids, "plp", n=2, seed=4, max_tokens=3, prompt_logprobs=3))
    ]
    assert sorted(c.index for c in completes) == [0, 1]
    for c in completes:
        _check_input_logprobs(c.input_logprobs, ids, reference, 3)
    [plain] = stub.Generate(_request(ids, "plain", temperature=0.0, max_tokens=3))
    assert not plain.complete.HasField("input_logprobs")
    streamed = list(stub.Generate(_request(ids, "s", True, temperature=0.0, max_tokens=3, prompt_logprobs=0)))
    chunks = [r.chunk for r in streamed if r.WhichOneof("response") == "chunk"]
    assert len(chunks) == 3
    _check_input_logprobs(chunks[0].input_logprobs, ids, reference, 0)
    assert not any(c.HasField("input_logprobs") for c in chunks[1:])
    _check_input_logprobs(streamed[-1].complete.input_logprobs, ids, reference, 0)


def test_vllm_logit_bias(
    stub: vllm_engine_pb2_grpc.VllmEngineStub, loaded_model: LoadedModel, ids: list[int]
) -> None:
    forced = loaded_model.tokenizer.encode(" Madrid", add_special_tokens=False)[0]
    [r] = stub.Generate(_request(ids, "lb", temperature=0.0, max_tokens=3, logit_bias={forced: 100.0}))
    assert list(r.complete.output_ids) == [forced] * 3
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(_request(ids, "lb-bad", logit_bias={10**6: 1.0})))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "sampling_params.logit_bias token id 1000000" in (err.value.details() or "")
