"""One vLLM `Generate` call: submit to the engine, relay chunks or completes, always clean up.

Streaming: one `GenerateStreamChunk` per engine step with the new token ids of one output index, then
one `GenerateComplete` per index with its finish reason (and no ids: they were all streamed).
Not streaming: one `GenerateComplete` per index with every output id. `n > 1` gives one complete per
index. Token counts and `cached_tokens` ride on every message.

NOTE: KV release, as in `streaming.run_stream`: whatever ends the handler early (the gateway's cancel
after a client disconnect, a deadline, a write error) leaves through `finally`, which aborts the
request in the engine unless every output already finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from radixd.daemon.engine.types import RequestOutput
from radixd.daemon.log import get_logger
from radixd.daemon.sampling import SamplingParams
from radixd.daemon.server.errors import RpcFailure, status_for_code_name
from radixd.daemon.server.state import ServerState
from radixd.daemon.server.streaming import RequestRegistry, submit

log = get_logger("radixd.server.vllm")


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


def _matched_stop(state: ServerState, sampling: SamplingParams, ids: list[int]) -> dict[str, Any]:
    """Which stop condition ended an output (vLLM's `matched_stop`): a stop token id, or the stop string
    its text ends at; EOS matches nothing, as in vLLM."""
    if not ids:
        return {}
    if ids[-1] in sampling.stop_token_ids:
        return {"matched_token_id": ids[-1]}
    if sampling.stop:
        text = state.tokenizer.decode(ids)
        found = [(text.find(s), s) for s in sampling.stop if s in text]
        if found:
            return {"matched_stop_str": min(found)[1]}
    return {}


def _complete(
    state: ServerState, sampling: SamplingParams, out: RequestOutput, acc: _Output, stream: bool
) -> pb.GenerateComplete:
    complete = pb.GenerateComplete(
        output_ids=[] if stream else acc.ids,
        finish_reason=out.finish_reason or "abort",
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        index=out.index,
        **(_matched_stop(state, sampling, acc.ids) if out.finish_reason == "stop" else {}),
    )
    if sampling.logprobs is not None and not stream:
        complete.output_logprobs.CopyFrom(
            pb.OutputLogProbs(token_logprobs=acc.logprobs, token_ids=acc.ids, top_logprobs=acc.top)
        )
    return complete


async def run_generate(
    state: ServerState,
    registry: RequestRegistry,
    context: Any,
    *,
    namespace: str,
    client_id: str,
    prompt_ids: list[int],
    sampling: SamplingParams,
    stream: bool,
    arrival: float,
) -> None:
    """Run one request and write its responses to `context`; raises RpcFailure for engine errors."""
    engine = state.engine
    metrics = state.metrics
    client_id, engine_id, bridge = submit(
        state,
        registry,
        namespace=namespace,
        client_id=client_id,
        prompt_ids=prompt_ids,
        sampling=sampling,
        arrival=arrival,
    )
    pending = set(range(sampling.n))
    acc = {i: _Output() for i in pending}
    started = False
    try:
        while pending:
            out = await bridge.get()
            if out.finish_reason == "error":
                # Before or after output: the call fails with the engine's status, so the gateway
                # reports an error instead of a truncated answer.
                raise RpcFailure(status_for_code_name(out.error_code), out.error or "the request failed")
            if not started:
                started = True
                metrics.prompt_tokens.inc(out.prompt_tokens)
                metrics.cached_tokens.inc(out.cached_tokens)
            mine = acc[out.index]
            if out.new_token_ids:
                metrics.generated_tokens.inc(len(out.new_token_ids))
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
                    await context.write(pb.GenerateResponse(chunk=chunk))
            if out.finished:
                pending.discard(out.index)
                if out.ttft_s is not None:
                    metrics.ttft.observe(out.ttft_s)
                if out.queue_time_s is not None:
                    metrics.queue_time.observe(out.queue_time_s)
                complete = _complete(state, sampling, out, mine, stream)
                await context.write(pb.GenerateResponse(complete=complete))
    finally:
        registry.unregister(namespace, client_id)
        log.info("vllm.generate.end", completed=sampling.n - len(pending), stream=stream)
        if pending:
            engine.abort(engine_id)
            log.info("vllm.generate.aborted", engine_request_id=engine_id, pending=sorted(pending))
