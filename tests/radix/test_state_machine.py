"""Stateful property test: pool + tree + tables driven like an engine, with invariants after every step.

The vocabulary has 2 tokens so prefixes collide heavily. Every block carries a simulated KV content
(the token written at each slot; copy ops copy it), so the test also proves that the cache never hands
out a block whose content differs from the tokens it claims, and that no write ever lands in a block
another holder still reads (copy-on-write).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixd.radix import (
    EVICT_REASONS,
    BlockPool,
    BlockTable,
    Lease,
    OutOfBlocks,
    PinBudgetExceeded,
    RadixTree,
    append_one_each,
    blocks_for_one_each,
)
from radixd.radix.node import Node, encode_tokens, token_ids
from radixd.radix.verify import check_consistency, iter_nodes

TOKENS = st.lists(st.integers(0, 1), min_size=0, max_size=14)
NAMESPACES = st.sampled_from(["", "tenant-b"])
PICK = st.integers(0, 63)  # index (mod len) into the live sequences: cheaper to draw than sampled_from


@dataclass
class Seq:
    table: BlockTable
    tokens: list[int]
    namespace: str
    lease: Lease
    # The test's own record, independent of the tree: the lease was not released, and the first
    # `locked` tokens were inserted with it, so they must stay cached.
    lease_live: bool = True
    locked: int = 0


def _path_tokens(node: Node) -> tuple[int, ...]:
    parts = []
    x: Node | None = node
    while x is not None and x.parent is not None:
        parts.append(token_ids(x.tokens))
        x = x.parent
    return tuple(t for part in reversed(parts) for t in part)


class MirrorListener:
    """Rebuilds, from the tree's events alone, how many cached nodes cover each (namespace, prefix)."""

    def __init__(self) -> None:
        self.cover: Counter[tuple[str, tuple[int, ...]]] = Counter()

    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        assert 0 <= start < len(tokens) and num_blocks > 0
        self.cover.update((namespace, tuple(tokens[:i])) for i in range(start + 1, len(tokens) + 1))

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        assert 0 <= start < len(tokens) and reason in EVICT_REASONS
        self.cover.subtract((namespace, tuple(tokens[:i])) for i in range(start + 1, len(tokens) + 1))

    def cached(self) -> set[tuple[str, tuple[int, ...]]]:
        assert all(n >= 0 for n in self.cover.values()), "a prefix was removed more often than stored"
        return {key for key, n in self.cover.items() if n > 0}


