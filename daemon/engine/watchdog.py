"""The no-progress watchdog: pending work no step advanced for `watchdog_s` is logged and counted
(once per period); it changes nothing."""

from __future__ import annotations

import time

import structlog

from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.scheduler import Scheduler

log = structlog.get_logger("radixd.engine")


class Watchdog:
    """Times pending work since its last progress (engine thread only)."""

    def __init__(self, stall_s: float, scheduler: Scheduler, kv: KVManager) -> None:
        self.stall_s = stall_s
        self.scheduler = scheduler
        self.kv = kv
        self.reports = 0  # stalls reported since start
        self._last_progress = time.monotonic()
        self._reported = 0.0

    def progressed(self) -> None:
        """A step computed tokens, or work arrived at an idle engine: the stall clock restarts."""
        self._last_progress = time.monotonic()

    def check(self, now: float) -> None:
        """Report a stall of pending work (at most once per `stall_s`)."""
        sched = self.scheduler
        stalled = sched.has_work() and now - self._last_progress > self.stall_s
        if not stalled or now - self._reported <= self.stall_s:
            return
        self._reported = now
        self.reports += 1
        log.warning(
            "engine.no_progress",
            stalled_s=round(now - self._last_progress, 1),
            waiting=len(sched.waiting),
            running=len(sched.running),
            swapped=len(sched.swapped),
            free_blocks=self.kv.num_free,
            evictable_blocks=self.kv.evictable_blocks(),
        )
