"""What ended an output (`RequestOutput.matched_stop`), and requests that want no text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from engine_kit import assert_all_free, greedy, make_core, run

from radixd.daemon.engine import textstream
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.text.detokenizer import Detokenizer

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"


def test_the_engine_reports_the_stop_that_ended_an_output(smollm: LoadedModel) -> None:
    prompt = smollm.tokenizer.encode(PROMPT)
    core = make_core(smollm, num_blocks=64)
    free = run(core, [GenerateRequest("free", prompt, greedy(8))])
    ids, text = free.tokens("free"), free.text("free")
    assert "." in text and len(ids) == 8
    stop_id = ids[1]
    col = run(
        core,
        [
            GenerateRequest("id", prompt, greedy(8, stop_token_ids=(stop_id,))),
            GenerateRequest("str", prompt, SamplingParams(max_tokens=8, temperature=0.0, stop=(".",))),
            GenerateRequest("len", prompt, greedy(3)),
        ],
    )
    by_id = col.final("id")
    assert by_id.finish_reason == "stop" and by_id.matched_stop == stop_id
    assert col.tokens("id") == ids[: ids.index(stop_id) + 1]
    by_str = col.final("str")
    assert by_str.finish_reason == "stop" and by_str.matched_stop == "."
    assert col.text("str") == text[: text.index(".")]
    assert col.final("len").finish_reason == "length" and col.final("len").matched_stop is None
    # Only the last output of an index says what ended it.
    assert all(o.matched_stop is None for outs in col.outs.values() for o in outs[:-1])
    assert_all_free(core)


class _Counting:
    """The real detokenizer, counting the tokens it is given."""

    def __init__(self, inner: Detokenizer, added: list[int]) -> None:
        self.inner = inner
        self.added = added

    def add(self, token_ids: int | Sequence[int]) -> str:
        self.added.extend([token_ids] if isinstance(token_ids, int) else token_ids)
        return self.inner.add(token_ids)

    def flush(self) -> str:
        return self.inner.flush()


def test_a_request_that_wants_no_text_is_not_detokenized(
    smollm: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    added: list[int] = []
    real = textstream.new_detokenizer

    def counting(*args: Any, **kwargs: Any) -> Detokenizer:
        return _Counting(real(*args, **kwargs), added)

    monkeypatch.setattr(textstream, "new_detokenizer", counting)
    prompt = smollm.tokenizer.encode(PROMPT)
    core = make_core(smollm, num_blocks=64)
    n3 = greedy(8, n=3)
    text = run(core, [GenerateRequest("text", prompt, n3)])
    assert len(added) == 3 * 8 and text.text("text", 2)
    added.clear()
    ids = run(core, [GenerateRequest("ids", prompt, n3, detokenize=False)])
    assert added == []
    for i in range(3):
        assert ids.tokens("ids", i) == text.tokens("text", i) and ids.text("ids", i) == ""
    # Stop strings are matched on text: such a request is still detokenized, and still stops.
    stop = SamplingParams(max_tokens=8, temperature=0.0, stop=(".",))
    col = run(core, [GenerateRequest("stop", prompt, stop, detokenize=False)])
    assert added and col.final("stop").matched_stop == "."
    assert_all_free(core)
