"""Admission control, request validation, sessions errors and the watchdog."""

from __future__ import annotations

import time

import pytest
from engine_kit import Collector, assert_all_free, greedy, make_core, run

from radixd.daemon.engine.commands import CreateSession
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.errors import InvalidRequest, RequestTooLarge
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow


def test_requests_that_can_never_fit_are_rejected(smollm: LoadedModel) -> None:
    core = make_core(smollm, num_blocks=9, max_model_len=256)  # 8 usable blocks = 128 tokens
    with pytest.raises(RequestTooLarge, match="context limit of 256"):
        core.validator.validate(GenerateRequest("a", [1] * 200, greedy(100)))
    with pytest.raises(RequestTooLarge, match=r"needs up to 13 KV blocks .* pool has 8"):
        core.validator.validate(GenerateRequest("b", [1] * 100, greedy(100)))
    with pytest.raises(RequestTooLarge, match="KV blocks"):
        core.validator.validate(GenerateRequest("c", [1] * 40, SamplingParams(max_tokens=30, n=4)))
    core.validator.validate(GenerateRequest("ok", [1] * 100, greedy(28)))  # exactly 8 blocks
    # Found on the engine thread instead (a session's tokens count): reported through the sink.
    core.execute(CreateSession(tokens=[1] * 60, session_id="s"))
    turn = GenerateRequest("d", [1] * 10, greedy(60), session_id="s")
    core.validator.validate(turn)  # the turn alone fits (what the caller's thread checks) ...
    col = Collector()
    core.requests.add(turn, col)  # ... the session's 60 tokens + the turn's 70 do not
    assert col.final("d").finish_reason == "error" and col.final("d").error_code == "invalid_argument"
    assert "pool has 8" in (col.final("d").error or "")


def test_invalid_requests(smollm: LoadedModel) -> None:
    core = make_core(smollm, num_blocks=64)
    vocab = smollm.config.vocab_size
    bad = [
        (GenerateRequest("", [1], greedy()), "request_id"),
        (GenerateRequest("e", [], greedy()), "prompt is empty"),
        (GenerateRequest("e", [1, -3], greedy()), r"\[0, 49152\)"),
        (GenerateRequest("e", [vocab], greedy()), "integers in"),
        (GenerateRequest("e", [1], SamplingParams(n=3), beam_width=2), "must not exceed beam_width"),
    ]
    for req, msg in bad:
        with pytest.raises(InvalidRequest, match=msg):
            core.validator.validate(req)
    col = Collector()
    core.requests.add(GenerateRequest("s", [1, 2], greedy(), session_id="nope"), col)
    assert col.final("s").error_code == "not_found" and "no open session" in (col.final("s").error or "")
    core.requests.add(GenerateRequest("dup", [1, 2, 3], greedy(4)), col)
    core.requests.add(GenerateRequest("dup", [1, 2, 3], greedy(4)), col)
    assert col.outs[("dup", 0)][0].error_code == "invalid_argument"  # the second one, rejected at once
    core.run_until_idle()
    assert col.final("dup").finish_reason == "length" and len(col.tokens("dup")) == 4
    assert_all_free(core)


def test_requests_wait_for_memory_and_the_watchdog_reports_a_stall(smollm: LoadedModel) -> None:
    core = make_core(smollm, num_blocks=9, watchdog_s=0.05, pin_budget_fraction=0.25)  # 8 usable blocks
    pinned = [7] * 32
    run(core, [GenerateRequest("p", [*pinned, 8], greedy(1))])
    core.kv.pin(pinned, "")  # 2 blocks exempt from eviction
    col = Collector()
    core.requests.add(GenerateRequest("w", [9] * 100, greedy(12)), col)  # fits the pool, not what is left
    assert not core.step()
    time.sleep(0.1)
    core.tick()
    assert core.stats().no_progress_reports == 1 and core.stats().waiting_seqs == 1
    core.kv.unpin(pinned, "")
    core.run_until_idle()
    assert col.final("w").finish_reason == "length"
    assert_all_free(core)


def test_idle_session_leases_yield_to_waiting_requests(smollm: LoadedModel) -> None:
    core = make_core(smollm, num_blocks=9)  # 8 usable blocks
    core.sessions.create("hog")
    run(core, [GenerateRequest("h", [5] * 90, greedy(2), session_id="hog")])
    assert core.sessions.get("hog").resident_tokens == 91  # 6 blocks locked by the session
    col = run(core, [GenerateRequest("w", [6] * 60, greedy(8))])
    assert col.final("w").finish_reason == "length"
    assert core.stats().session_leases_shed == 1
    assert core.sessions.get("hog").resident_tokens == 0  # open, but no longer pinned in memory
    core.sessions.close("hog")
    assert_all_free(core)


def test_abort_before_admission_and_twice(smollm: LoadedModel) -> None:
    core = make_core(smollm, num_blocks=64, max_num_seqs=1)
    col = Collector()
    core.requests.abort("early")  # before it was submitted
    core.requests.add(GenerateRequest("early", [1, 2, 3], greedy(4)), col)
    assert col.final("early").finish_reason == "abort"
    core.requests.add(GenerateRequest("a", [1, 2, 3], greedy(30)), col)
    core.requests.add(GenerateRequest("b", [4, 5, 6], greedy(30)), col)
    core.step()
    core.step()
    assert core.requests.abort("b")  # still waiting (one running sequence at a time)
    assert core.requests.abort("a")  # running
    assert not core.requests.abort("a")  # idempotent
    assert col.final("a").finish_reason == "abort" and col.final("b").finish_reason == "abort"
    assert len(col.outs[("a", 0)]) == 3  # two tokens, then the abort
    assert not core.has_work()
    assert_all_free(core)


def test_stop_strings_eos_and_logprobs(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    core = make_core(smollm, num_blocks=64)
    prompt = tok.encode("The capital of France is")
    free = run(core, [GenerateRequest("free", prompt, greedy(8))])
    full = free.text("free")
    assert "." in full
    params = SamplingParams(max_tokens=8, temperature=0.0, stop=(".",), logprobs=2)
    col = run(core, [GenerateRequest("stop", prompt, params)])
    final = col.final("stop")
    assert final.finish_reason == "stop" and col.text("stop") == full[: full.index(".")]
    lps = [lp for o in col.outs[("stop", 0)] for lp in (o.logprobs or [])]
    assert [lp.token_id for lp in lps] == col.tokens("stop")
    assert all(len(lp.top) == 2 and lp.top[0][1] >= lp.top[1][1] and lp.logprob <= 0 for lp in lps)
    assert all(lp.top[0][0] == lp.token_id for lp in lps)  # greedy picks the top token
    eos = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(free.tokens("free")[1],))
    col = run(core, [GenerateRequest("eos", prompt, eos)])
    assert col.final("eos").finish_reason == "stop" and len(col.tokens("eos")) == 2
    assert_all_free(core)


def test_session_lease_expires_after_its_ttl(smollm: LoadedModel) -> None:
    core = make_core(smollm, num_blocks=64)
    core.sessions.create("brief", ttl_s=0.05)
    run(core, [GenerateRequest("t", [3] * 40, greedy(2), session_id="brief")])
    assert core.sessions.get("brief").resident_tokens == 41
    assert core.kv.tree.num_leases == 1
    time.sleep(0.1)
    core.tick()
    info = core.sessions.get("brief")  # still open, just no longer holding its prefix in memory
    assert info.resident_tokens == 0 and info.num_tokens == 42 and core.kv.tree.num_leases == 0
    core.sessions.close("brief")
    assert_all_free(core)
