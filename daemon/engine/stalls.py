"""`Unstaller`: what the engine does when pending work plans nothing: free room one move at a time,
and end with a clear error the request that can never go on."""

from __future__ import annotations

import sys

import structlog

from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.policy import pick_victim, waiting_order
from radixd.daemon.engine.requests import Requests
from radixd.daemon.engine.scheduler import Scheduler
from radixd.daemon.engine.sequence import Sequence
from radixd.daemon.engine.sessions import SessionManager
from radixd.daemon.engine.validation import Validator
from radixd.daemon.errors import RequestTooLarge

log = structlog.get_logger("radixd.engine")


class Unstaller:
    """Breaks a stall of the engine's pending work (`EngineCore.step` calls it while a plan is empty)."""

    def __init__(
        self,
        scheduler: Scheduler,
        sessions: SessionManager,
        kv: KVManager,
        validator: Validator,
        requests: Requests,
    ) -> None:
        self.scheduler = scheduler
        self.sessions = sessions
        self.kv = kv
        self.validator = validator
        self.requests = requests

    def unstall(self) -> bool:
        """Free room for stalled work, one move at a time, in this order: an idle session's lease;
        running sequences that no step could grow: preempt one, past `max_preemptions`; a lone running
        sequence, or waiting requests alone, that cannot go on: fail the first (a swapped-out sequence
        holds no blocks, so moving one would not help it); else the oldest swapped-out sequence to
        recompute, which shares cached blocks; -> whether anything changed.

        NOTE: every request makes progress or ends with an error: pending work that plans nothing is
        stalled on memory that nothing else in flight will free. Only pinned prefixes are waited for
        (an unpin frees them; the watchdog reports the stall meanwhile)."""
        sched = self.scheduler
        if self.sessions.shed_one():
            log.info(
                "engine.session_lease_shed",
                waiting=len(sched.waiting),
                swapped=len(sched.swapped),
                free_blocks=self.kv.num_free,
            )
            return True
        victim = pick_victim(sched.running, sys.maxsize) if len(sched.running) > 1 else None
        if victim is not None:
            sched.preempt(victim)
            return True
        if not sched.running and not sched.swapped:
            stuck = waiting_order(sched.waiting, "fcfs")[:1]
        elif sched.running:
            stuck = sched.running
        else:
            stuck = []
        if stuck:
            return not self.kv.pinned_blocks() and self._fail(stuck[0])
        if not sched.swapped:
            return False
        seq = sched.swapped_to_recompute()
        log.info(
            "engine.swap_fallback_recompute",
            request_id=seq.request.request_id,
            seq_id=seq.seq_id,
            tokens=len(seq.tokens),
            free_blocks=self.kv.num_free,
        )
        return True

    def _fail(self, seq: Sequence) -> bool:
        """Fail `seq`'s request: alone (sessions shed, everything else evicted) it cannot get the blocks
        its next step needs; -> True."""
        kv, req = self.kv, seq.request.req
        need = kv.peak_blocks(seq.request.prompt_len, req)
        room = kv.num_free + kv.evictable_blocks()
        have = f"it holds {kv.blocks_held(seq)} and only {room} more are free or evictable"
        exc = RequestTooLarge(self.validator.too_large(seq.request.prompt_len, req, need, have))
        log.warning(
            "engine.stall_failed",
            request_id=seq.request.request_id,
            status=seq.status.name,
            tokens=len(seq.tokens),
            need_blocks=need,
            free_blocks=kv.num_free,
            evictable_blocks=kv.evictable_blocks(),
        )
        self.requests.fail(seq.request.request_id, exc)
        return True
