"""Full consistency check of pool + tree (+ tables): O(everything), for tests and debugging only."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import NoReturn

from radixd.radix.errors import RadixError
from radixd.radix.node import TOKEN_BYTES, Node
from radixd.radix.sliding import SlidingTable
from radixd.radix.table import BlockTable
from radixd.radix.tree import RadixTree
from radixd.radix.windows import WindowStore
from radixd.radix.words import NULL_BLOCK


class InvariantViolation(RadixError):
    """An internal invariant does not hold (a bug in radixd.radix or in how it is driven)."""


def _fail(msg: str) -> NoReturn:
    raise InvariantViolation(msg)


def iter_nodes(tree: RadixTree) -> Iterable[Node]:
    """Every live non-root node, parents before children."""
    return tree.store.nodes()


def check_consistency(
    tree: RadixTree,
    tables: Iterable[BlockTable] = (),
    sliding: Iterable[SlidingTable] = (),
    windows: WindowStore | None = None,
) -> None:
    """Raise InvariantViolation unless every documented invariant holds (with ``tables``, all live
    tables, also refcount == holders for every block; with sliding layers, their live ``sliding`` tables
    and the ``windows`` the cache keeps count as holders too)."""
    pool = tree.pool
    store = tree.store
    B = store.block_bytes  # node offsets are in packed bytes
    rc = pool.refcounts()
    owner_ids = pool.owner_ids()
    problem = pool.free_extents_problem()
    if problem is not None:
        _fail(problem)
    if rc[NULL_BLOCK] != 0:
        _fail("the null block was handed out or freed")
    n_free = 0
    for a, k in pool.free_extents():
        n_free += k
        for b in range(a, a + k):
            if rc[b] != 0:
                _fail(f"free block {b} has refcount {rc[b]}")
    allocated = sum(1 for b in range(1, pool.num_blocks) if rc[b] > 0)
    if allocated + n_free != pool.num_usable:
        _fail(f"{allocated} allocated + {n_free} free != {pool.num_usable} usable blocks")

    tree_refs: Counter[int] = Counter()
    evictable = nodes = pinned = lru_members = 0
    ticks: set[int] = set()
    for ns, root in store.roots.items():
        if root.parent is not None or root.tokens or root.blocks or root.end:
            _fail(f"root of namespace {ns!r} is malformed")
        if not root.children:
            _fail(f"empty root of namespace {ns!r} was kept")
    for x in iter_nodes(tree):
        nodes += 1
        p = x.parent
        if p is None or p.children.get(x.key) is not x or not x.alive:
            _fail(f"{x} is not linked under its parent by its key")
        if x.key != x.tokens[:B] or not x.tokens:
            _fail(f"{x}: key is not its first block")
        if len(x.blocks) != -(-len(x.tokens) // B):
            _fail(f"{x}: {len(x.blocks)} blocks for {len(x.tokens) // TOKEN_BYTES} tokens")
        if x.end != p.end + len(x.tokens):
            _fail(f"{x}: its path ends at byte {x.end}, not {p.end + len(x.tokens)}")
        if len(x.tokens) % B and x.children:
            _fail(f"{x}: a node ending in a partial block has children")
        if tree.block_size > 1 and (p.by_first is None or x not in p.by_first.get(x.key[:TOKEN_BYTES], [])):
            _fail(f"{x}: missing from parent's first-token index")
        if p.parent is not None and (x.hold > p.hold or x.pin > p.pin):
            _fail(f"{x}: holds more than its parent")
        if x.pin > x.hold or x.pin < 0:
            _fail(f"{x}: pin {x.pin} vs hold {x.hold}")
        if x.runs is not None and [b for a, k in x.runs for b in range(a, a + k)] != x.blocks.tolist():
            _fail(f"{x}: cached runs {x.runs} do not spell out its blocks")
        solo = 0
        for b in x.blocks:
            tree_refs[b] += 1
            if owner_ids[b] == 0 or tree.ownership.owner_by_id(owner_ids[b]) is not x:
                _fail(f"block {b} of {x} is not owned by it")
            if rc[b] == 1:
                solo += 1
        if solo != x.n_solo:
            _fail(f"{x}: n_solo {x.n_solo} but {solo} blocks have refcount 1")
        if x.hold == 0:
            evictable += solo
        if x.pin:
            pinned += len(x.blocks)
        want_lru = not x.children and x.hold == 0
        if x.in_lru != want_lru:
            _fail(f"{x}: in_lru={x.in_lru} but evictable leaf={want_lru}")
        if x.in_lru:
            lru_members += 1
            if x.tick in ticks:
                _fail(f"tick {x.tick} used twice in the LRU index")
            ticks.add(x.tick)
            if x not in store.lru:
                _fail(f"{x} missing from the LRU index")
        if x.by_first is not None:
            n_idx = sum(len(v) for v in x.by_first.values())
            if n_idx != len(x.children):
                _fail(f"{x}: first-token index has {n_idx} entries for {len(x.children)} children")
    for b in range(pool.num_blocks):
        if owner_ids[b] != 0 and tree_refs[b] == 0:
            _fail(f"block {b} has a stale owner")
        if tree_refs[b] > 1:
            _fail(f"block {b} is stored in {tree_refs[b]} tree positions")
    lru = store.lru
    if len(lru) != lru_members:
        _fail(f"LRU index has {len(lru)} entries, {lru_members} evictable leaves exist")
    if not lru.in_order():
        _fail("the LRU index's ordered ticks differ from its nodes")

    if evictable != pool.num_evictable:
        _fail(f"pool counts {pool.num_evictable} evictable blocks, the tree holds {evictable}")
    if tree.ownership.num_owners != nodes:
        _fail(f"{tree.ownership.num_owners} registered block owners for {nodes} nodes")
    if nodes != store.num_nodes or sum(tree_refs.values()) != store.num_cached_blocks:
        _fail("node or cached-block counter is off")
    if pinned != tree.num_pinned_blocks:
        _fail(f"pinned counter {tree.num_pinned_blocks} != {pinned}")
    if pool.num_free + pool.num_evictable + pool.num_in_use != pool.num_usable or pool.num_in_use < 0:
        _fail("free + evictable + in_use != usable")

    tables = list(tables)
    sliding = list(sliding)
    if tables or sliding or windows is not None:
        holders = Counter(tree_refs)
        for st in sliding:
            _check_sliding(st, tree.block_size)
            for ids in st.pages:
                holders.update(ids[st.lo :])
        for _key, w in windows or ():
            for ids in w.pages:
                holders.update(ids)
        for t in tables:
            # NOTE: a table holds no reference on its leased blocks: its owner's lease keeps them cached.
            holders.update(t.blocks[t.leased :])
            if not 0 <= t.leased <= len(t.blocks) or any(rc[b] < 1 for b in t.blocks[: t.leased]):
                _fail(f"{t}: a leased block is not held by the tree")
            if len(t.blocks) != -(-t.num_tokens // tree.block_size):
                _fail(f"{t}: {len(t.blocks)} blocks for {t.num_tokens} tokens")
        for b in range(1, pool.num_blocks):
            if rc[b] != holders[b]:
                _fail(f"block {b}: refcount {rc[b]} but {holders[b]} holders")


def _check_sliding(t: SlidingTable, block_size: int) -> None:
    n = -(-t.num_tokens // block_size)
    if len(t.pages) != t.groups or any(len(ids) != n for ids in t.pages):
        _fail(f"{t}: page groups do not each cover {n} positions")
    if not 0 <= t.lo <= n:
        _fail(f"{t}: released up to {t.lo} of {n} positions")
    for ids in t.pages:
        if any(ids[: t.lo]) or not all(ids[t.lo :]):
            _fail(f"{t}: released entries must be 0 and held ones not")
