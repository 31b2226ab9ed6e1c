"""Prometheus metrics over HTTP on loopback. Handlers record request metrics; cache state is read from
the engine at scrape time, so it is never stale and costs nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from radixd.daemon.engine.stats import EngineStats
from radixd.daemon.server.common.gateway_metrics import gateway_families

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """All metrics of one daemon, in their own registry (tests can run several daemons per process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "radixd_requests", "Finished RPCs by method and status code", ["rpc", "code"], registry=r
        )
        self.prompt_tokens = Counter(
            "radixd_prompt_tokens", "Prompt tokens of generation requests", registry=r
        )
        self.cached_tokens = Counter(
            "radixd_cached_tokens", "Prompt tokens served from the prefix cache", registry=r
        )
        self.generated_tokens = Counter("radixd_generated_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram(
            "radixd_ttft_seconds", "Time to first token", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.queue_time = Histogram(
            "radixd_queue_seconds", "Time waiting for the first step", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.inter_token = Histogram(
            "radixd_inter_token_seconds", "Time between streamed chunks", buckets=_ITL_BUCKETS, registry=r
        )
        self.slow_reader_aborts = Counter(
            "radixd_slow_reader_aborts", "Streams aborted because the client read too slowly", registry=r
        )

    def add_engine_collector(self, read_stats: Callable[[], EngineStats | None]) -> None:
        """Export cache state from `read_stats()` (None = unavailable) as `radixd_*` and gateway series."""
        self.registry.register(_EngineCollector(read_stats))

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        """Start the HTTP exporter thread (`port` 0 = a free one); returns the server."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server


class _EngineCollector(Collector):
    def __init__(self, read_stats: Callable[[], EngineStats | None]) -> None:
        self._read = read_stats

    def collect(self) -> Iterator[Any]:
        s = self._read()
        if s is None:
            return
        # State "cached" is the evictable blocks (label kept for dashboards); free + cached + in_use = total.
        blocks = GaugeMetricFamily(
            "radixd_blocks",
            "KV blocks by state (cached: held only by the cache, evictable)",
            labels=["state"],
        )
        by_state = {"free": s.free_blocks, "cached": s.evictable_blocks, "in_use": s.in_use_blocks}
        for state, n in {**by_state, "pinned": s.pinned_blocks}.items():
            blocks.add_metric([state], float(n))
        yield blocks
        yield from _plain(s, _POOL_SERIES)
        evictions = CounterMetricFamily(
            "radixd_evicted_blocks", "Evicted blocks by reason", labels=["reason"]
        )
        for reason, count in sorted(s.evictions.items()):
            evictions.add_metric([reason], float(count))
        yield evictions
        yield from _plain(s, _ENGINE_SERIES)
        yield from gateway_families(s)


# An unlabelled series read off the engine's stats: (family, name, help, its value in the stats).
_Series = tuple[type[CounterMetricFamily | GaugeMetricFamily], str, str, Callable[[EngineStats], float]]

_POOL_SERIES: tuple[_Series, ...] = (
    (GaugeMetricFamily, "radixd_blocks_total", "KV blocks in the pool", lambda s: s.total_blocks),
    (GaugeMetricFamily, "radixd_cache_nodes", "Radix tree nodes", lambda s: s.cache_nodes),
    (
        GaugeMetricFamily,
        "radixd_window_pages",
        "Pool blocks the cache keeps for sliding-window layers' windows (windowed KV layout)",
        lambda s: s.window_pages,
    ),
    (
        GaugeMetricFamily,
        "radixd_kept_windows",
        "Sliding-layer windows the cache keeps",
        lambda s: s.kept_windows,
    ),
    (
        CounterMetricFamily,
        "radixd_window_tombstones",
        "Kept sliding-layer windows dropped under pressure or by evictions (their blocks stay cached)",
        lambda s: s.window_tombstones,
    ),
)
_ENGINE_SERIES: tuple[_Series, ...] = (
    (CounterMetricFamily, "radixd_preemptions", "Preempted sequences", lambda s: s.preemptions),
    (
        CounterMetricFamily,
        "radixd_cache_hit_tokens",
        "Prompt tokens served from the prefix cache, counted once per request at its first admission"
        " (the sum of cached_tokens); hit + miss = prompt tokens",
        lambda s: s.hit_tokens,
    ),
    (
        CounterMetricFamily,
        "radixd_cache_miss_tokens",
        "Prompt tokens computed (prompt - cached, per request at its first admission; the last prompt"
        " token is always computed); hit + miss = prompt tokens",
        lambda s: s.miss_tokens,
    ),
    (
        CounterMetricFamily,
        "radixd_drafted_tokens",
        "Speculative draft tokens verified",
        lambda s: s.drafted_tokens,
    ),
    (
        CounterMetricFamily,
        "radixd_accepted_draft_tokens",
        "Speculative draft tokens accepted into outputs (of radixd_drafted_tokens)",
        lambda s: s.accepted_draft_tokens,
    ),
    (
        CounterMetricFamily,
        "radixd_draft_seconds",
        "Engine-thread seconds spent drafting",
        lambda s: s.draft_s,
    ),
    (GaugeMetricFamily, "radixd_running_requests", "Running sequences", lambda s: s.running_seqs),
    (
        GaugeMetricFamily,
        "radixd_waiting_requests",
        "Sequences waiting for admission",
        lambda s: s.waiting_seqs,
    ),
    (
        GaugeMetricFamily,
        "radixd_swapped_requests",
        "Sequences preempted to host memory (--preemption-mode swap), waiting to resume",
        lambda s: s.swapped_seqs,
    ),
)


def _plain(s: EngineStats, series: tuple[_Series, ...]) -> Iterator[Any]:
    for family, name, doc, value in series:
        yield family(name, doc, value=float(value(s)))
