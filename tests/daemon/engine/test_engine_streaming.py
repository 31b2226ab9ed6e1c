"""Streaming granularity: `stream_interval` groups a sequence's tokens into fewer outputs and loses none."""

from __future__ import annotations

import argparse

import pytest
from engine_kit import Collector, assert_all_free, greedy, make_core, run

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.server import main as server_main
from radixd.daemon.server.app import engine_config

pytestmark = pytest.mark.slow
PROMPT = "The three primary colors are"


def test_chunks_of_the_interval_carry_the_same_tokens_text_and_logprobs(smollm: LoadedModel) -> None:
    prompt = smollm.tokenizer.encode(PROMPT)
    params = greedy(10, logprobs=1)
    each = run(make_core(smollm, num_blocks=64), [GenerateRequest("r", prompt, params)])
    core = make_core(smollm, num_blocks=64, stream_interval=4)
    grouped = run(core, [GenerateRequest("r", prompt, params)])
    outs = grouped.outs[("r", 0)]
    # The first token at once (the interval never delays the first token), then groups of 4; the last
    # output carries the rest.
    assert [len(o.new_token_ids) for o in outs] == [1, 4, 4, 1]
    assert [o.finished for o in outs] == [False, False, False, True]
    assert len(each.outs[("r", 0)]) == 10
    assert grouped.tokens("r") == each.tokens("r") and grouped.text("r") == each.text("r")
    lps = [lp.token_id for o in outs for lp in (o.logprobs or [])]
    assert lps == grouped.tokens("r")
    assert [o.completion_tokens for o in outs] == [1, 5, 9, 10]
    assert_all_free(core)


def test_a_stop_or_an_abort_flushes_what_the_interval_held(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    prompt = tok.encode("The capital of France is")
    full = run(make_core(smollm, num_blocks=64), [GenerateRequest("free", prompt, greedy(8))]).text("free")
    assert "." in full
    core = make_core(smollm, num_blocks=64, stream_interval=16)
    stop = SamplingParams(max_tokens=8, temperature=0.0, stop=(".",))
    col = run(core, [GenerateRequest("stop", prompt, stop)])
    first, last = col.outs[("stop", 0)]  # the first token, then the stop before the interval filled
    assert len(first.new_token_ids) == 1 and not first.finished
    assert last.finished and last.finish_reason == "stop" and col.text("stop") == full[: full.index(".")]

    col = Collector()
    core.requests.add(GenerateRequest("a", prompt, greedy(30)), col)
    for _ in range(4):  # one prefill step (its token streams at once), then three decodes held back
        core.step()
    (streamed,) = col.outs[("a", 0)]
    assert len(streamed.new_token_ids) == 1
    assert core.requests.abort("a")
    final = col.final("a")
    # Three steps held at least 3 tokens back (more where a step accepted a draft), all flushed now.
    held = final.completion_tokens - 1
    assert final.finish_reason == "abort" and len(final.new_token_ids) == held >= 3
    assert col.text("a") == tok.decode(col.tokens("a"))
    assert_all_free(core)


def test_the_interval_is_a_serve_flag_and_must_be_positive() -> None:
    parser = argparse.ArgumentParser()
    server_main.add_arguments(parser)
    assert engine_config(parser.parse_args([])).stream_interval == EngineConfig().stream_interval == 1
    assert engine_config(parser.parse_args(["--stream-interval", "8"])).stream_interval == 8
    with pytest.raises(ValueError, match="stream_interval must be >= 1"):
        engine_config(parser.parse_args(["--stream-interval", "0"]))


def test_every_field_of_a_streamed_output(smollm: LoadedModel) -> None:
    # The engine builds outputs positionally (once per token): each field must land where it belongs.
    prompt = smollm.tokenizer.encode(PROMPT)
    core = make_core(smollm, num_blocks=64)
    got = run(core, [GenerateRequest("r", prompt, greedy(3, logprobs=2))])
    outs = got.outs[("r", 0)]
    assert [o.request_id for o in outs] == ["r"] * 3 and [o.index for o in outs] == [0, 0, 0]
    assert [t for o in outs for t in o.new_token_ids] == got.tokens("r")
    assert "".join(o.text_delta for o in outs) == got.text("r") and isinstance(outs[0].text_delta, str)
    for k, o in enumerate(outs):
        assert o.logprobs is not None and [lp.token_id for lp in o.logprobs] == o.new_token_ids
        assert len(o.logprobs[0].top) == 2 and o.logprobs[0].logprob <= 0.0
        assert (o.prompt_tokens, o.cached_tokens, o.completion_tokens) == (len(prompt), 0, k + 1)
        assert o.finished == (k == 2) and o.finish_reason == ("length" if k == 2 else None)
        assert o.error is None and o.error_code is None and o.session_id is None
        assert o.queue_time_s is not None and 0.0 <= o.queue_time_s < 60.0
        assert o.ttft_s is not None and o.queue_time_s <= o.ttft_s < 60.0
    assert_all_free(core)
