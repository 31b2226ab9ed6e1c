"""GenerationService: stateless generation, abort, tokenize / detokenize, model info."""

from __future__ import annotations

import time
from typing import Any

from radixd_client._pb import generation_pb2, generation_pb2_grpc

from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.limits import check_token_ids
from radixd.daemon.server.common.bounds import check_count
from radixd.daemon.server.common.convert import prompt_tokens, sampling_params
from radixd.daemon.server.common.handler import rpc
from radixd.daemon.server.common.pipeline import RequestRegistry, abort, admit
from radixd.daemon.server.common.state import ServerState
from radixd.daemon.server.streaming import run_stream

FEATURES = (
    "sessions",
    "fork",
    "logprobs",
    "chat_template",
    "tenants",
    "cache_events",
    "n",
    "structured_outputs",
)


class GenerationServicer(generation_pb2_grpc.GenerationServiceServicer):
    def __init__(self, state: ServerState, registry: RequestRegistry) -> None:
        self.state = state
        self.registry = registry

    @rpc("Generate")
    async def Generate(self, request: generation_pb2.GenerateRequest, context: Any) -> None:
        arrival = time.monotonic()
        state = self.state
        namespace = admit(state, context, request.request_id)
        sampling = sampling_params(request.sampling, state.limits)
        ids = await prompt_tokens(state, request.prompt)
        req = GenerateRequest(
            "", ids, sampling, namespace=namespace, priority=request.priority, arrival_time=arrival
        )
        await run_stream(
            state, self.registry, context, req, request.request_id, generation_pb2.GenerateResponse
        )

    @rpc("Abort")
    async def Abort(self, request: generation_pb2.AbortRequest, context: Any) -> generation_pb2.AbortResponse:
        abort(self.state, self.registry, self.state.namespace(context), request.request_id)
        return generation_pb2.AbortResponse()

    @rpc("Tokenize")
    async def Tokenize(
        self, request: generation_pb2.TokenizeRequest, context: Any
    ) -> generation_pb2.TokenizeResponse:
        self.state.namespace(context)
        return generation_pb2.TokenizeResponse(token_ids=await prompt_tokens(self.state, request.prompt))

    @rpc("Detokenize")
    async def Detokenize(
        self, request: generation_pb2.DetokenizeRequest, context: Any
    ) -> generation_pb2.DetokenizeResponse:
        self.state.namespace(context)
        tok = self.state.tokenizer
        # An output never outgrows the context, so neither does a list worth detokenizing.
        check_count("token_ids", request.token_ids, self.state.limits.context_length)
        ids = check_token_ids(request.token_ids, tok.vocab_size, what="detokenize")
        return generation_pb2.DetokenizeResponse(
            text=tok.decode(ids, skip_special_tokens=request.skip_special_tokens)
        )

    @rpc("GetModelInfo")
    async def GetModelInfo(
        self, request: generation_pb2.GetModelInfoRequest, context: Any
    ) -> generation_pb2.GetModelInfoResponse:
        self.state.namespace(context)
        s = self.state
        return generation_pb2.GetModelInfoResponse(
            model_name=s.model_name,
            vocab_size=s.tokenizer.vocab_size,
            eos_token_ids=list(s.eos_token_ids),
            context_length=s.limits.context_length,
            block_size=s.block_size,
            features=list(FEATURES),
        )
