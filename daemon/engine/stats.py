"""`EngineStats`: the engine's one statistics record (`GetStats`); every stats surface renders only it.

`free_blocks + evictable_blocks + in_use_blocks == total_blocks`; cached, pinned and active overlap them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine: queues (in sequences, not requests), blocks, counters since start."""

    taken_at: float  # `time.monotonic()` on the engine thread when read
    # ---- queues and limits
    waiting_seqs: int
    running_seqs: int
    swapped_seqs: int
    requests_in_flight: int  # submitted, admitted or not, and not finished
    sessions: int  # open sessions
    max_waiting: int  # requests in flight a submit may add to (`QueueFull` beyond)
    max_running: int  # sequences a step may run
    # ---- blocks (the radix pool and tree)
    block_size: int  # tokens per KV block
    total_blocks: int  # blocks a request may use: the pool less its null block
    free_blocks: int  # unused
    evictable_blocks: int  # held only by the prefix cache: unlocked, unpinned, evictable
    in_use_blocks: int  # held by sequences' tables or locked by leases and pins
    cached_blocks: int  # every block the prefix cache holds (evictable or locked)
    pinned_blocks: int  # cached blocks exempt from eviction by a pin
    active_blocks: int  # distinct blocks in running sequences' tables (the KV they hold)
    peak_used_blocks: int  # most blocks not free at the end of any step
    peak_active_blocks: int  # most `active_blocks` at the end of any step
    cache_nodes: int  # radix tree nodes
    # ---- prefix hits, counted once per request at its first admission
    hit_tokens: int  # prompt tokens the prefix cache supplied (the sum of requests' cached_tokens)
    miss_tokens: int  # prompt tokens computed; hit_tokens + miss_tokens = admitted prompt tokens
    # ---- requests and tokens since start
    requests_finished: int
    requests_aborted: int
    requests_rejected: int
    prompt_tokens: int  # of every request that entered the queue (sessions: history + turn)
    cached_tokens: int  # prompt tokens from the cache, of every finished request
    generated_tokens: int  # tokens sampled and accepted into a sequence (beam search steps not counted)
    steps: int  # steps that computed tokens
    errors: int  # unexpected errors the engine survived (a failed step, command or timer)
    no_progress_reports: int  # watchdog reports of pending work no step advanced
    # ---- scheduling and memory pressure since start
    preemptions_recompute: int
    preemptions_swap: int
    swap_fallbacks: int  # swapped-out sequences that could not swap back in and recomputed
    held_for_shared_prefix: int  # admissions deferred until a running request published its prefix
    session_leases_shed: int  # idle sessions' leases dropped early under memory pressure
    evicted_blocks: int  # blocks freed by eviction under pressure or by admin evictions and flushes
    evictions: Mapping[str, int] = field(default_factory=dict)  # blocks the tree evicted, by reason
    # ---- host swap pool (--preemption-mode swap; 0 without one)
    host_free_blocks: int = 0
    swapped_out_blocks: int = 0
    swapped_in_blocks: int = 0
    # ---- the KV layout (--kv-layout): "windowed" keeps sliding layers' windows apart (0s when "full")
    kv_layout: str = "full"
    kv_bytes_per_block: int = 0  # bytes one block id holds across the pool's lanes, K and V
    window_pages: int = 0  # distinct pages the cache keeps for sliding layers' windows
    kept_windows: int = 0  # windows the cache keeps (where conversations resume, branch points)
    window_tombstones: int = 0  # kept windows dropped under pressure or by evictions (blocks stay)
    window_cut_tokens: int = 0  # matched prompt tokens recomputed for want of a kept window
    kv_windows: str = ""  # where windows are kept (--kv-windows: "turns" or "shared"); "" when "full"
    # ---- speculative decoding (--speculative-tokens; 0 when off)
    drafted_tokens: int = 0  # draft tokens verified
    accepted_draft_tokens: int = 0  # of those, accepted into outputs (the rest were rejected)
    draft_s: float = 0.0  # engine-thread seconds spent drafting (the tree and context lookups)

    @property
    def preemptions(self) -> int:
        """Sequences preempted, either way."""
        return self.preemptions_recompute + self.preemptions_swap

    @property
    def hit_rate(self) -> float:
        """hit_tokens / admitted prompt tokens (0 before any admission)."""
        total = self.hit_tokens + self.miss_tokens
        return self.hit_tokens / total if total else 0.0
