"""The scheduler: which sequences compute which tokens in the next step, within token and sequence budgets.

Order: running decodes, prefill chunks, swapped-out sequences, then new admissions. Out of blocks:
evict unlocked cache, then preempt the lowest-priority newest sequence (never one out of preemptions).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.forks import Forker
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.policy import (
    pick_victim,
    running_order,
    running_rank,
    shares_pending_prefix,
    waiting_order,
)
from radixd.daemon.engine.prefix_cache import PrefixHit
from radixd.daemon.engine.sequence import SeqStatus, Sequence
from radixd.daemon.engine.swap import HostSwap
from radixd.radix import TokenKey

log = structlog.get_logger("radixd.engine.scheduler")


@dataclass(slots=True)
class Planned:
    """One sequence's share of the next step: compute `tokens[start:start + n]`."""

    seq: Sequence
    start: int
    n: int


@dataclass(slots=True)
class StepPlan:
    """The next step: `chunks` compute several tokens each (prefill), `decodes` one each, their next:
    `tokens[num_computed]` (a decode, or a prompt's last token or one-token chunk)."""

    chunks: list[Planned]
    decodes: list[Sequence]

    def __bool__(self) -> bool:
        return bool(self.chunks or self.decodes)


@dataclass
class SchedulerCounters:
    """Scheduler totals since start; hit/miss tokens count each prompt once, at first admission."""

    preemptions_recompute: int = 0
    preemptions_swap: int = 0
    held_for_shared_prefix: int = 0
    admitted: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    swap_fallbacks: int = 0  # swapped-out sequences that could not swap back in and recomputed instead


