"""Gauges under the vLLM names Kubernetes inference gateways' endpoint pickers scrape.

KV usage counts only `in_use` blocks: with the cache counted every warm replica would look saturated.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from radixd.daemon.engine.stats import EngineStats


def gateway_families(s: EngineStats) -> Iterator[Any]:
    """The gauges a gateway's endpoint picker reads, for the engine's stats."""
    usage = s.in_use_blocks / s.total_blocks if s.total_blocks else 0.0
    waiting = float(s.waiting_seqs + s.swapped_seqs)
    yield GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting to be scheduled", value=waiting)
    yield GaugeMetricFamily("vllm:num_requests_running", "Requests running", value=float(s.running_seqs))
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        yield GaugeMetricFamily(name, "KV blocks held by requests and sessions, fraction of the pool", usage)
    info = GaugeMetricFamily(
        "vllm:cache_config_info", "KV cache shape", labels=["block_size", "num_gpu_blocks"]
    )
    info.add_metric([str(s.block_size), str(s.total_blocks)], 1.0)
    yield info
