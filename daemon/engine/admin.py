"""Admin and session operations of `EngineCore`, run on the engine thread via `Engine.call`.

Examples (from any thread)::

    engine.call(lambda c: c.evict(64)).result()
    engine.call(lambda c: c.stats()).result()
    engine.call(lambda c: c.sessions.fork("s1", 4)).result()
    engine.flush("wait_for_idle", timeout_s=10).result()
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import TYPE_CHECKING, Any

import structlog

from radixd.daemon.engine.sessions import SessionInfo
from radixd.daemon.engine.types import FLUSH_MODES, EngineTimeout, FlushMode, FlushRefused, InvalidRequest

if TYPE_CHECKING:
    from radixd.daemon.engine.core import EngineCore

log = structlog.get_logger("radixd.engine.admin")


class AdminMixin:
    """Cache administration, stats and session listing (mixed into EngineCore)."""

    def _core(self) -> EngineCore:
        return self  # type: ignore[return-value]

    def evict(self, n_blocks: int) -> int:
        """Evict up to `n_blocks` unlocked cached blocks (LRU); -> blocks freed."""
        if n_blocks < 0:
            raise InvalidRequest(f"n_blocks must be >= 0, got {n_blocks}")
        c = self._core()
        freed = c.tree.evict_count(n_blocks)
        c.kv.evicted_blocks += freed
        log.info("engine.admin.evict", asked=n_blocks, freed=freed)
        return freed

    def evict_prefix(self, tokens: list[int], namespace: str = "") -> int:
        """Evict the unlocked cached blocks under `tokens`; -> blocks freed."""
        c = self._core()
        freed = int(c.tree.evict_prefix(tokens, namespace=namespace))
        c.kv.evicted_blocks += freed
        log.info("engine.admin.evict_prefix", tokens=len(tokens), freed=freed)
        return freed

    def flush(self, mode: FlushMode = "evict_unlocked") -> int:
        """Evict every unlocked cached block now. "refuse_if_busy" raises FlushRefused while requests
        are in flight. ("wait_for_idle" needs the engine loop: use `request_flush` / `Engine.flush`.)"""
        c = self._core()
        if mode not in FLUSH_MODES:
            raise InvalidRequest(f"flush mode must be one of {FLUSH_MODES}, got {mode!r}")
        if mode == "refuse_if_busy" and c.requests:
            raise FlushRefused(
                f"{len(c.requests)} requests are in flight; retry, or flush with mode 'wait_for_idle'"
                " or 'evict_unlocked'"
            )
        freed = c.tree.flush("evict_unlocked")
        c.kv.evicted_blocks += freed
        log.info("engine.admin.flush", mode=mode, freed=freed)
        return freed

    def request_flush(self, mode: FlushMode, timeout_s: float, fut: concurrent.futures.Future[int]) -> None:
        """Resolve `fut` with a flush: now, or for "wait_for_idle" once no request is in flight."""
        c = self._core()
        if not fut.set_running_or_notify_cancel():
            return
        try:
            if mode != "wait_for_idle" or not c.requests:
                fut.set_result(self.flush("evict_unlocked" if mode == "wait_for_idle" else mode))
                return
        except Exception as exc:
            fut.set_exception(exc)
            return
        c._flush_waiters.append((time.monotonic() + timeout_s, fut))

    def _serve_flush_waiters(self, now: float) -> None:
        c = self._core()
        waiters, c._flush_waiters = c._flush_waiters, []
        for deadline, fut in waiters:
            try:
                if not c.requests:
                    fut.set_result(self.flush("evict_unlocked"))
                elif now >= deadline:
                    busy = f"{len(c.requests)} requests in flight"
                    fut.set_exception(EngineTimeout(f"flush 'wait_for_idle' timed out with {busy}"))
                else:
                    c._flush_waiters.append((deadline, fut))
            except Exception as exc:  # the caller waiting on this flush gets the error, not the engine
                c.counters["errors"] += 1
                log.exception("engine.flush_failed")
                if not fut.done():
                    fut.set_exception(exc)

    def pin(self, tokens: list[int], namespace: str = "") -> int:
        """Exempt the cached prefix `tokens` from eviction (within the pin budget); -> tokens pinned
        (0 when nothing of it is cached)."""
        return self._core().tree.pin(tokens, namespace=namespace)

    def unpin(self, tokens: list[int], namespace: str = "") -> None:
        self._core().tree.unpin(tokens, namespace=namespace)

    def lookup_prefix(self, tokens: list[int], namespace: str = "") -> int:
        """How many leading tokens of `tokens` are cached."""
        return self._core().kv.cached_len(tokens, namespace)

    def list_sessions(self, namespace: str | None = None) -> list[SessionInfo]:
        return self._core().sessions.all(namespace)

    def load(self) -> dict[str, int]:
        c = self._core()
        s = c.scheduler
        return {
            "waiting": len(s.waiting),
            "running": len(s.running),
            "swapped": len(s.swapped),
            "requests": len(c.requests),
            "free_blocks": c.pool.num_free,
            "total_blocks": c.usable_blocks(),
        }

    def stats(self) -> dict[str, Any]:
        """Counters and gauges: blocks by state, hits, evictions, preemptions, sessions.

        `hit_tokens` / `miss_tokens` count each admitted request's prompt once (hits = its
        `cached_tokens`, hits + misses = its prompt tokens; see `SchedulerCounters`); `cache` holds
        the radix tree's own statistics, whose hit/miss counts cover every match (session relocks and
        retried admissions included).
        """
        c = self._core()
        sc = c.scheduler.counters
        out: dict[str, Any] = dict(c.counters)
        out.update(c.load())
        out.update(
            block_size=c.block_size,
            evicted_blocks=c.kv.evicted_blocks,
            preemptions=sc.preemptions_recompute + sc.preemptions_swap,
            preemptions_recompute=sc.preemptions_recompute,
            preemptions_swap=sc.preemptions_swap,
            swap_fallbacks=sc.swap_fallbacks,
            held_for_shared_prefix=sc.held_for_shared_prefix,
            hit_tokens=sc.hit_tokens,
            miss_tokens=sc.miss_tokens,
            evictable_blocks=c.tree.evictable_blocks(),
            peak_used_blocks=c.peak_used_blocks,
            peak_active_blocks=c.peak_active_blocks,
            sessions=len(c.sessions),
            session_leases_shed=c.sessions.shed,
            cache=c.tree.stats(),
        )
        if c.swap is not None:
            out.update(
                host_free_blocks=c.swap.pool.num_free,
                swapped_out_blocks=c.swap.swapped_out_blocks,
                swapped_in_blocks=c.swap.swapped_in_blocks,
            )
        return out
