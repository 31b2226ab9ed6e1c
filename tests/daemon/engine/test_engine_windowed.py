"""The engine in the windowed KV layout (a random-weight Gemma 3: sliding and full layers) against the
same model in the full layout: every greedy token equal (a resumed, windowed prefix gives the tokens a
recomputed one gives), through multi-turn conversations resumed from kept windows, forks, drafts,
preemption by swap and by recompute; and it holds less KV for the same conversations."""

from __future__ import annotations

import pytest
from engine_kit import Collector, assert_all_free, fixed_cost, greedy, make_core, run
from tiny_models import write_tiny_gemma3

from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel, load_model

S, F = "sliding_attention", "full_attention"
WINDOW = 8  # tokens; blocks of 16 (the engine's default): the window spans one or two blocks
SYSTEM = [5 + (i * 7) % 50 for i in range(40)]  # a shared "system prompt"


@pytest.fixture(scope="module", params=["float32", None], ids=["float32", "auto"])
def gemma(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """The model in the float32 reference and in the mode `auto` picks (what users run)."""
    path = write_tiny_gemma3(tmp_path_factory.mktemp("gemma3"), [S, S, F, S, S, S, F], WINDOW)
    return load_model(str(path), "cpu", request.param)


def _conversations(core: EngineCore, turns: int, convs: int, **kw: object) -> list[list[int]]:
    """`convs` conversations of `turns` turns each, interleaved; -> every turn's generated tokens."""
    histories = [[*SYSTEM, 10 + c, 11 + c, 12 + c] for c in range(convs)]
    outs: list[list[int]] = []
    for t in range(turns):
        reqs = [
            GenerateRequest(f"c{c}t{t}", list(h), greedy(max_tokens=6), **kw)  # type: ignore[arg-type]
            for c, h in enumerate(histories)
        ]
        col = run(core, reqs)
        for c, h in enumerate(histories):
            got = col.tokens(f"c{c}t{t}")
            outs.append(got)
            h += [*got, 20 + t, 21 + c, 22]  # the next user turn
    return outs


def _cached(core: EngineCore) -> int:
    return core.scheduler.counters.hit_tokens


def test_conversations_resume_from_kept_windows_with_the_full_layouts_tokens(gemma: LoadedModel) -> None:
    full = make_core(gemma, 256, kv_layout="full")
    win = make_core(gemma, 256 * 7 // 2, kv_layout="windowed")  # the same bytes: an id holds 2 of 7 layers
    assert full.kv.sliding is None and win.kv.sliding is not None
    assert _conversations(win, 3, 3) == _conversations(full, 3, 3)
    # Turns 2+ resume from the window kept at the end of the previous turn; the conversations that
    # waited for the first to compute the shared system prompt, from the window it kept for them.
    assert _cached(win) == _cached(full) > 0
    sliding = win.kv.sliding
    assert sliding is not None and sliding.cut_tokens == 0
    kinds = sorted(w.kind for _key, w in sliding.store)
    assert kinds.count("leaf") == 3 and "branch" in kinds  # each conversation's end; the shared prompt's
    # The same conversations cached in fewer bytes: 2 of 7 layers for every token, the rest at windows.
    lanes = win.runner.layout.lanes
    held_win = (win.kv.tree.num_cached_blocks + len(sliding.store.pages())) * lanes
    held_full = full.kv.tree.num_cached_blocks * full.runner.layout.lanes
    assert held_win < held_full
    assert_all_free(win)
    assert_all_free(full)


def test_windows_at_shared_prefixes_only_recompute_each_conversation_and_hold_less(
    gemma: LoadedModel,
) -> None:
    """`kv_windows="shared"`: the cache keeps a window where conversations share a prefix (the system
    prompt) but not where each one's turn ended, so turns 2+ recompute their own history (the same
    tokens) from the shared prompt's window, in fewer bytes than "turns" keeps."""
    blocks = 256 * 7 // 2
    turns = make_core(gemma, blocks, kv_layout="windowed")
    shared = make_core(gemma, blocks, kv_layout="windowed", kv_windows="shared")
    assert _conversations(shared, 3, 3) == _conversations(turns, 3, 3)
    kept = shared.kv.sliding
    assert kept is not None and turns.kv.sliding is not None
    kinds = [w.kind for _key, w in kept.store]
    assert kinds and set(kinds) == {"branch"}  # the system prompt's window; no conversation's end
    assert all(w.num_tokens <= len(SYSTEM) + 3 for _key, w in kept.store)
    assert kept.cut_tokens > 0 and _cached(shared) < _cached(turns)
    assert len(kept.store.pages()) < len(turns.kv.sliding.store.pages())
    assert (shared.stats().kv_windows, turns.stats().kv_windows) == ("shared", "turns")
    assert_all_free(shared)
    assert_all_free(turns)
    with pytest.raises(ValueError, match="kv_windows"):
        make_core(gemma, blocks, kv_layout="windowed", kv_windows="leaves")


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_forks_and_drafts_give_the_full_layouts_tokens(gemma: LoadedModel, mode: str) -> None:
    """A pool too small for every request at once (preemption by `mode`), n = 2 forks, beam search and
    drafting: the windowed layout's tokens are the full layout's, with windows kept where turns end or
    at shared prefixes only (a sequence preempted by recompute keeps the window it resumes from)."""

    def reqs() -> list[GenerateRequest]:
        out = [
            GenerateRequest(f"p{i}", [*SYSTEM[: 20 + 5 * i], 30 + i], greedy(max_tokens=24)) for i in range(4)
        ]
        seeded = SamplingParams(max_tokens=10, temperature=0.9, seed=7, n=2, ignore_eos=True)
        out.append(GenerateRequest("fork", [*SYSTEM[:30], 3], seeded))
        out.append(GenerateRequest("beam", [*SYSTEM[:25], 4], greedy(max_tokens=6), beam_width=2))
        return out

    swap = {"preemption_mode": "swap", "num_host_blocks": 64} if mode == "swap" else {}
    got: dict[str, Collector] = {}
    for name, layout, blocks, windows in (
        ("full", "full", 14, "turns"),
        ("windowed", "windowed", 14 * 7 // 2, "turns"),
        ("shared", "windowed", 14 * 7 // 2, "shared"),
    ):
        core = make_core(
            gemma, blocks, kv_layout=layout, kv_windows=windows, speculative_tokens=4, max_num_seqs=8, **swap
        )
        fixed_cost(core)  # drafts by a fixed step-cost curve, not this machine's timings: both alike
        got[name] = run(core, reqs())
        counters = core.scheduler.counters
        preempted = counters.preemptions_swap if mode == "swap" else counters.preemptions_recompute
        assert preempted > 0, f"{name}: nothing was preempted by {mode}"
        assert_all_free(core)
    for rid, index in got["full"].outs:
        for name in ("windowed", "shared"):
            assert got[name].tokens(rid, index) == got["full"].tokens(rid, index), (name, rid, index)
