"""The sliding-window half of `KVManager`, for a model whose KV layout is windowed.

Each running sequence has a `SlidingTable` (its sliding layers' pages, released as they leave the
window); the `WindowStore` keeps the windows a later request resumes from: at the end of every finished
or preempted sequence (a conversation's last turn) and at branch points (where a request's cached prefix
ended without a window: a shared system prompt). A prefix hit is cut back to the deepest kept window
inside it. NOTE: a sequence's sliding table always covers its block table's positions from the window's
start on, so the runner's sliding tables are never 0 where a query reads.
"""

from __future__ import annotations

from collections.abc import Callable

from radixd.daemon.engine.policy import common_prefix_len
from radixd.daemon.engine.prefix_cache import PrefixHit
from radixd.daemon.engine.sequence import Sequence
from radixd.radix import BlockIds, BlockPool, CopyOp, SlidingTable, WindowStore, window_start


class SlidingKV:
    """Sliding tables of running sequences and the windows the cache keeps (engine thread only)."""

    def __init__(self, pool: BlockPool, window: int, groups: int, keep_ends: bool = True) -> None:
        """`keep_ends`: keep the window where each request stops (`keep_end`), as well as at branch
        points; without, a conversation resumes from its last branch point (config.KV_WINDOWS)."""
        self.pool = pool
        self.keep_ends = keep_ends
        self.window = window
        self.groups = groups
        self.block_size = pool.block_size
        self.store = WindowStore(pool, window, groups)
        self.cut_tokens = 0  # matched tokens recomputed because no window was kept inside them

    # ---- admission -------------------------------------------------------------------------------
    def cut(
        self, hit: PrefixHit, packed: bytes, namespace: str, continues: Callable[[int], bool]
    ) -> PrefixHit:
        """`hit` cut back to the deepest kept window within it (the window rides along on the hit).
        `continues(n)`: whether the cache holds tokens past the first n (requests diverged there)."""
        m = hit.num_tokens
        if m == 0:
            return hit
        w = self.store.find(namespace, packed, m)
        q = w.num_tokens if w is not None else 0
        if w is not None:
            self.store.hold_window(w)  # NOTE: until attach or release: admission's evictions must not drop it
        hit.window = w
        # Where the match ends, the request keeps a window as it passes, for the next one to resume
        # from; with windows at shared prefixes only, not where it merely extends a cached path's end
        # (its own conversation's last turn), only where cached tokens go on (requests diverge there).
        hit.branch = m if q < m and (self.keep_ends or continues(m)) else 0
        if q == m:
            return hit
        self.cut_tokens += m - q
        B = self.block_size
        full = hit.full_blocks
        if q % B:
            k = q // B
            hit.partial_src = full[k] if k < len(full) else hit.partial_src
            hit.partial_tokens = q % B
        else:
            hit.partial_src, hit.partial_tokens = None, 0
        hit.full_blocks = BlockIds(full[: q // B])
        hit.num_tokens = q
        return hit

    def usable(self, namespace: str, packed: bytes, cached: int) -> int:
        """How many of `cached` leading tokens a request could resume from (no LRU change)."""
        if cached == 0:
            return 0
        w = self.store.find(namespace, packed, cached)
        return w.num_tokens if w is not None else 0

    def window_pages(self, n_tokens: int) -> int:
        """Pages the window ending at `n_tokens` spans."""
        B = self.block_size
        return (-(-n_tokens // B) - window_start(n_tokens, self.window, B)) * self.groups

    def peak_pages(self, n_tokens: int) -> int:
        """The most pages a sequence of up to `n_tokens` tokens holds at once when it computes up to a
        block boundary at a time: the positions its window spans, plus the one it writes."""
        B = self.block_size
        return min(-(-n_tokens // B), (self.window - 1) // B + 2) * self.groups

    def pages_to_swap_in(self, n_computed: int, n_new: int) -> int:
        """Pages a swapped-out sequence takes back (its window) and to compute `n_new` more tokens."""
        B = self.block_size
        grow = -(-(n_computed + n_new) // B) - -(-n_computed // B)
        return self.window_pages(n_computed) + grow * self.groups

    def pages_to_start(self, n_tokens_cached: int, n_new: int) -> int:
        """Pages a sequence resuming after `n_tokens_cached` takes to compute `n_new` tokens: new positions,
        and the copy of the kept window's partly filled last one."""
        B = self.block_size
        lo = window_start(n_tokens_cached, self.window, B)
        cached_positions = -(-n_tokens_cached // B)
        copy = 1 if n_tokens_cached % B else 0
        return (-(-(n_tokens_cached + n_new) // B) - max(lo, cached_positions) + copy) * self.groups

    # ---- sequences -------------------------------------------------------------------------------
    def attach(self, seq: Sequence, hit: PrefixHit) -> None:
        """Give `seq` a sliding table starting from the hit's window (none: from scratch)."""
        t = SlidingTable(self.pool, self.groups)
        w = hit.window
        if w is not None:
            t.adopt(w.lo, w.pages, w.num_tokens)
            seq.window_from = seq.key(w.num_tokens).packed
            self.store.release_window(w)
            hit.window = None
        seq.window = t
        seq.window_marks = [hit.branch] if hit.branch else []

    def new_pages_for(self, seq: Sequence, n: int) -> int:
        t = seq.window
        return t.new_pages_for(n) if t is not None else -(-n // self.block_size) * self.groups

    def append(self, seq: Sequence, n: int) -> list[CopyOp]:
        if seq.window is None:
            seq.window = SlidingTable(self.pool, self.groups)
        return seq.window.append(n)

    def resume(self, seq: Sequence, n_tokens: int) -> None:
        """A sliding table holding fresh pages for the window that ends at `n_tokens` only."""
        t = SlidingTable(self.pool, self.groups)
        t.start_at(n_tokens, self.window)
        seq.window = t

    def slide(self, seq: Sequence) -> None:
        """After a step: keep the window at a branch point the step crossed, then release what left."""
        t = seq.window
        if t is None:
            return
        n = seq.num_computed
        marks = seq.window_marks
        if marks and min(marks) <= n:
            for mark in [m for m in marks if m <= n]:
                marks.remove(mark)
                if window_start(mark, self.window, self.block_size) >= t.lo:  # else passed long ago
                    lo, pages = t.span(mark, self.window)
                    self.store.keep(seq.request.req.namespace, seq.key(mark).packed, lo, pages, "branch")
        t.slide(window_start(n, self.window, self.block_size))

    def keep_for(self, producer: Sequence, waiting: Sequence) -> None:
        """`waiting` waits for `producer` to compute the prefix they share: have the producer keep the
        window where that prefix's full blocks end (where `waiting` will resume)."""
        if producer.window is None or producer.lease is None:
            return
        shared = common_prefix_len(
            waiting.tokens[: len(waiting.tokens) - 1], producer.tokens, self.block_size
        )
        shared -= shared % self.block_size
        if shared > producer.num_computed and shared not in producer.window_marks:
            producer.window_marks.append(shared)

    def keep_end(self, seq: Sequence, resumes: bool = False) -> None:
        """Keep the window where `seq` stops (its last turn: where the conversation resumes), unless
        windows are kept at branch points only; `resumes`: preempted, it resumes there (kept always)."""
        t, n = seq.window, seq.num_computed
        if t is None or n == 0 or seq.lease is None:
            return
        ns = seq.request.req.namespace
        if self.keep_ends or resumes:
            lo, pages = t.span(n, self.window)
            self.store.keep(ns, seq.key(n).packed, lo, pages, "leaf")
        if seq.window_from is not None and len(seq.window_from) < len(seq.key(n).packed):
            self.store.supersede(ns, seq.window_from)

    def truncate(self, seq: Sequence, n_tokens: int) -> None:
        if seq.window is not None:
            seq.window.truncate(n_tokens)

    def fork(self, parent: Sequence, children: list[Sequence]) -> None:
        tables = parent.window.fork(len(children)) if parent.window is not None else [None] * len(children)
        for child, t in zip(children, tables, strict=True):
            child.window = t
            child.window_marks = list(parent.window_marks)
            child.window_from = parent.window_from

    def release(self, seq: Sequence) -> None:
        if seq.window is not None:
            seq.window.release()
            seq.window = None
        seq.window_marks = []
        seq.window_from = None

    # ---- pressure --------------------------------------------------------------------------------
    def drop_dead(self, alive: Callable[[str, bytes, int], bool]) -> int:
        """Drop the windows whose tokens the tree no longer holds (they can never be resumed from)."""
        return self.store.drop_where(lambda ns, key, w: not alive(ns, key, w.num_tokens))
