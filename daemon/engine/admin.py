"""Cache administration: eviction, flushes and their waiters, peak tracking (engine thread only;
other threads go through commands)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sized

import numpy as np
import structlog

from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.scheduler import Scheduler
from radixd.daemon.engine.types import FLUSH_MODES, FlushMode
from radixd.daemon.errors import EngineTimeout, FlushRefused, InvalidRequest

log = structlog.get_logger("radixd.engine.admin")


class WaitForIdle(InvalidRequest):
    """A "wait_for_idle" flush of a busy core driven without the engine loop, which would wait."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__("a 'wait_for_idle' flush of a busy engine runs on the engine thread")
        self.timeout_s = timeout_s


class Admin:
    """Eviction, flushes (and their waiters) and peak tracking."""

    def __init__(self, requests: Sized, scheduler: Scheduler, kv: KVManager) -> None:
        self.requests = requests
        self.scheduler = scheduler
        self.kv = kv
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

    def flush(self, mode: FlushMode = "evict_unlocked", timeout_s: float = 30.0) -> int:
        """Evict every unlocked cached block now; -> blocks freed (busy: FlushRefused / WaitForIdle)."""
        if mode not in FLUSH_MODES:
            raise InvalidRequest(f"flush mode must be one of {FLUSH_MODES}, got {mode!r}")
        busy = len(self.requests)
        if mode == "wait_for_idle" and busy:
            raise WaitForIdle(timeout_s)
        if mode == "refuse_if_busy" and busy:
            raise FlushRefused(
                f"{busy} requests are in flight; retry, or flush with mode 'wait_for_idle' or"
                " 'evict_unlocked'"
            )
        freed = self.kv.evict_unlocked()
        log.info("engine.admin.flush", mode=mode, freed=freed)
        return freed

    def wait_for_idle(self, deadline: float, fut: concurrent.futures.Future[int]) -> None:
        """Resolve `fut` with a flush once no request is in flight, or EngineTimeout at `deadline`."""
        self._flush_waiters.append((deadline, fut))

    @property
    def has_flush_waiters(self) -> bool:
        return bool(self._flush_waiters)

    def serve_flush_waiters(self, now: float) -> int:
        """Answer "wait_for_idle" flushes now idle or timed out; -> how many failed unexpectedly."""
        waiters, self._flush_waiters = self._flush_waiters, []
        failed = 0
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
                failed += 1
                log.exception("engine.flush_failed")
                if not fut.done():
                    fut.set_exception(exc)
        return failed

    # ---- peaks ---------------------------------------------------------------------------------
    def active_blocks(self) -> int:
        """Distinct blocks in running sequences' tables (the KV they hold, shared blocks once)."""
        flat = b"".join([s.table.blocks for s in self.scheduler.running if s.table is not None])
        if not flat:
            return 0
        # Once per step over every running block: a numpy bitmap over the pool beats a Python set.
        held = np.zeros(self.kv.num_blocks, dtype=np.bool_)
        held[np.frombuffer(flat, dtype=np.int32)] = True
        return int(np.count_nonzero(held))

    def track_peaks(self) -> None:
        """Record the peak of used blocks and of blocks held by running sequences (once per step)."""
        used = self.kv.usable_blocks() - self.kv.num_free
        self.peak_used_blocks = max(self.peak_used_blocks, used)
        self.peak_active_blocks = max(self.peak_active_blocks, self.active_blocks())
