"""Gauges under the names Kubernetes inference gateways scrape from vLLM model servers.

The Gateway API Inference Extension's endpoint picker reads, by default, the vLLM metric names of its
model-server protocol: queue length `vllm:num_requests_waiting`, running requests
`vllm:num_requests_running`, KV usage `vllm:kv_cache_usage_perc` (and the older
`vllm:gpu_cache_usage_perc`), and the cache shape in `vllm:cache_config_info`'s labels. radixd serves
them beside its own `radixd_*` series so that a picker needs no per-engine configuration.

NOTE: KV usage here is the blocks requests and sessions hold (`in_use`), as a fraction in [0, 1]:
the prefix cache keeps free memory full of reusable blocks on purpose, and counting them would make
every warm replica look saturated to the picker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from radixd.daemon.engine.stats import EngineStats


def gateway_families(s: EngineStats) -> Iterator[Any]:
    """The gauges a gateway's endpoint picker reads, for the engine's stats (served by the engine
    collector in metrics.py beside the `radixd_*` series)."""
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