def _lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class RadixMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.seqs: list[Seq] = []
        self.pins: set[tuple[str, tuple[int, ...]]] = set()

    @initialize(block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(6, 40), listen=st.booleans())
    def setup(self, block_size: int, num_blocks: int, listen: bool) -> None:
        self.B = block_size
        self.pool = BlockPool(num_blocks, block_size)
        self.tree = RadixTree(self.pool, pin_budget_fraction=0.3)
        self.mirror = MirrorListener()
        # Both settings: with a listener every change also goes through the events path.
        self.tree.listener = self.mirror if listen else None
        self.content: dict[int, list[int | None]] = {}

    # ---------------------------------------------------------------- helpers
    def _write(
        self, table: BlockTable, slots: list[int], copies: list[tuple[int, int, int]], toks: list[int]
    ) -> None:
        for src, dst, n in copies:
            self.content[dst] = list(self.content[src][:n]) + [None] * (self.B - n)
        for slot, tok in zip(slots, toks, strict=True):
            blk, off = divmod(slot, self.B)
            if off == 0 and blk not in self.content:
                self.content[blk] = [None] * self.B
            self.content.setdefault(blk, [None] * self.B)[off] = tok

    def _append(self, seq: Seq, toks: list[int]) -> bool:
        before = self.tree.stats()
        try:
            slots, copies = seq.table.append_slots(len(toks))
        except OutOfBlocks:
            after = self.tree.stats()
            assert before == after, "a failed append changed state"
            return False
        self._write(seq.table, slots, copies, toks)
        seq.tokens.extend(toks)
        return True

    def _brute_best(self, toks: tuple[int, ...], ns: str) -> int:
        best = 0
        for node in iter_nodes(self.tree):
            root = node
            while root.parent is not None:
                root = root.parent
            if self.tree.store.roots.get(ns) is not root:
                continue
            best = max(best, _lcp(toks, _path_tokens(node)))
        return best

    # ------------------------------------------------------------------ rules
    @rule(toks=TOKENS, ns=NAMESPACES)
    def new_request(self, toks: list[int], ns: str) -> None:
        t = tuple(toks)
        m = self.tree.match(encode_tokens(t) if len(t) % 2 else t, ns)  # both key forms
        assert m.num_tokens == len(m.blocks) * self.B
        best = self._brute_best(t, ns)
        assert m.cached_tokens == best, f"match found {m.cached_tokens} cached tokens, best is {best}"
        for i, b in enumerate(m.blocks):
            assert self.content[b] == list(t[i * self.B : (i + 1) * self.B]), "cached block content differs"
        if m.partial_block is not None:
            assert 0 < m.partial_tokens < self.B
            got = self.content[m.partial_block][: m.partial_tokens]
            assert got == list(t[m.num_tokens : m.num_tokens + m.partial_tokens])
        table = BlockTable(self.pool)
        table.share_prefix(m.blocks, m.num_tokens)
        seq = Seq(table, list(t[: m.num_tokens]), ns, m.lease)
        self.seqs.append(seq)
        if m.partial_block is not None:
            try:
                op = table.copy_partial(m.partial_block, m.partial_tokens)
            except OutOfBlocks:
                return
            src, dst, n = op
            self.content[dst] = list(self.content[src][:n]) + [None] * (self.B - n)
            seq.tokens.extend(t[m.num_tokens : m.num_tokens + n])
        self._append(seq, list(t[len(seq.tokens) :]))

    @rule(toks=TOKENS, gen=st.lists(st.integers(0, 1), max_size=5), ns=NAMESPACES, finish=st.booleans())
    def serve(self, toks: list[int], gen: list[int], ns: str, finish: bool) -> None:
        """A whole request: match, prefill, generate, insert (lease follows), maybe finish."""
        self.new_request(toks, ns)
        seq = self.seqs[-1]
        if len(seq.tokens) == len(toks):
            self._append(seq, gen)
        self.insert(len(self.seqs) - 1)
        if finish:
            self.finish(len(self.seqs) - 1, lease_first=False, twice=False)

    @rule(toks=TOKENS, ns=NAMESPACES)
    def insert_donated(self, toks: list[int], ns: str) -> None:
        """The bench adapter's protocol: a table from the matched blocks, the uncached suffix computed
        into fresh blocks, every block cached at once (``final``), then the table and lease released."""
        t = tuple(toks)
        m = self.tree.match(t, ns)
        assert m.block_ids.tolist() == m.blocks
        table = BlockTable(self.pool)
        table.lease_prefix(m.block_ids)
        try:
            table.append(len(t) - table.num_tokens)
        except OutOfBlocks:
            m.lease.release()
            return
        new = table.blocks[len(m.blocks) :].tolist()
        for i, b in enumerate(new):
            start = (len(m.blocks) + i) * self.B
            chunk = list(t[start : start + self.B])
            self.content[b] = chunk + [None] * (self.B - len(chunk))
        res = self.tree.insert_table(t, table, table.num_blocks, ns, m.lease, final=True)
        assert set(res.duplicate_blocks) <= set(new)
        assert all(self.pool.refcount(b) == 0 for b in res.duplicate_blocks)
        table.release()
        m.lease.release()

    @precondition(lambda self: self.seqs)
    @rule(i=PICK, toks=st.lists(st.integers(0, 1), min_size=1, max_size=6))
    def generate(self, i: int, toks: list[int]) -> None:
        seq = self.seqs[i % len(self.seqs)]
        self._append(seq, toks)

    @precondition(lambda self: self.seqs)
    @rule(toks=st.lists(st.integers(0, 1), min_size=8, max_size=8), publish=st.booleans())
    def decode_step(self, toks: list[int], publish: bool) -> None:
        """The engine's decode step: one more token for every live sequence, as one batch; with
        `publish`, then each table that inserts as the engine does publishes the blocks it filled
        (`KVManager.insert_full_blocks`: the insert starts at the sequence's lease)."""
        tables = [seq.table for seq in self.seqs]
        before, free = self.tree.stats(), self.pool.num_free
        need = blocks_for_one_each(tables)
        try:
            copies = append_one_each(tables)
        except OutOfBlocks:
            assert need > free and self.tree.stats() == before, "a refused decode step changed state"
            return
        assert free - self.pool.num_free <= need
        self._write(tables[0], [], copies, [])  # the copies run before the step writes its tokens
        for k, seq in enumerate(self.seqs):
            tok = toks[k % len(toks)]
            self._write(seq.table, [seq.table.slot(seq.table.num_tokens - 1)], [], [tok])
            seq.tokens.append(tok)
        if publish:
            for seq in self.seqs:
                if seq.table.leased:
                    self._insert_table(seq, seq.table.num_tokens // self.B)

    @precondition(lambda self: self.seqs)
    @rule(i=PICK, draft=st.lists(st.integers(0, 1), min_size=1, max_size=6), accept=st.integers(0, 6))
    def speculate(self, i: int, draft: list[int], accept: int) -> None:
        """Speculative decoding: slots for a draft are appended and written (verification writes every
        draft token's KV), then the rejected tail is dropped (`BlockTable.truncate`): the accepted
        prefix stays, the slots past it go, and no block another holder reads is touched."""
        seq = self.seqs[i % len(self.seqs)]
        before = seq.table.num_tokens
        if seq.table.leased * self.B > before:
            return
        if not self._append(seq, draft):
            return
        keep = before + min(accept, len(draft))
        held = self.pool.num_free
        freed = seq.table.truncate(keep)
        del seq.tokens[keep:]
        assert self.pool.num_free - held == freed
        assert len(seq.table.blocks) == -(-keep // self.B)

    @rule(toks=TOKENS, ns=NAMESPACES, k=st.integers(0, 6))
    def following(self, toks: list[int], ns: str, k: int) -> None:
        """`RadixTree.following`: what the tree holds after `toks` in `ns` alone, read-only."""
        before = self.tree.stats()
        got = self.tree.following(toks, ns, k)
        assert self.tree.stats() == before, "a lookup changed the tree"
        assert len(got) <= k
        paths = [_path_tokens(x) for x in self._nodes_in(ns)]
        ext = tuple(toks) + tuple(got)
        if got:
            assert any(p[: len(ext)] == ext for p in paths), "a draft the tree does not hold"
        elif k:
            assert not any(len(p) > len(toks) and p[: len(toks)] == tuple(toks) for p in paths)
        if 0 < len(got) < k:  # it stopped at the end of a cached path
            assert any(p == ext for p in paths)

    def _nodes_in(self, ns: str) -> list[Node]:
        root = self.tree.store.roots.get(ns)
        out: list[Node] = []
        stack = list(root.children.values()) if root is not None else []
        while stack:
            x = stack.pop()
            out.append(x)
            stack.extend(x.children.values())
        return out

    @precondition(lambda self: self.seqs)
    @rule(i=PICK)
    def insert(self, i: int) -> None:
        """A sequence publishes its full blocks (a table started by ``share_prefix`` holds a reference
        on every block: the tree takes those it adopts and drops the rest)."""
        seq = self.seqs[i % len(self.seqs)]
        if seq.lease_live:  # NOTE: a sequence without a lease inserts nothing (KVManager._insert)
            self._insert_table(seq, seq.table.num_tokens // self.B)

    @precondition(lambda self: self.seqs)
    @rule(i=PICK, lease_first=st.booleans(), twice=st.booleans())
    def finish(self, i: int, lease_first: bool, twice: bool) -> None:
        seq = self.seqs[i % len(self.seqs)]
        self.seqs.remove(seq)
        if lease_first:
            seq.lease.release()
        seq.table.release()
        seq.lease.release()
        if twice:
            seq.table.release()
            seq.lease.release()

    @precondition(lambda self: self.seqs)
    @rule(i=PICK)
    def release_lease_early(self, i: int) -> None:
        seq = self.seqs[i % len(self.seqs)]
        if seq.table.leased:  # NOTE: the lease is what keeps a leased table's blocks alive
            return
        seq.lease.release()
        seq.lease_live, seq.locked = False, 0

    @precondition(lambda self: self.seqs)
    @rule(i=PICK, k=st.integers(1, 3))
    def fork(self, i: int, k: int) -> None:
        seq = self.seqs[i % len(self.seqs)]
        for child in seq.table.fork(k):
            self.seqs.append(Seq(child, list(seq.tokens), seq.namespace, seq.lease.clone(), True, seq.locked))

    @precondition(lambda self: self.seqs)
    @rule(i=PICK, n=st.integers(1, 3))
    def fork_and_diverge(self, i: int, n: int) -> None:
        """Parallel sampling: fork, then parent and child write different tokens (copy-on-write)."""
        seq = self.seqs[i % len(self.seqs)]
        (child_table,) = seq.table.fork(1)
        child = Seq(child_table, list(seq.tokens), seq.namespace, seq.lease.clone(), True, seq.locked)
        self.seqs.append(child)
        self._append(seq, [0] * n)
        self._append(child, [1] * n)

    @rule(n=st.integers(0, 8), count_only=st.booleans())
    def evict(self, n: int, count_only: bool) -> None:
        evictable = self.tree.evictable_blocks()
        free = self.pool.num_free
        if count_only:
            got = self.tree.evict_count(n)
            assert got >= min(n, evictable) and self.pool.num_free == free + got
            return
        freed = self.tree.evict(n)
        assert len(freed) >= min(n, evictable), (len(freed), n, evictable)
        assert all(self.pool.refcount(b) == 0 for b in freed) and self.pool.num_free == free + len(freed)

    @rule(toks=st.lists(st.integers(0, 1), min_size=1, max_size=14), ns=NAMESPACES, n=st.integers(1, 40))
    def engine_cycle(self, toks: list[int], ns: str, n: int) -> None:
        """The engine's own order of calls: match (often empty), compute, insert with that match's
        lease, then memory pressure evicts, then the same prefix is matched again."""
        self.serve(toks, [], ns, finish=False)
        seq = self.seqs[-1]
        free = self.pool.num_free
        evictable = self.tree.evictable_blocks()
        got = self.tree.evict_count(n)
        assert got >= min(n, evictable) and self.pool.num_free == free + got
        m = self.tree.match(tuple(seq.tokens[: seq.locked]), ns)
        assert m.cached_tokens == seq.locked, "pressure evicted a running sequence's leased path"
        m.lease.release()

    def _insert_table(self, seq: Seq, n_blocks: int, final: bool = False) -> None:
        """KVManager's insert: the table's blocks past the leased ones go to the tree, the lease moves
        (``final``: stays, the sequence is released next)."""
        table = seq.table
        if n_blocks <= table.leased:
            return
        n_tokens = min(n_blocks * self.B, table.num_tokens)
        key = encode_tokens(seq.tokens[:n_tokens])
        res = self.tree.insert_table(key, table, n_blocks, seq.namespace, seq.lease, final=final)
        assert res.num_cached_tokens + res.num_new_tokens == n_tokens
        assert table.leased == n_blocks
        assert self.tree.peek(key, seq.namespace) == n_tokens
        if seq.lease_live and not final:
            seq.locked = max(seq.locked, n_tokens)

    @rule(
        toks=TOKENS,
        gen=st.lists(st.integers(0, 1), max_size=5),
        ns=NAMESPACES,
        n=st.integers(0, 40),
        finish=st.booleans(),
    )
    def engine_table_cycle(self, toks: list[int], gen: list[int], ns: str, n: int, finish: bool) -> None:
        """The engine's table protocol (KVManager), call for call: match (often empty), a table started
        from the leased blocks (a partial match copied), prefill and generate, insert the full blocks
        with the match's lease, memory pressure, the same prefix matched again, and on finish every
        computed token inserted (partial block included) before the table and lease are released."""
        t = tuple(toks)
        m = self.tree.match(encode_tokens(t), ns)
        table = BlockTable(self.pool)
        table.lease_prefix(m.block_ids)
        assert table.num_tokens == m.num_tokens and table.leased == len(m.blocks)
        seq = Seq(table, list(t[: m.num_tokens]), ns, m.lease)
        self.seqs.append(seq)
        if m.partial_block is not None:
            try:
                src, dst, k = table.copy_partial(m.partial_block, m.partial_tokens)
            except OutOfBlocks:
                return
            self.content[dst] = list(self.content[src][:k]) + [None] * (self.B - k)
            seq.tokens.extend(t[m.num_tokens : m.num_tokens + k])
        if not self._append(seq, list(t[len(seq.tokens) :])):
            return
        self._append(seq, gen)
        self._insert_table(seq, table.num_tokens // self.B)
        free, evictable = self.pool.num_free, self.tree.evictable_blocks()
        got = self.tree.evict_count(n)
        assert got >= min(n, evictable) and self.pool.num_free == free + got
        again = self.tree.match(encode_tokens(seq.tokens[: seq.locked]), ns)
        assert again.cached_tokens == seq.locked, "pressure evicted a running sequence's leased path"
        again.lease.release()
        if finish:
            self._insert_table(seq, -(-table.num_tokens // self.B), final=True)
            # The lease did not move: what it locked before stays cached under pressure, the rest
            # of the path is evictable at once.
            self.tree.evict_count(n)
            still = self.tree.match(encode_tokens(seq.tokens[: seq.locked]), ns)
            assert still.cached_tokens == seq.locked, "a final insert lost the lease's own path"
            still.lease.release()
            self.seqs.remove(seq)
            table.release()
            seq.lease.release()

    @rule(toks=TOKENS, ns=NAMESPACES)
    def evict_prefix(self, toks: list[int], ns: str) -> None:
        self.tree.evict_prefix(tuple(toks), ns)
        # Nothing unlocked and unpinned that extends the prefix is left.
        for node in iter_nodes(self.tree):
            path = _path_tokens(node)
            if node.hold == 0 and path[: len(toks)] == tuple(toks) and len(path) >= len(toks):
                root = node
                while root.parent is not None:
                    root = root.parent
                assert self.tree.store.roots.get(ns) is not root, "evict_prefix left an extending entry"

    @rule()
    def flush(self) -> None:
        cached = self.tree.num_cached_blocks
        assert self.tree.flush() == cached - self.tree.num_cached_blocks
        assert all(x.hold for x in iter_nodes(self.tree)), "a flush left a node no lease or pin holds"

    @rule(toks=TOKENS, ns=NAMESPACES)
    def pin(self, toks: list[int], ns: str) -> None:
        before = self.tree.stats()
        try:
            n = self.tree.pin(tuple(toks), ns)
        except PinBudgetExceeded:
            assert self.tree.stats().pinned_blocks == before.pinned_blocks
            return
        if n:
            self.pins.add((ns, tuple(toks)))
        assert self.tree.num_pinned_blocks <= self.tree.pin_budget_blocks

    @precondition(lambda self: self.pins)
    @rule(i=PICK)
    def unpin(self, i: int) -> None:
        pins = sorted(self.pins)
        ns, toks = pins[i % len(pins)]
        self.pins.remove((ns, toks))
        self.tree.unpin(toks, ns)

    # ------------------------------------------------------------- invariants
    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "tree"):
            return
        check_consistency(self.tree, [s.table for s in self.seqs])
        s = self.tree.stats()
        assert s.free_blocks + s.evictable_blocks + s.in_use_blocks == s.usable_blocks
        # Ground truth for evictable: blocks only the tree holds, in nodes no lease or pin covers.
        table_blocks = {b for q in self.seqs for b in q.table.blocks}
        truth = sum(
            1
            for node in iter_nodes(self.tree)
            if node.hold == 0
            for b in node.blocks
            if b not in table_blocks
        )
        assert s.evictable_blocks == truth

    @invariant()
    def leased_paths_stay_cached(self) -> None:
        """What a live lease was moved onto by an insert (also an empty match's lease) stays cached."""
        if not hasattr(self, "tree"):
            return
        for q in self.seqs:
            if q.locked:
                got = self.tree.peek(tuple(q.tokens[: q.locked]), q.namespace)
                assert got >= q.locked, f"a leased path lost its cache: {got} of {q.locked} tokens"

    @invariant()
    def events_mirror_the_tree(self) -> None:
        """A router that only reads the events knows exactly what is cached."""
        if not hasattr(self, "tree") or self.tree.listener is None:
            return
        actual: set[tuple[str, tuple[int, ...]]] = set()
        for ns, root in self.tree.store.roots.items():
            stack = list(root.children.values())
            while stack:
                x = stack.pop()
                stack.extend(x.children.values())
                path = _path_tokens(x)
                actual.update((ns, path[:i]) for i in range(1, len(path) + 1))
        assert self.mirror.cached() == actual

    @invariant()
    def contents_match(self) -> None:
        if not hasattr(self, "tree"):
            return
        for q in self.seqs:
            for p, tok in enumerate(q.tokens[: q.table.num_tokens]):
                blk = q.table.blocks[p // self.B]
                assert self.content[blk][p % self.B] == tok, "a sequence's KV was overwritten"
        for node in iter_nodes(self.tree):
            for i, b in enumerate(node.blocks):
                want = token_ids(node.tokens)[i * self.B : (i + 1) * self.B]
                assert self.content[b][: len(want)] == want, "a cached block's KV was overwritten"

    def teardown(self) -> None:
        if not hasattr(self, "tree"):
            return
        for q in self.seqs:
            q.table.release()
            q.lease.release()
        for ns, toks in self.pins:
            self.tree.unpin(toks, ns)
        assert self.tree.num_leases == 0, "a lease leaked"
        self.tree.flush()
        assert self.pool.num_free == self.pool.num_usable, "blocks leaked after all requests and a flush"


RadixMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("RADIX_SM_EXAMPLES", "2000")),
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRadixStateMachine = RadixMachine.TestCase


def test_following_passes_over_a_partial_leaf_that_holds_only_the_query() -> None:
    """The case the machine found: a partial-block leaf spelling exactly the query beside a sibling
    that goes on; `following` must draft from the sibling."""
    m = RadixMachine()
    m.setup(block_size=2, num_blocks=6, listen=False)
    m.new_request(ns="", toks=[])
    m.finish(i=0, lease_first=False, twice=False)
    m.insert_donated(ns="tenant-b", toks=[1])
    m.serve(finish=False, gen=[0], ns="tenant-b", toks=[1])
    m.serve(finish=False, gen=[], ns="tenant-b", toks=[1])
    m.following(k=1, ns="tenant-b", toks=[1])
    m.teardown()
