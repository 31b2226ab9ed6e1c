"""Engine configuration: batching budgets, cache and preemption policy, timers."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

from radixd.daemon.model.kv_layout import KV_LAYOUTS

SchedulePolicy = Literal["fcfs", "lpm"]
PreemptionMode = Literal["recompute", "swap"]

# The KV pool's defaults (the pool is sized where the model is loaded, outside EngineConfig):
# `build_core`, `radixd serve`, `radixd generate` and `radixd cluster` read them from here.
DEFAULT_BLOCK_SIZE = 16  # tokens per KV block
DEFAULT_KV_CACHE_GB = 1.0  # pool size in GiB when no block count is given
MAX_SPECULATIVE_TOKENS = 32  # draft tokens a sequence may verify in one step
# Where the windowed layout's cache keeps sliding layers' windows (`--kv-windows`): "turns" where each
# conversation's last turn ended and where requests branched (a shared prompt); "shared" only where
# requests branched, so a conversation's own history is recomputed on its next turn (least memory).
KV_WINDOWS = ("turns", "shared")


def add_kv_pool_flags(
    group: argparse._ActionsContainer, num_blocks_help: str, *, blocks_before_gb: bool
) -> None:
    """The KV pool's flags as `radixd serve` and `radixd generate` take them: `--block-size`, then
    `--kv-cache-gb` and `--num-blocks` (help: `num_blocks_help`) in the order the command lists them,
    then `--kv-layout` and `--kv-windows`."""
    group.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help=f"tokens per KV block (default {DEFAULT_BLOCK_SIZE})",
    )
    if blocks_before_gb:
        group.add_argument("--num-blocks", type=int, default=None, help=num_blocks_help)
    group.add_argument(
        "--kv-cache-gb",
        type=float,
        default=None,
        help=f"KV pool size in GiB (default {DEFAULT_KV_CACHE_GB:g})",
    )
    if not blocks_before_gb:
        group.add_argument("--num-blocks", type=int, default=None, help=num_blocks_help)
    group.add_argument(
        "--kv-layout",
        choices=KV_LAYOUTS,
        default="auto",
        help="how the pool holds sliding-window layers: 'windowed' keeps their window only (the cache keeps "
        "it where conversations resume), 'full' every token in every layer; 'auto' (default): windowed "
        "for a model with both full and sliding layers (Gemma 3)",
    )
    group.add_argument(
        "--kv-windows",
        choices=KV_WINDOWS,
        default="turns",
        help="where the windowed layout's cache keeps sliding layers' windows: 'turns' (default) where each "
        "conversation's last turn ended and where requests share a prefix; 'shared' only where they share "
        "one (least memory: a conversation's own history is recomputed on its next turn)",
    )


@dataclass(frozen=True)
class EngineConfig:
    """Knobs of the scheduler and engine loop; these defaults are the daemon's.

    max_num_seqs / max_num_batched_tokens: per-step budgets. schedule_policy: "fcfs" or "lpm" (longest
    cached prefix first). preemption_mode: "recompute" or "swap" (to `num_host_blocks` host blocks;
    recompute when full); after max_preemptions a sequence is no longer a victim. max_waiting: unfinished
    requests beyond it are refused (QueueFull). watchdog_s: report no progress. stream_interval: tokens
    per output after the first. jump_forward: grammar-forced tokens as one chunk. speculative_tokens:
    most drafts a sequence verifies per step (within the draft budget, draft_budget.py); 0 = off.
    kv_layout: how the pool holds sliding-window layers (`KV_LAYOUTS`, model/kv_layout.py).
    kv_windows: where the windowed layout's cache keeps windows (`KV_WINDOWS`).
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    prefix_caching: bool = True
    schedule_policy: SchedulePolicy = "lpm"
    preemption_mode: PreemptionMode = "recompute"
    num_host_blocks: int = 0
    max_preemptions: int = 8
    max_waiting: int = 256
    watchdog_s: float = 30.0
    session_ttl_s: float = 600.0
    max_model_len: int | None = None
    pin_budget_fraction: float = 0.25
    stream_interval: int = 1
    jump_forward: bool = True
    speculative_tokens: int = 8
    kv_layout: str = "auto"
    kv_windows: str = "turns"

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.schedule_policy not in ("fcfs", "lpm"):
            raise ValueError(f"schedule_policy must be 'fcfs' or 'lpm', got {self.schedule_policy!r}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        if self.preemption_mode == "swap" and self.num_host_blocks < 1:
            raise ValueError("preemption_mode 'swap' needs num_host_blocks >= 1 (the host pool size)")
        if self.max_preemptions < 1:
            raise ValueError(f"max_preemptions must be >= 1, got {self.max_preemptions}")
        if self.watchdog_s <= 0 or self.session_ttl_s <= 0:
            raise ValueError("watchdog_s and session_ttl_s must be > 0 seconds")
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1 token, got {self.stream_interval}")
        if not 0 <= self.speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"speculative_tokens must be in [0, {MAX_SPECULATIVE_TOKENS}] (0 = off), "
                f"got {self.speculative_tokens}"
            )
        if self.kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {self.kv_layout!r}")
        if self.kv_windows not in KV_WINDOWS:
            raise ValueError(f"kv_windows must be one of {KV_WINDOWS}, got {self.kv_windows!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
