"""One `EngineStats`, every surface: GetCacheStats, GetLoad, the Prometheus gauges (radixd's and the
vLLM names gateways scrape) and the vLLM-protocol load report show the same numbers."""

from __future__ import annotations

import pytest
from engine_kit import Collector, greedy, make_core

from radixd.daemon.engine.commands import CreateSession
from radixd.daemon.engine.engine import Engine
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.loaders import LoadedModel
from radixd.daemon.server.admin import cache_stats_response, load_response
from radixd.daemon.server.common.metrics import Metrics
from radixd.daemon.server.vllm.loads import LoadSampler

pytestmark = pytest.mark.slow


def test_every_surface_renders_the_same_stats(smollm: LoadedModel) -> None:
    core = make_core(smollm, num_blocks=64, max_num_seqs=2)
    prompt = [300 + i for i in range(40)]
    col = Collector()
    core.requests.add(GenerateRequest("warm", prompt, greedy(4)), col)
    core.requests.add(GenerateRequest("cold", [700 + i for i in range(40)], greedy(4)), col)  # evictable
    core.run_until_idle()
    core.kv.pin(prompt[:16], "")
    core.execute(CreateSession(tokens=[500 + i for i in range(20)], session_id="s"))  # a lease: in use
    for i in range(3):  # two run (a prefix hit each), one waits
        core.requests.add(GenerateRequest(f"r{i}", [*prompt, i], greedy(30)), col)
    for _ in range(4):
        core.step()
    s = core.stats()
    tree = core.kv.cache_stats()
    assert s.running_seqs == 2 and s.waiting_seqs == 1 and s.requests_in_flight == 3 and s.active_blocks > 0
    assert s.evictable_blocks > 0 and s.pinned_blocks > 0 and s.in_use_blocks > 0 and s.hit_tokens > 0
    assert (s.free_blocks, s.evictable_blocks, s.in_use_blocks) == (
        tree.free_blocks,
        tree.evictable_blocks,
        tree.in_use_blocks,
    )
    assert s.free_blocks + s.evictable_blocks + s.in_use_blocks == s.total_blocks == 63

    cache = cache_stats_response(s)
    load = load_response(s, draining=False)
    metrics = Metrics()
    metrics.add_engine_collector(lambda: s)

    def gauge(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    sampler = LoadSampler(Engine(core))
    vllm = sampler.scheduler_load(s)
    record = sampler.engine_load(s, load_only=True, seq_sample=1)

    # blocks
    assert cache.free_blocks == load.free_blocks == gauge("radixd_blocks", state="free") == s.free_blocks
    assert cache.evictable_blocks == cache.cached_blocks == gauge("radixd_blocks", state="cached")
    assert cache.evictable_blocks == s.evictable_blocks
    assert cache.in_use_blocks == gauge("radixd_blocks", state="in_use") == s.in_use_blocks
    assert cache.pinned_blocks == gauge("radixd_blocks", state="pinned") == s.pinned_blocks
    assert cache.total_blocks == load.total_blocks == gauge("radixd_blocks_total") == s.total_blocks
    assert gauge("vllm:cache_config_info", block_size="16", num_gpu_blocks=str(s.total_blocks)) == 1.0
    assert gauge("vllm:kv_cache_usage_perc") == pytest.approx(s.in_use_blocks / s.total_blocks)
    assert vllm.max_total_num_tokens == record.max_total_num_tokens == s.total_blocks * s.block_size
    assert vllm.num_used_tokens == record.num_used_tokens == s.active_blocks * s.block_size
    assert cache.nodes == gauge("radixd_cache_nodes") == s.cache_nodes
    # prefix hits, evictions, preemptions
    assert cache.hit_tokens == gauge("radixd_cache_hit_tokens_total") == s.hit_tokens
    assert cache.miss_tokens == gauge("radixd_cache_miss_tokens_total") == s.miss_tokens
    assert vllm.cache_hit_rate == pytest.approx(s.hit_tokens / (s.hit_tokens + s.miss_tokens))
    assert record.cache_hit_rate == pytest.approx(vllm.cache_hit_rate)
    assert cache.preemptions == gauge("radixd_preemptions_total") == s.preemptions
    assert dict(cache.evictions) == dict(s.evictions)
    # queues
    assert load.running_requests == gauge("radixd_running_requests") == gauge("vllm:num_requests_running")
    assert load.running_requests == vllm.num_running_reqs == record.running_requests == s.running_seqs
    assert load.waiting_requests == gauge("radixd_waiting_requests") == s.waiting_seqs
    assert load.swapped_requests == gauge("radixd_swapped_requests") == s.swapped_seqs
    waiting = s.waiting_seqs + s.swapped_seqs
    assert gauge("vllm:num_requests_waiting") == vllm.num_waiting_reqs == record.waiting_requests == waiting
    assert load.max_queue == s.max_waiting and load.sessions == s.sessions == 1
    assert vllm.max_running_requests == record.max_running_requests == s.max_running == 2
