"""One vLLM `Generate` call: one engine request run through the pipeline, written as chunks or completes.

Streaming: a chunk per step and output index, then one id-less complete per index; otherwise one
complete per index with every id. Prompt logprobs ride on each index's first chunk and every complete,
as in vLLM's servicer. No text is computed: the gateway detokenizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from radixd.daemon.engine.types import GenerateRequest, RequestOutput, TokenLogprob
from radixd.daemon.server.common.pipeline import RequestRegistry, failure, open_request
from radixd.daemon.server.common.state import ServerState


@dataclass
class _Output:
    """What one output index produced so far."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[pb.TopLogProbs] = field(default_factory=list)


def _logprobs(out: RequestOutput) -> pb.OutputLogProbs | None:
    if out.logprobs is None:
        return None
    return pb.OutputLogProbs(
        token_logprobs=[lp.logprob for lp in out.logprobs],
        token_ids=[lp.token_id for lp in out.logprobs],
        top_logprobs=[
            pb.TopLogProbs(values=[v for _, v in lp.top], token_ids=[t for t, _ in lp.top])
            for lp in out.logprobs
        ],
    )


def _input_logprobs(
    prompt: list[int], prompt_logprobs: list[TokenLogprob | None], top: bool
) -> pb.InputLogProbs:
    """vLLM's `InputLogProbs`: one entry per prompt token (the first valueless), top alternatives if asked."""
    msg = pb.InputLogProbs(token_ids=prompt)
    for lp in prompt_logprobs:
        if lp is None:
            msg.token_logprobs.add()
        else:
            msg.token_logprobs.add(value=lp.logprob)
        if top:
            msg.top_logprobs.add(
                values=[] if lp is None else [v for _, v in lp.top],
                token_ids=[] if lp is None else [t for t, _ in lp.top],
            )
    return msg


def _matched_stop(out: RequestOutput) -> dict[str, Any]:
    """vLLM's `matched_stop`: the stop token id or stop string the engine reports (EOS matches none)."""
    stop = out.matched_stop
    if isinstance(stop, int):
        return {"matched_token_id": stop}
    return {} if stop is None else {"matched_stop_str": stop}


def _complete(out: RequestOutput, acc: _Output, stream: bool, logprobs: bool) -> pb.GenerateComplete:
    complete = pb.GenerateComplete(
        output_ids=[] if stream else acc.ids,
        finish_reason=out.finish_reason or "abort",
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        index=out.index,
        **_matched_stop(out),
    )
    if logprobs and not stream:
        complete.output_logprobs.CopyFrom(
            pb.OutputLogProbs(token_logprobs=acc.logprobs, token_ids=acc.ids, top_logprobs=acc.top)
        )
    return complete


async def run_generate(
    state: ServerState,
    registry: RequestRegistry,
    context: Any,
    req: GenerateRequest,
    client_id: str,
    stream: bool,
) -> None:
    """Run `req` and write its responses to `context`; raises RpcFailure for engine errors."""
    acc = {i: _Output() for i in range(req.sampling.n)}
    logprobs = req.sampling.logprobs is not None
    top = bool(req.sampling.prompt_logprobs)
    prompt_lps: pb.InputLogProbs | None = None
    first_chunk = set(acc)  # the indexes whose first chunk is still to come
    async with open_request(state, registry, req, client_id) as outputs:
        async for out in outputs:
            if out.finish_reason == "error":
                # Before or after output: the call fails with the engine's status, so the gateway
                # reports an error instead of a truncated answer.
                raise failure(out)
            if out.prompt_logprobs is not None:
                prompt_lps = _input_logprobs(req.prompt_token_ids, out.prompt_logprobs, top)
            mine = acc[out.index]
            if out.new_token_ids:
                mine.ids.extend(out.new_token_ids)
                lps = _logprobs(out)
                if lps is not None:
                    mine.logprobs.extend(lps.token_logprobs)
                    mine.top.extend(lps.top_logprobs)
                if stream:
                    chunk = pb.GenerateStreamChunk(
                        token_ids=out.new_token_ids,
                        prompt_tokens=out.prompt_tokens,
                        completion_tokens=out.completion_tokens,
                        cached_tokens=out.cached_tokens,
                        index=out.index,
                    )
                    if lps is not None:
                        chunk.output_logprobs.CopyFrom(lps)
                    if prompt_lps is not None and out.index in first_chunk:
                        chunk.input_logprobs.CopyFrom(prompt_lps)
                    first_chunk.discard(out.index)
                    await context.write(pb.GenerateResponse(chunk=chunk))
            if out.finished:
                complete = _complete(out, mine, stream, logprobs)
                if prompt_lps is not None:
                    complete.input_logprobs.CopyFrom(prompt_lps)
                await context.write(pb.GenerateResponse(complete=complete))
