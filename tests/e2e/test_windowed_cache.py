"""The daemon over a model with sliding-window layers (a random-weight Gemma 3) in its default KV layout
(windowed): a session's turns resume from the window the cache kept, and GetCacheStats, LookupPrefix and
a flush tell the operator what the cache holds."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from e2e_kit import RunningDaemon, serve_args, start_daemon, stop_daemon
from radixd_client._pb import common_pb2, generation_pb2, generation_pb2_grpc
from tiny_models import write_tiny_gemma3

from radixd.daemon.loaders import load_model

S, F = "sliding_attention", "full_attention"
CONTEXT = [3 + (i * 5) % 60 for i in range(70)]  # 70 tokens: several 16-token blocks, window 8


@pytest.fixture(scope="module")
def gemma_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    path = write_tiny_gemma3(tmp_path_factory.mktemp("gemma3"), [S, S, F, S, S, S, F], 8)
    loaded = load_model(str(path), "cpu", "float32")
    d = start_daemon(loaded, serve_args(tmp_path_factory.mktemp("daemon")))
    try:
        yield d
    finally:
        stop_daemon(d)


def test_session_turns_resume_from_kept_windows(gemma_daemon: RunningDaemon) -> None:
    with gemma_daemon.client() as c:
        stats = c.cache_stats()
        assert stats.kv_layout == "windowed" and stats.kv_windows == "turns" and stats.kv_bytes_per_block > 0
        s = c.create_session(CONTEXT)
        first = s.send([7, 8, 9], max_tokens=6, temperature=0.0, ignore_eos=True).collect()
        history = s.refresh().num_tokens
        second = s.send([10, 11], max_tokens=6, temperature=0.0, ignore_eos=True).collect()
        # Turn 2 resumes where turn 1 ended: the window kept there holds the sliding layers' keys.
        # (The last token sampled in turn 1 was never computed: it is turn 2's first to compute.)
        assert second.cached_tokens == history - 1
        assert first.prompt_tokens > 0 and second.prompt_tokens > history
        stats = c.cache_stats()
        assert stats.kept_windows >= 1 and 0 < stats.window_pages < stats.tree_blocks * 6
        everything = s.refresh().num_tokens
        assert c.lookup_prefix([*CONTEXT[:40], 63]).cached_tokens == 0  # no window kept inside it
        s.close()
        assert c.flush() > 0
        stats = c.cache_stats()
        assert stats.kept_windows == 0 and stats.window_pages == 0 and stats.tree_blocks == 0
        assert everything > history


def test_a_request_whose_window_pages_the_pool_cannot_hold_is_refused(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """7 usable blocks: 80 tokens take 5 blocks for the full layers and, at most, 2 positions of 3 pages
    for the sliding ones: 11. Such a request once passed admission (its pages were not counted) and
    waited forever; now it is refused, naming the numbers, and one that fits runs."""
    path = write_tiny_gemma3(tmp_path_factory.mktemp("gemma3"), [S, S, F, S, S, S, F], 8)
    loaded = load_model(str(path), "cpu", "float32")
    d = start_daemon(loaded, serve_args(tmp_path_factory.mktemp("daemon"), "--num-blocks", "8"))

    def generate(ids: list[int], max_tokens: int) -> list[generation_pb2.GenerateResponse]:
        req = generation_pb2.GenerateRequest(
            prompt=common_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=ids)),
            sampling=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        )
        with grpc.insecure_channel(d.address) as ch:
            return list(generation_pb2_grpc.GenerationServiceStub(ch).Generate(req, timeout=60))

    try:
        with pytest.raises(grpc.RpcError) as err:
            generate(CONTEXT[:40], 40)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = err.value.details()
        assert "needs up to 11 KV blocks of 16 tokens (its window's pages included)" in details
        assert "the pool has 7" in details and "max_tokens 40" in details
        events = generate(CONTEXT[:10], 6)
        assert events[-1].end.usage.completion_tokens == 6
    finally:
        stop_daemon(d)
