"""Speculative decoding (engine/speculative.py) on the real model: greedy output with drafts verified in
one forward pass is plain decoding's, token for token and logprob for logprob (`==`), in float32 and
in the mode `auto` picks here; drafts come from the sequence's own context and from the radix tree,
rejected drafts give their KV slots back, and drafted and plain rows share steps.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine_kit import Collector, assert_all_free, fixed_cost, make_core, run, sampled
from invariance_kit import AUTO_AND_REFERENCE, Answer, Rig, answer, ask, assert_same

from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.server.admin import load_response
from radixd.daemon.server.common.convert import end_message
from radixd.daemon.server.common.metrics import Metrics

pytestmark = pytest.mark.slow
# NOTE: the session's rigs (conftest.py), so the models the invariance tests load are loaded once.
in_modes = pytest.mark.parametrize("rig", AUTO_AND_REFERENCE, indirect=True)

# A "file" an agent rewrites: the prompt quotes it, then starts its rewrite (the model copies it).
FILE = (
    "def area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
    "def describe(width, height):\n    print('area', area(width, height))\n"
)
COPY = f"Here is a file:\n{FILE}\nRewrite it with comments.\n\n{FILE[:25]}"
CHAT = "Tell me a short story about a lighthouse keeper and a storm at sea."


class Pair:
    """One mode's model with two engines: speculation off (the reference) and on."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.off = make_core(rig.lm, num_blocks=128, speculative_tokens=0)
        self.on = fixed_cost(make_core(rig.lm, num_blocks=128, speculative_tokens=6))

    def ids(self, text: str) -> list[int]:
        return self.rig.lm.tokenizer.encode(text)


@pytest.fixture(scope="module")
def pair(rig: Rig) -> Iterator[Pair]:
    yield Pair(rig)


def _answers(core: EngineCore, reqs: list[GenerateRequest]) -> dict[str, Answer]:
    col = run(core, reqs, Collector())
    return {r.request_id: answer(col, r.request_id) for r in reqs}


@in_modes
def test_drafts_from_context_give_plain_decodings_output(pair: Pair) -> None:
    """Alone, then batched with a plain row and a sampled one: same tokens and logprobs as with
    speculation off, most tokens accepted drafts, and every block back once done."""
    copy, chat = pair.ids(COPY), pair.ids(CHAT)
    alone = [GenerateRequest("copy", copy, ask(10))]
    want = _answers(pair.off, alone)
    spec = pair.on.speculator
    before = spec.accepted_tokens
    col = run(pair.on, alone, Collector())
    got = {"copy": answer(col, "copy")}
    assert_same(got, want, f"speculation on vs off, alone ({pair.rig.mode})")
    accepted = spec.accepted_tokens - before
    assert accepted >= 6, f"only {accepted} of 10 tokens were accepted drafts"
    assert col.final("copy").accepted_draft_tokens == accepted
    # Batched: drafted and plain rows in the same steps (the sampled row decodes plainly).
    mixed = [
        GenerateRequest("copy2", copy[:-3], ask(12)),
        GenerateRequest("chat", chat, ask(8)),
    ]
    seeded = GenerateRequest("seeded", chat, sampled(7, max_tokens=6))
    col_off = run(pair.off, [*mixed, seeded], Collector())
    col_on = run(pair.on, [*mixed, seeded], Collector())
    assert_same(
        {r.request_id: answer(col_on, r.request_id) for r in mixed},
        {r.request_id: answer(col_off, r.request_id) for r in mixed},
        f"speculation on vs off, batched ({pair.rig.mode})",
    )
    assert col_on.tokens("seeded") == col_off.tokens("seeded")
    final = col_on.final("copy2")
    assert final.accepted_draft_tokens > 0
    assert end_message(final, 1.0).usage.accepted_draft_tokens == final.accepted_draft_tokens
    # Every surface shows the speculator's counts: GetStats, GetLoad, Prometheus.
    s = pair.on.stats()
    assert s.drafted_tokens == spec.drafted_tokens >= s.accepted_draft_tokens == spec.accepted_tokens > 0
    assert 0.0 < s.draft_s == spec.draft_s
    assert pair.off.stats().drafted_tokens == 0
    load = load_response(s, draining=False)
    metrics = Metrics()
    metrics.add_engine_collector(lambda: s)
    sample = metrics.registry.get_sample_value
    assert load.drafted_tokens == sample("radixd_drafted_tokens_total") == s.drafted_tokens
    assert load.accepted_draft_tokens == sample("radixd_accepted_draft_tokens_total") == spec.accepted_tokens
    assert_all_free(pair.on)


