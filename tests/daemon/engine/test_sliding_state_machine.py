"""Stateful property test of the windowed KV layout: pool + tree + sliding tables + kept windows, driven
through `KVManager` like the engine drives it, with every invariant checked after every step.

Every block and page carries a simulated KV content (the token and position written at each slot, and
for a page its sliding group; copy ops copy it). Before each simulated forward the test checks that every
key a query reads holds the right content: the global layers' whole prefix, the sliding layers' window.
So a cut prefix hit, a kept window, a fork, a copy-on-write, a slide, an eviction or a swap that hands
out wrong or released KV fails here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixd.daemon.engine.config import KV_WINDOWS, EngineConfig
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.sequence import RequestState, Sequence
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.sampling import SamplingParams
from radixd.radix import encode_tokens, window_start
from radixd.radix.node import token_ids
from radixd.radix.verify import check_consistency, iter_nodes

B = 2  # block size
W = 3  # window
G = 2  # sliding groups
TOKENS = st.lists(st.integers(0, 1), min_size=1, max_size=14)
PICK = st.integers(0, 63)
NAMESPACES = st.sampled_from(["", "b"])

Slot = tuple[str, int, int]  # (group: "g" or "s<k>", token, position)


def _seq(tokens: list[int], namespace: str, seq_id: int) -> Sequence:
    req = GenerateRequest(f"r{seq_id}", tokens, SamplingParams(), namespace=namespace)
    r = RequestState(req=req, sink=lambda _o: None, prompt=list(tokens), arrival=0.0)
    s = Sequence(seq_id, r, 0, list(tokens), None)
    r.seqs.append(s)
    return s


class WindowedKV(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(12, 48), windows=st.sampled_from(KV_WINDOWS))
    def setup(self, num_blocks: int, windows: str) -> None:
        config = EngineConfig(kv_windows=windows)  # windows kept where turns end, or at shared prefixes only
        self.kv = KVManager.create(num_blocks, B, config, window=W, sliding_groups=G)
        self.mem: dict[int, list[Slot | None]] = {}
        self.running: list[Sequence] = []
        self.host: dict[int, tuple[list[int], list[Slot | None]]] = {}  # seq_id -> swapped-out content
        self.swapped: list[Sequence] = []
        self.finished: list[tuple[list[int], str]] = []  # what ended, for turns that go on from it
        self.next_id = 1

    # ---- simulated device ------------------------------------------------------------------------
    def _slots(self, block: int) -> list[Slot | None]:
        return self.mem.setdefault(block, [None] * B)

    def _copies(self) -> None:
        for src, dst, n in self.kv.take_copies():
            self._slots(dst)[:n] = self._slots(src)[:n]

    def _where(self, seq: Sequence, pos: int) -> Iterator[tuple[int, str]]:
        assert seq.table is not None and seq.window is not None
        yield seq.table.blocks[pos // B], "g"
        for g, ids in enumerate(seq.window.pages):
            yield ids[pos // B], f"s{g}"

    def _forward(self, seq: Sequence, n: int, draft: list[int] | None = None) -> None:
        """Check what positions [num_computed, +n) read, then write their KV (the step's forward): the
        sequence's own tokens, or a `draft` proposed after them."""
        start = seq.num_computed
        toks = seq.tokens if draft is None else seq.tokens[:start] + draft
        assert seq.table is not None and seq.window is not None
        for k in range(start):  # global layers: every earlier key
            got = self._slots(seq.table.blocks[k // B])[k % B]
            assert got == ("g", seq.tokens[k], k), f"global key {k} of seq {seq.seq_id}: {got}"
        for k in range(max(0, start - W + 1), start):  # sliding layers: the first query's window
            for g, ids in enumerate(seq.window.pages):
                assert ids[k // B] != 0, f"seq {seq.seq_id}: key {k} of group {g} was released"
                got = self._slots(ids[k // B])[k % B]
                assert got == (f"s{g}", seq.tokens[k], k), f"sliding key {k} of seq {seq.seq_id}: {got}"
        for pos in range(start, start + n):
            for block, group in self._where(seq, pos):
                assert block != 0
                self._slots(block)[pos % B] = (group, toks[pos], pos)
        if draft is None:  # a draft's tokens count once accepted (verify_draft)
            seq.num_computed = start + n
            self.kv.insert_full_blocks(seq)

    # ---- rules -------------------------------------------------------------------------------------
    @precondition(lambda self: self.finished)
    @rule(pick=PICK, more=TOKENS)
    def next_turn(self, pick: int, more: list[int]) -> None:
        """A conversation goes on: the history of an ended request, then new tokens."""
        tokens, ns = self.finished[pick % len(self.finished)]
        self.admit(tokens + more, ns)

    @rule(tokens=TOKENS, ns=NAMESPACES)
    def admit(self, tokens: list[int], ns: str) -> None:
        seq = _seq(tokens, ns, self.next_id)
        self.next_id += 1
        hit = self.kv.match(seq.key(len(tokens) - 1), ns)
        n = len(tokens) - hit.num_tokens
        if not self.kv.ensure_free(self.kv.blocks_to_admit(hit, n)):
            hit.release()
            return
        event(f"admit: resumes from a window={hit.window is not None}, cut back={hit.branch > 0}")
        self.kv.attach(seq, hit)
        self._copies()
        self.kv.append(seq, n)
        self._copies()
        self._forward(seq, n)
        self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(pick=PICK, token=st.integers(0, 1))
    def decode(self, pick: int, token: int) -> None:
        seq = self.running[pick % len(self.running)]
        seq.tokens.append(token)
        if not self.kv.append_decodes([seq]):
            seq.tokens.pop()
            return
        self._copies()
        self._forward(seq, 1)

    @precondition(lambda self: self.running)
    @rule(pick=PICK, draft=st.lists(st.integers(0, 1), min_size=1, max_size=4), keep=st.integers(0, 4))
    def verify_draft(self, pick: int, draft: list[int], keep: int) -> None:
        seq = self.running[pick % len(self.running)]
        if not self.kv.ensure_free(self.kv.new_blocks_for_append(seq, len(draft))):
            return
        start = seq.num_computed
        self.kv.append(seq, len(draft))
        self._copies()
        self._forward(seq, len(draft), draft)
        keep = min(keep, len(draft))
        seq.tokens.extend(draft[:keep])  # a sequence's tokens only grow: the accepted ones join
        self.kv.truncate(seq, start + keep)
        seq.num_computed = start + keep
        self.kv.insert_full_blocks(seq)

    @precondition(lambda self: self.running)
    @rule(pick=PICK, cut=st.integers(0, 14), more=TOKENS)
    def wait_for(self, pick: int, cut: int, more: list[int]) -> None:
        """A request waits for a running one to compute the prefix they share."""
        producer = self.running[pick % len(self.running)]
        waiting = _seq(producer.tokens[:cut] + more, producer.request.req.namespace, self.next_id)
        self.next_id += 1
        self.kv.keep_window_for(producer, waiting)

    @precondition(lambda self: self.running)
    @rule(pick=PICK, k=st.integers(1, 3))
    def fork(self, pick: int, k: int) -> None:
        parent = self.running[pick % len(self.running)]
        children = []
        for _ in range(k):
            c = _seq(list(parent.tokens), parent.request.req.namespace, self.next_id)
            self.next_id += 1
            children.append(c)
        self.kv.fork(parent, children)
        self.running += children

    @precondition(lambda self: self.running)
    @rule(pick=PICK)
    def finish(self, pick: int) -> None:
        seq = self.running.pop(pick % len(self.running))
        self.kv.insert_all(seq)
        self.kv.release(seq)
        self.finished.append((list(seq.tokens), seq.request.req.namespace))

    @precondition(lambda self: self.running)
    @rule(pick=PICK)
    def preempt(self, pick: int) -> None:
        """Preemption by recompute: whatever the policy, the window where it stopped stays to resume from."""
        seq = self.running.pop(pick % len(self.running))
        n, ns = seq.num_computed, seq.request.req.namespace
        kept = n > 0 and seq.lease is not None and seq.window is not None
        self.kv.insert_all(seq, resumes=True)
        sliding = self.kv.sliding
        assert sliding is not None
        if kept:
            assert sliding.usable(ns, _packed(seq.tokens[:n]), n) == n
        self.kv.release(seq)
        self.finished.append((list(seq.tokens), ns))

    @precondition(lambda self: self.running)
    @rule(pick=PICK)
    def swap_out(self, pick: int) -> None:
        seq = self.running.pop(pick % len(self.running))
        held = self.kv.kv_blocks(seq)
        self.host[seq.seq_id] = ([c for _, c in held], [s for b, c in held for s in self._slots(b)[:c]])
        n = seq.num_computed
        self.kv.release(seq)
        seq.num_computed = n
        self.swapped.append(seq)

    @precondition(lambda self: self.swapped)
    @rule(pick=PICK)
    def swap_in(self, pick: int) -> None:
        seq = self.swapped[pick % len(self.swapped)]
        if not self.kv.ensure_free(self.kv.blocks_to_swap_in(seq.num_computed, 0)):
            return
        self.swapped.remove(seq)
        self.kv.resume(seq, seq.num_computed)
        self.kv.lease_new_path(seq)
        counts, content = self.host.pop(seq.seq_id)
        held = self.kv.kv_blocks(seq)
        assert [c for _, c in held] == counts
        it = iter(content)
        for b, c in held:
            for i in range(c):
                self._slots(b)[i] = next(it)
        self.running.append(seq)

    @rule(n=st.integers(1, 20))
    def pressure(self, n: int) -> None:
        sliding = self.kv.sliding
        assert sliding is not None
        before = sliding.store.dropped
        self.kv.ensure_free(min(self.kv.pool.num_free + n, self.kv.pool.num_usable))
        event(f"pressure: windows dropped={sliding.store.dropped > before}")

    @rule()
    def flush(self) -> None:
        self.kv.evict_unlocked()

    @rule(tokens=TOKENS, ns=NAMESPACES)
    def evict_prefix(self, tokens: list[int], ns: str) -> None:
        self.kv.evict_prefix(tokens[:2], ns)

    @rule(tokens=TOKENS, ns=NAMESPACES)
    def lookup(self, tokens: list[int], ns: str) -> None:
        n = self.kv.cached_len(tokens, ns)
        assert 0 <= n <= len(tokens)
        sliding = self.kv.sliding
        assert sliding is not None
        assert n == 0 or sliding.store.get(ns, _packed(tokens[:n])) is not None

    # ---- invariants --------------------------------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        kv = self.kv
        sliding = kv.sliding
        assert sliding is not None
        tables = [s.table for s in self.running if s.table is not None]
        windows = [s.window for s in self.running if s.window is not None]
        check_consistency(kv.tree, tables, windows, sliding.store)

    @invariant()
    def running_windows_are_kept(self) -> None:
        for seq in self.running:
            assert seq.window is not None
            # NOTE: exactly its window: nothing left of it is held (a long conversation holds W tokens).
            assert seq.window.lo == window_start(seq.num_computed, W, B)

    @invariant()
    def kept_windows_hold_their_tokens(self) -> None:
        sliding = self.kv.sliding
        assert sliding is not None
        for (_ns, key), w in sliding.store:
            toks = token_ids(key)
            assert len(toks) == w.num_tokens and w.lo == window_start(w.num_tokens, W, B)
            for g, ids in enumerate(w.pages):
                for i, page in enumerate(ids):
                    for k in range((w.lo + i) * B, min((w.lo + i + 1) * B, w.num_tokens)):
                        assert self._slots(page)[k % B] == (f"s{g}", toks[k], k)

    @invariant()
    def cached_blocks_hold_their_tokens(self) -> None:
        for x in iter_nodes(self.kv.tree):
            end = x.end // 4
            toks = token_ids(x.tokens)
            first = end - len(toks)
            for k in range(first, end):
                assert self._slots(x.blocks[(k - first) // B])[k % B] == ("g", toks[k - first], k)


def _packed(tokens: list[int]) -> bytes:
    return encode_tokens(tokens).packed


WindowedKV.TestCase.settings = settings(
    max_examples=int(os.environ.get("RADIXD_HYPOTHESIS_EXAMPLES", "150")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestWindowedKV = WindowedKV.TestCase
