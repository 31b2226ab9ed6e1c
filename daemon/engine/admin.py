"""Cache administration, load and stats of the engine (engine thread only).

Other threads reach these through commands (commands.py) that `Engine.execute` runs on the engine
thread, e.g. ``engine.execute(Evict(64)).result()``; tests that drive an `EngineCore` on their own
thread may call `core.admin` directly.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import numpy as np
import structlog

from radixd.daemon.engine.commands import EngineLoad
from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.scheduler import Scheduler
from radixd.daemon.engine.sequence import RequestState
from radixd.daemon.engine.sessions import SessionManager
from radixd.daemon.engine.swap import HostSwap
from radixd.daemon.engine.types import FLUSH_MODES, EngineTimeout, FlushMode, FlushRefused, InvalidRequest

log = structlog.get_logger("radixd.engine.admin")


# The load readings `stats()` reports under the same names.
_STATS_FROM_LOAD = ("waiting", "running", "swapped", "requests", "free_blocks", "total_blocks")


class Admin:
    """Eviction, flushes (and their waiters), pins, prefix lookups, load, stats and peak tracking.

    `requests` and `counters` are the engine's (shared with the core), read here, never replaced.
    """

    def __init__(
        self,
        config: EngineConfig,
        requests: dict[str, RequestState],
        counters: dict[str, int],
        scheduler: Scheduler,
        kv: KVManager,
        sessions: SessionManager,
        swap: HostSwap | None,
    ) -> None:
        self.config = config
        self.requests = requests
        self.counters = counters
        self.scheduler = scheduler
        self.kv = kv
        self.sessions = sessions
        self.swap = swap
        self._flush_waiters: list[tuple[float, concurrent.futures.Future[int]]] = []
        self.peak_used_blocks = 0
        self.peak_active_blocks = 0

    # ---- eviction and flushes --------------------------------------------------------------------
    def evict(self, n_blocks: int) -> int:
        """Evict up to `n_blocks` unlocked cached blocks (LRU); -> blocks freed."""
        if n_blocks < 0:
            raise InvalidRequest(f"n_blocks must be >= 0, got {n_blocks}")
        freed = self.kv.evict(n_blocks)
        log.info("engine.admin.evict", asked=n_blocks, freed=freed)
        return freed

    def evict_prefix(self, tokens: list[int], namespace: str = "") -> int:
        """Evict the unlocked cached blocks under `tokens`; -> blocks freed."""
        freed = self.kv.evict_prefix(tokens, namespace)
        log.info("engine.admin.evict_prefix", tokens=len(tokens), freed=freed)
        return freed

    def flush(self, mode: FlushMode = "evict_unlocked") -> int:
        """Evict every unlocked cached block now (leased and pinned blocks stay). "refuse_if_busy"
        raises FlushRefused while requests are in flight; "wait_for_idle" needs the engine loop when
        requests are in flight (use `request_flush` / `Engine.flush`) and is refused here then."""
        if mode not in FLUSH_MODES:
            raise InvalidRequest(f"flush mode must be one of {FLUSH_MODES}, got {mode!r}")
        if mode != "evict_unlocked" and self.requests:
            if mode == "wait_for_idle":
                raise InvalidRequest("a 'wait_for_idle' flush of a busy engine runs on the engine thread")
            raise FlushRefused(
                f"{len(self.requests)} requests are in flight; retry, or flush with mode 'wait_for_idle'"
                " or 'evict_unlocked'"
            )
        freed = self.kv.evict_unlocked()
        log.info("engine.admin.flush", mode=mode, freed=freed)
        return freed

    def request_flush(self, mode: FlushMode, timeout_s: float, fut: concurrent.futures.Future[int]) -> None:
        """Resolve `fut` with a flush: now, or for "wait_for_idle" once no request is in flight."""
        if not fut.set_running_or_notify_cancel():
            return
        try:
            if mode != "wait_for_idle" or not self.requests:
                fut.set_result(self.flush("evict_unlocked" if mode == "wait_for_idle" else mode))
                return
        except Exception as exc:
            fut.set_exception(exc)
            return
        self._flush_waiters.append((time.monotonic() + timeout_s, fut))

    @property
    def has_flush_waiters(self) -> bool:
        return bool(self._flush_waiters)

    def serve_flush_waiters(self, now: float) -> None:
        """Timers: answer the "wait_for_idle" flushes whose engine went idle or whose time ran out."""
        waiters, self._flush_waiters = self._flush_waiters, []
        for deadline, fut in waiters:
            try:
                if not self.requests:
                    fut.set_result(self.flush("evict_unlocked"))
                elif now >= deadline:
                    busy = f"{len(self.requests)} requests in flight"
                    fut.set_exception(EngineTimeout(f"flush 'wait_for_idle' timed out with {busy}"))
                else:
                    self._flush_waiters.append((deadline, fut))
            except Exception as exc:  # the caller waiting on this flush gets the error, not the engine
                self.counters["errors"] += 1
                log.exception("engine.flush_failed")
                if not fut.done():
                    fut.set_exception(exc)

    # ---- pins and lookups ------------------------------------------------------------------------
    def pin(self, tokens: list[int], namespace: str = "") -> int:
        """Exempt the cached prefix `tokens` from eviction (within the pin budget); -> tokens pinned
        (0 when nothing of it is cached)."""
        return self.kv.pin(tokens, namespace)

    def unpin(self, tokens: list[int], namespace: str = "") -> None:
        self.kv.unpin(tokens, namespace)

    def lookup_prefix(self, tokens: list[int], namespace: str = "") -> int:
        """How many leading tokens of `tokens` are cached."""
        return self.kv.cached_len(tokens, namespace)

    # ---- load and stats --------------------------------------------------------------------------
    def active_blocks(self) -> int:
        """Distinct blocks in running sequences' tables (the KV they hold, shared blocks once)."""
        flat = b"".join([s.table.blocks for s in self.scheduler.running if s.table is not None])
        if not flat:
            return 0
        # NOTE: once per step over every running block (16k at 256 x 1k tokens): a bitmap over the
        # pool costs a fifth of a Python set of the same ids (numpy's: half of torch's, no int64 copy).
        held = np.zeros(self.kv.num_blocks, dtype=np.bool_)
        held[np.frombuffer(flat, dtype=np.int32)] = True
        return int(np.count_nonzero(held))

    def track_peaks(self) -> None:
        """Record the peak of used blocks and of blocks held by running sequences (once per step)."""
        used = self.kv.usable_blocks() - self.kv.num_free
        self.peak_used_blocks = max(self.peak_used_blocks, used)
        self.peak_active_blocks = max(self.peak_active_blocks, self.active_blocks())

    def load(self) -> EngineLoad:
        """Queue lengths, blocks and the counters a router reads."""
        s = self.scheduler
        return EngineLoad(
            waiting=len(s.waiting),
            running=len(s.running),
            swapped=len(s.swapped),
            requests=len(self.requests),
            free_blocks=self.kv.num_free,
            total_blocks=self.kv.usable_blocks(),
            active_blocks=self.active_blocks(),
            block_size=self.kv.block_size,
            sessions=len(self.sessions),
            max_waiting=self.config.max_waiting,
            max_running=self.config.max_num_seqs,
            generated_tokens=self.counters.get("generated_tokens", 0),
            hit_tokens=s.counters.hit_tokens,
            miss_tokens=s.counters.miss_tokens,
            taken_at=time.monotonic(),
        )

    def stats(self) -> dict[str, Any]:
        """Counters and gauges: blocks by state, hits, evictions, preemptions, sessions.

        `hit_tokens` / `miss_tokens` count each admitted request's prompt once (hits = its
        `cached_tokens`, hits + misses = its prompt tokens; see `SchedulerCounters`); `cache` holds
        the radix tree's own statistics, whose hit/miss counts cover every match (session relocks and
        retried admissions included).
        """
        sc = self.scheduler.counters
        load = self.load()
        out: dict[str, Any] = dict(self.counters)
        out.update({k: getattr(load, k) for k in _STATS_FROM_LOAD})
        out.update(
            block_size=self.kv.block_size,
            evicted_blocks=self.kv.evicted_blocks,
            preemptions=sc.preemptions_recompute + sc.preemptions_swap,
            preemptions_recompute=sc.preemptions_recompute,
            preemptions_swap=sc.preemptions_swap,
            swap_fallbacks=sc.swap_fallbacks,
            held_for_shared_prefix=sc.held_for_shared_prefix,
            hit_tokens=sc.hit_tokens,
            miss_tokens=sc.miss_tokens,
            evictable_blocks=self.kv.evictable_blocks(),
            peak_used_blocks=self.peak_used_blocks,
            peak_active_blocks=self.peak_active_blocks,
            sessions=len(self.sessions),
            session_leases_shed=self.sessions.shed,
            cache=self.kv.cache_stats(),
        )
        if self.swap is not None:
            out.update(
                host_free_blocks=self.swap.num_free,
                swapped_out_blocks=self.swap.swapped_out_blocks,
                swapped_in_blocks=self.swap.swapped_in_blocks,
            )
        return out
