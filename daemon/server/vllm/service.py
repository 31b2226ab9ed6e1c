"""`vllm.grpc.engine.VllmEngine` over the engine, for gateways (smg) that front vLLM workers.

Calls but `HealthCheck` authenticate like `radixd.v1` (same tenants and namespaces); KV events are the
caller's namespace only. NOTE: `FlushCache` empties a shared cache, so it needs the admin token.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import TYPE_CHECKING, Any

import grpc
from radixd_client._pb import common_pb2 as radixd_common
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from radixd.daemon.engine.types import FlushMode, GenerateRequest
from radixd.daemon.executor.limits import check_token_ids
from radixd.daemon.server.common.bounds import MAX_FLUSH_TIMEOUT_S, check_id, check_seconds
from radixd.daemon.server.common.convert import prompt_tokens
from radixd.daemon.server.common.errors import RpcFailure, bad_request
from radixd.daemon.server.common.handler import rpc
from radixd.daemon.server.common.pipeline import RequestRegistry, abort, admit
from radixd.daemon.server.vllm.generate import run_generate
from radixd.daemon.server.vllm.kv_stream import kv_event_stream
from radixd.daemon.server.vllm.loads import LoadSampler
from radixd.daemon.server.vllm.sampling import sampling_from_vllm, truncate_prompt

if TYPE_CHECKING:
    from radixd.daemon.model.config import ModelConfig
    from radixd.daemon.server.common.state import ServerState
    from radixd.daemon.server.vllm.tokenizer_bundle import TokenizerBundle

SERVICE_NAME = vllm_engine_pb2.DESCRIPTOR.services_by_name["VllmEngine"].full_name
SERVER_TYPE = "vllm-grpc"
# Multimodal, disaggregation and pinning fields a text-only single-rank engine cannot honour.
_UNSUPPORTED_INPUTS = (
    ("mm_inputs", "multimodal inputs"),
    ("media_refs", "media references"),
    ("kv_transfer_params", "prefill/decode KV transfer"),
    ("kv_transfer_params_json", "prefill/decode KV transfer"),
)


class VllmEngineServicer(vllm_engine_pb2_grpc.VllmEngineServicer):  # type: ignore[misc]
    """The worker protocol smg speaks, answered from radixd's engine, tokenizer and radix tree."""

    def __init__(
        self,
        state: ServerState,
        registry: RequestRegistry,
        *,
        config: ModelConfig,
        model_path: str,
        served_model_name: str,
        bundle: TokenizerBundle,
        tokenizer_path: str,
        max_num_seqs: int,
        model_dtype: str,
    ) -> None:
        self.state = state
        self.registry = registry
        self.config = config
        self.model_path = model_path
        self.served_model_name = served_model_name
        self.bundle = bundle
        self.tokenizer_path = tokenizer_path
        self.max_num_seqs = max_num_seqs
        self.model_dtype = model_dtype
        self.loads = LoadSampler(state.engine)
        self.last_receive = 0.0

    @rpc("vllm.HealthCheck")
    async def HealthCheck(self, request: pb.HealthCheckRequest, context: Any) -> pb.HealthCheckResponse:
        state = self.state
        if state.draining:
            return pb.HealthCheckResponse(healthy=False, message="draining: accepts no new work")
        if not state.engine.running:
            return pb.HealthCheckResponse(healthy=False, message="the engine is not running")
        return pb.HealthCheckResponse(healthy=True, message="ok")

    @rpc("vllm.GetModelInfo")
    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: Any) -> pb.GetModelInfoResponse:
        self.state.namespace(context)
        limits = self.state.limits
        tok = self.state.tokenizer
        bos = getattr(tok, "bos_token_id", None)
        return pb.GetModelInfoResponse(
            model_path=self.model_path,
            is_generation=True,
            max_context_length=limits.context_length,
            vocab_size=limits.vocab_size,
            supports_vision=False,
            served_model_name=self.served_model_name,
            tokenizer_path=self.tokenizer_path,
            model_type="llama",
            architectures=["LlamaForCausalLM"],
            eos_token_ids=list(self.state.eos_token_ids),
            pad_token_id=-1,
            bos_token_id=bos if bos is not None else -1,
            max_req_input_len=max(1, limits.context_length - 1),
        )

    @rpc("vllm.GetServerInfo")
    async def GetServerInfo(self, request: pb.GetServerInfoRequest, context: Any) -> pb.GetServerInfoResponse:
        state = self.state
        state.namespace(context)
        return pb.GetServerInfoResponse(
            active_requests=state.active_streams,
            is_paused=state.draining,
            last_receive_timestamp=self.last_receive,
            uptime_seconds=time.time() - state.started_at,
            server_type=SERVER_TYPE,
            data_parallel_size=1,
            kv_cache_dtype="auto",
            block_size=state.block_size,
            model_dtype=self.model_dtype,
            max_num_seqs=self.max_num_seqs,
        )

    @rpc("vllm.GetLoads")
    async def GetLoads(self, request: pb.GetLoadsRequest, context: Any) -> pb.GetLoadsResponse:
        self.state.namespace(context)
        if request.HasField("dp_rank") and request.dp_rank != 0:
            raise bad_request(f"dp_rank {request.dp_rank} does not exist: radixd runs one rank, 0")
        sample = await self.loads.read()
        if sample is None:
            raise RpcFailure(grpc.StatusCode.UNAVAILABLE, "the engine is not running; retry elsewhere")
        return pb.GetLoadsResponse(
            timestamp=datetime.datetime.now(datetime.UTC).isoformat(),
            version="radixd",
            dp_rank_count=1,
            loads=[self.loads.scheduler_load(sample)],
        )

    @rpc("vllm.GetTokenizer")
    async def GetTokenizer(self, request: common_pb2.GetTokenizerRequest, context: Any) -> None:
        self.state.namespace(context)
        pieces = list(self.bundle.chunks())
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            await context.write(
                common_pb2.GetTokenizerChunk(data=piece, sha256=self.bundle.sha256 if last else "")
            )

    @rpc("vllm.SubscribeKvEvents")
    async def SubscribeKvEvents(self, request: common_pb2.SubscribeKvEventsRequest, context: Any) -> None:
        namespace = self.state.namespace(context)
        async for batch in kv_event_stream(self.state.events, namespace, self.loads, request):
            await context.write(batch)

    @rpc("vllm.FlushCache")
    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: Any
    ) -> common_pb2.FlushCacheResponse:
        state = self.state
        state.check_admin(context)
        timeout = check_seconds("timeout_s", request.timeout_s, MAX_FLUSH_TIMEOUT_S, "flush now")
        mode: FlushMode = "wait_for_idle" if timeout > 0 else "refuse_if_busy"
        freed = await asyncio.wrap_future(state.engine.flush(mode, timeout))
        return common_pb2.FlushCacheResponse(success=True, message=f"flushed {freed} blocks")

    @rpc("vllm.Abort")
    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:
        namespace = self.state.namespace(context)
        for request_id in request.request_ids:
            abort(self.state, self.registry, namespace, check_id("request_ids[]", request_id))
        return pb.AbortResponse()

    @rpc("vllm.Embed")
    async def Embed(self, request: pb.EmbedRequest, context: Any) -> pb.EmbedResponse:
        raise RpcFailure(
            grpc.StatusCode.UNIMPLEMENTED, "radixd serves a generative model; Embed is not served"
        )

    @rpc("vllm.Generate")
    async def Generate(self, request: pb.GenerateRequest, context: Any) -> None:
        arrival = time.monotonic()
        self.last_receive = time.time()
        state = self.state
        namespace = admit(state, context, request.request_id)
        for name, what in _UNSUPPORTED_INPUTS:
            if request.HasField(name):
                raise bad_request(f"{name} is not supported: radixd serves a text-only model without {what}")
        if request.extra_mm_inputs:
            raise bad_request("extra_mm_inputs is not supported: radixd serves a text-only model")
        if request.HasField("data_parallel_rank") and request.data_parallel_rank != 0:
            raise bad_request(
                f"data_parallel_rank {request.data_parallel_rank} does not exist; radixd runs rank 0"
            )
        sampling = sampling_from_vllm(request.sampling_params, state.limits)
        ids = truncate_prompt(await self._prompt(request), request.sampling_params, state.limits)
        # The gateway detokenizes: the engine computes no text for this request.
        req = GenerateRequest("", ids, sampling, namespace=namespace, arrival_time=arrival, detokenize=False)
        await run_generate(state, self.registry, context, req, request.request_id, request.stream)

    async def _prompt(self, request: pb.GenerateRequest) -> list[int]:
        kind = request.WhichOneof("input")
        limits = self.state.limits
        if kind == "tokenized":
            ids = request.tokenized.input_ids
            if not ids:
                raise bad_request("tokenized.input_ids is empty; send at least one token id")
            if len(ids) > limits.context_length:
                raise bad_request(
                    f"tokenized.input_ids has {len(ids)} ids; the context length is {limits.context_length}"
                )
            return check_token_ids(ids, limits.vocab_size, what="tokenized.input_ids")
        if kind == "text":
            return await prompt_tokens(self.state, radixd_common.Prompt(text=request.text), "text")
        raise bad_request("the request has no input: set tokenized.input_ids (or text)")