@in_modes
def test_drafts_from_the_tree_stay_in_their_namespace(pair: Pair) -> None:
    """A prompt asked again drafts its earlier answer from the radix tree (in its own namespace, not in
    another tenant's), and still answers exactly what plain decoding answers."""
    chat = pair.ids(CHAT)
    want = _answers(pair.off, [GenerateRequest("chat", chat, ask(10))])
    spec = pair.on.speculator
    first = _answers(pair.on, [GenerateRequest("chat", chat, ask(10), namespace="a")])
    from_tree = spec.drafter.from_tree
    other = _answers(pair.on, [GenerateRequest("chat", chat, ask(10), namespace="b")])
    assert spec.drafter.from_tree == from_tree, "a draft crossed a tenant namespace"
    before = spec.accepted_tokens
    again = _answers(pair.on, [GenerateRequest("chat", chat, ask(10), namespace="a")])
    assert spec.drafter.from_tree > from_tree
    assert spec.accepted_tokens - before >= 7, "the cached answer was not drafted"
    for got in (first, other, again):
        assert_same(got, want, f"speculation on vs off, drafted from the tree ({pair.rig.mode})")
    assert_all_free(pair.on)


def _ending(col: Collector, rid: str, index: int = 0) -> tuple[list[int], str, str | int | None]:
    final = col.final(rid, index)
    return col.tokens(rid, index), str(final.finish_reason), final.matched_stop


@pytest.mark.parametrize("rig", ["float32"], indirect=True)
def test_stops_lengths_forks_and_aborts_with_drafts(pair: Pair) -> None:
    """A stop string or token id, or max_tokens, that falls inside an accepted draft ends the output
    where plain decoding ends it; n = 2 children each draft; an abort after verified drafts leaves
    every block free; outputs equal speculation off."""
    copy = pair.ids(COPY)
    plain = run(pair.off, [GenerateRequest("p", copy, ask(12))], Collector()).tokens("p")
    stop_text = pair.rig.lm.tokenizer.decode(plain[6:8])
    reqs = [
        GenerateRequest("stop", copy, SamplingParams(max_tokens=12, temperature=0.0, stop=(stop_text,))),
        GenerateRequest(
            "stop-id", copy, SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(plain[4],))
        ),
        GenerateRequest("len", copy, SamplingParams(max_tokens=3, temperature=0.0)),
        GenerateRequest("n2", copy, SamplingParams(max_tokens=8, temperature=0.0, n=2)),
    ]
    col_off = run(pair.off, reqs, Collector())
    accepted = pair.on.speculator.accepted_tokens
    col_on = run(pair.on, reqs, Collector())
    assert pair.on.speculator.accepted_tokens > accepted
    for rid, index in (("stop", 0), ("stop-id", 0), ("len", 0), ("n2", 0), ("n2", 1)):
        assert _ending(col_on, rid, index) == _ending(col_off, rid, index), rid
    assert col_on.final("stop").finish_reason == "stop" and col_on.final("len").finish_reason == "length"
    assert_all_free(pair.on)
    # An abort between steps, after drafts were verified.
    col = Collector()
    pair.on.requests.add(GenerateRequest("abort", copy, ask(40)), col)
    drafted = pair.on.speculator.drafted_tokens
    while pair.on.speculator.drafted_tokens == drafted and pair.on.has_work():
        pair.on.step()
    assert pair.on.speculator.drafted_tokens > drafted
    assert pair.on.requests.abort("abort")
    pair.on.run_until_idle()
    assert col.final("abort").finish_reason == "abort"
    assert_all_free(pair.on)