@dataclass(eq=False, repr=False)
class Scheduler:
    """Owns the waiting / running / swapped sets (engine thread only)."""

    config: EngineConfig
    kv: KVManager
    swap: HostSwap | None
    forker: Forker
    waiting: list[Sequence] = field(init=False, default_factory=list)
    running: list[Sequence] = field(init=False, default_factory=list)
    swapped: list[Sequence] = field(init=False, default_factory=list)
    counters: SchedulerCounters = field(init=False, default_factory=SchedulerCounters)

    # ---- membership ------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        seq.status = SeqStatus.RUNNING
        # NOTE: `running` stays in `running_rank` order, so a step orders it without sorting.
        bisect.insort(self.running, seq, key=running_rank)

    def remove(self, seq: Sequence) -> None:
        for group in (self.waiting, self.running, self.swapped):
            if seq in group:
                group.remove(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def fork_root(self, root: Sequence) -> list[Sequence]:
        """Replace a root that computed all prompt tokens but the last by its running children."""
        children = self.forker.fork(root)
        self.remove(root)
        for c in children:
            self.add_running(c)
        return children

    # ---- preemption ------------------------------------------------------------------------------
    def preempt(self, seq: Sequence) -> None:
        """Take `seq` off the device without losing a token: swap to host if room, else recompute later."""
        held = len(seq.table.blocks) if seq.table is not None else 0
        self.running.remove(seq)
        seq.preemptions += 1
        if self.swap is not None and self.swap.can_hold(seq, self.kv):
            freed = self.swap.swap_out(seq, self.kv)
            seq.status = SeqStatus.SWAPPED
            self.swapped.append(seq)
            self.counters.preemptions_swap += 1
            mode = "swap"
        else:
            self.kv.insert_all(seq, resumes=True)
            freed = self.kv.release(seq)
            self.add(seq)
            self.counters.preemptions_recompute += 1
            mode = "recompute"
        log.info(
            "engine.preempt",
            request_id=seq.request.request_id,
            seq_id=seq.seq_id,
            mode=mode,
            blocks_held=held,
            blocks_freed=freed,
            tokens=len(seq.tokens),
            preemptions=seq.preemptions,
        )

    def swapped_to_recompute(self) -> Sequence:
        """Move the oldest swapped-out sequence to waiting (host KV dropped, recomputes); -> it."""
        seq = self.swapped.pop(0)
        if self.swap is not None:
            self.swap.drop(seq)
        seq.num_computed = 0
        self.add(seq)
        self.counters.swap_fallbacks += 1
        return seq

    def _reserve(self, seq: Sequence, n: int, planned: set[int]) -> int:
        """Free the blocks `seq` needs for `n` more tokens: evict cache, then preempt others; where the
        next victim would be `seq` itself (or there is none), first try the chunk up to the next block
        boundary; -> the tokens reserved (0: none)."""
        kv = self.kv
        small = self.first_block_chunk(seq.num_computed, n)
        while not kv.ensure_free(kv.new_blocks_for_append(seq, n)):
            victim = pick_victim(
                (s for s in self.running if s.seq_id not in planned), self.config.max_preemptions
            )
            last_resort = victim is None or victim is seq
            if last_resort and small < n and kv.ensure_free(kv.new_blocks_for_append(seq, small)):
                return small
            if victim is None:
                return 0
            self.preempt(victim)
            if victim is seq:
                return 0
        return n

    def first_block_chunk(self, done: int, n: int) -> int:
        """The part of an `n`-token chunk after `done` tokens that ends at the next block boundary: it
        takes the fewest fresh blocks (and, with sliding layers, pages: a step holds a page for each of
        its chunk's tokens until it ends, more than the window a sequence keeps)."""
        bs = self.kv.block_size
        return min(n, bs - done % bs)

    # ---- the plan --------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """The next step's work, in the order described in the module docstring."""
        cfg = self.config
        chunks: list[Planned] = []
        decodes: list[Sequence] = []
        planned: set[int] = set()
        budget = cfg.max_num_batched_tokens

        def add_to_plan(seq: Sequence, n: int) -> None:
            nonlocal budget
            start = seq.num_computed
            self.kv.append(seq, n)
            if n == 1:
                decodes.append(seq)
            else:
                chunks.append(Planned(seq, start, n))
            planned.add(seq.seq_id)
            budget -= n

        running = self.running
        remaining = [s.remaining for s in running]
        order = running_order(running, remaining)
        pairs = zip(running, remaining, strict=True)
        due = [s for s, r in pairs if r == 1 and s.status is SeqStatus.RUNNING][:budget]
        # The common step: decodes whose blocks are free (after eviction) plan as one batch; under
        # pressure the loop below plans them one at a time, picking victims.
        if due and self.kv.append_decodes(due):
            decodes += due
            planned = {s.seq_id for s in due}
            budget -= len(due)
        for seq in order:
            if budget <= 0:
                break
            if seq.seq_id in planned or seq.status is not SeqStatus.RUNNING or seq.remaining == 0:
                continue
            n = self._reserve(seq, min(seq.remaining, budget), planned)
            if n:
                add_to_plan(seq, n)

        # Swapped sequences resume before anything new is admitted (they are older).
        while self.swapped and self.swap is not None and budget > 0 and len(self.running) < cfg.max_num_seqs:
            seq = self.swapped[0]
            n = min(seq.remaining, budget)
            if not self.kv.ensure_free(self.kv.blocks_to_swap_in(seq.num_computed, n)):
                break
            self.swapped.pop(0)
            self.swap.swap_in(seq, self.kv)
            self.add_running(seq)
            if n > 0:  # a beam swapped out while it waited for its siblings has nothing to compute yet
                add_to_plan(seq, n)
        if not self.swapped:
            self._admit(budget, add_to_plan)
        return StepPlan(chunks, decodes)

    def _admit_alone(
        self, seq: Sequence, hit: PrefixHit, key: TokenKey, n: int
    ) -> tuple[PrefixHit, int] | None:
        """With nothing running (nothing else will free blocks) and no room for `seq`'s chunk from `hit`
        (of `key`): if `seq` fits what is free or evictable, the chunk up to the next block boundary,
        else no cached prefix at all; -> (hit, tokens), or None (`hit` released: session leases or pins
        hold what it needs, which `Unstaller.unstall` sheds or waits for).

        NOTE: a hit locks the blocks it reuses and the kept window it resumes from, so in a pool about one
        request large it can hold the very pages its own chunk needs: waiting for them would wait
        forever. Without a hit, all of them are evictable."""
        kv, ns = self.kv, seq.request.req.namespace
        hit.release()
        if kv.peak_blocks(seq.request.prompt_len, seq.request.req) > kv.num_free + kv.evictable_blocks():
            return None
        for k in (key, seq.key(0)):  # matched one at a time: an unused hit would keep its lock
            hit = kv.match(k, ns)
            small = self.first_block_chunk(hit.num_tokens, min(seq.target_len - hit.num_tokens, max(n, 1)))
            if kv.ensure_free(kv.blocks_to_admit(hit, small)):
                return hit, small
            hit.release()
        return None

    def _admit(self, budget: int, add_to_plan: Callable[[Sequence, int], None]) -> None:
        cfg = self.config
        bs = self.kv.block_size
        order = waiting_order(
            self.waiting[:256],
            cfg.schedule_policy,
            lambda s: self.kv.cached_len(s.key(len(s.tokens) - 1), s.request.req.namespace),
        )
        order += self.waiting[256:]
        for seq in order:
            if budget <= 0 or len(self.running) >= cfg.max_num_seqs:
                return
            # A request scoring its prompt reads no more of the cache than it scored (prompt_scoring.py).
            limit = len(seq.tokens) - 1
            if seq.request.prompt_logprobs is not None:
                limit = min(limit, seq.request.prompt_logprobs.cached_prefix_limit())
            key = seq.key(limit)
            hit = self.kv.match(key, seq.request.req.namespace)
            if self.kv.shares_prefixes and limit == len(seq.tokens) - 1:
                producers = [s for s in self.running if s.num_computed < s.request.prompt_len]
                producer = shares_pending_prefix(seq, hit.num_tokens, producers, bs)
                if producer is not None:
                    self.kv.keep_window_for(producer, seq)
                    hit.release()
                    self.counters.held_for_shared_prefix += 1
                    continue
            n = min(seq.target_len - hit.num_tokens, budget)
            fresh = self.kv.blocks_to_admit(hit, n)
            # Keep a block for each decode about to cross a block boundary, so admitting does not
            # immediately force a preemption.
            reserve = sum(
                1
                for s in self.running
                if s.table is not None and s.table.num_tokens % bs == 0 and s.remaining == 1
            )
            if not self.kv.ensure_free(fresh + reserve):
                admitted = self._admit_alone(seq, hit, key, n) if not self.running else None
                if admitted is None:
                    hit.release()  # idempotent: `_admit_alone` may have released it
                    if cfg.schedule_policy == "fcfs":
                        return  # head-of-line: a big request is not starved by smaller ones behind it
                    continue
                hit, n = admitted
            self.waiting.remove(seq)
            self.kv.attach(seq, hit)
            self.add_running(seq)
            self.counters.admitted += 1
            req = seq.request
            if req.cached_tokens is None:
                req.cached_tokens = seq.num_computed
                req.admitted_at = time.monotonic()
                self.counters.hit_tokens += seq.num_computed
                self.counters.miss_tokens += req.prompt_len - seq.num_computed
            if seq.is_root and seq.remaining == 0:
                for child in self.fork_root(seq):
                    if budget > 0 and self.kv.ensure_free(self.kv.new_blocks_for_append(child, 1)):
                        add_to_plan(child, 1)
                        budget -= 1
                continue
            if n > 0:
                add_to_plan(seq, n)
                budget -= n
