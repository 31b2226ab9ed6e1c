"""The radix tree's two walks: looking a key up (``match``, ``peek``) and caching one (``insert``).

Functions over one :class:`radixd.radix.tree.RadixTree` (its helpers, not a public API). Offsets are in
packed bytes (``tree._bb`` per block).
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from radixd.radix.blockids import EMPTY, ID_BYTES, BlockIds
from radixd.radix.errors import InvalidRequest
from radixd.radix.node import TOKEN_BYTES, Node, Tokens, common_prefix_bytes
from radixd.radix.tree_nodes import add_leaf, drop_root, remove_leaf, split, touch

if TYPE_CHECKING:
    from radixd.radix.table import BlockTable
    from radixd.radix.tree import RadixTree


def _joined(parts: list[bytes]) -> BlockIds:
    """The packed blocks of a matched path (usually one node's own BlockIds, shared as is)."""
    if len(parts) == 1 and type(parts[0]) is BlockIds:
        return parts[0]
    return BlockIds(b"".join(parts)) if parts else EMPTY


def _differing(mine: bytes, start: int, node_blocks: bytes, lo: int, hi: int) -> list[int]:
    """The caller's ids (packed ``mine``, from id ``start`` on) that differ from ``node_blocks[lo:hi]``."""
    theirs = bytes.__getitem__(node_blocks, slice(lo * ID_BYTES, hi * ID_BYTES))
    if mine.startswith(theirs, start * ID_BYTES):  # the tree's own blocks (the usual case): one memcmp
        return []
    a = array("i", bytes.__getitem__(mine, slice(start * ID_BYTES, (start + hi - lo) * ID_BYTES)))
    return [x for x, y in zip(a, array("i", theirs), strict=True) if x != y]


def walk(
    tree: RadixTree, t: Tokens, namespace: str, touch_nodes: bool
) -> tuple[Node | None, BlockIds, int | None, int]:
    """(deepest node used or None, full blocks, partial block, partial tokens) of key ``t``."""
    parts: list[bytes] = []
    node = tree._roots.get(namespace)
    if node is None:
        return None, EMPTY, None, 0
    B = tree._bb
    n = len(t)
    pos = 0
    clock = tree._clock
    lru = tree._lru
    while pos + B <= n:
        child = node.children.get(t[pos : pos + B])
        if child is None:
            break
        if touch_nodes:
            # Every touched node ends up on the leased path, so it leaves the LRU index anyway.
            if child.in_lru:
                lru.discard(child)
            clock += 1
            child.tick = clock
        ct = child.tokens
        L = len(ct)
        if not L % B and t.startswith(ct, pos):  # compares in place, no slice copy
            parts.append(child.blocks)
            pos += L
            node = child
            continue
        # The query leaves this node inside it (or covers its partial last block).
        m = common_prefix_bytes(t, pos, ct)
        k = m // B
        if k:
            parts.append(bytes.__getitem__(child.blocks, slice(0, k * ID_BYTES)))
        tree._clock = clock
        r = (m - k * B) // TOKEN_BYTES
        return child, _joined(parts), (child.blocks[k] if r else None), r
    tree._clock = clock
    by_first = node.by_first
    if by_first and t[pos : pos + TOKEN_BYTES] in by_first:  # a child may share part of a block
        best, best_len = _best_partial(tree, node, t, pos)
        if best is not None:
            if touch_nodes:
                lru.discard(best)
                tree._clock += 1
                best.tick = tree._clock
            return best, _joined(parts), best.blocks[0], best_len
    return (node if node.parent is not None else None), (_joined(parts) if parts else EMPTY), None, 0


def _best_partial(tree: RadixTree, node: Node, t: Tokens, pos: int) -> tuple[Node | None, int]:
    """The child whose first block shares the longest (partial) prefix with t[pos:pos+B]."""
    by_first = node.by_first
    cands = by_first.get(t[pos : pos + TOKEN_BYTES]) if by_first is not None else None
    best: Node | None = None
    best_len = 0
    if cands:
        q = t[pos : pos + tree._bb]
        for c in cands:
            m = common_prefix_bytes(q, 0, c.key)
            if m > best_len:
                best, best_len = c, m
    return best, best_len // TOKEN_BYTES


def insert(
    tree: RadixTree,
    t: Tokens,
    bl: bytes,
    namespace: str,
    cached: int,
    donate: bool,
    start: Node | None = None,
) -> tuple[Node, list[int], int]:
    """Cache key ``t`` (non-empty) with packed blocks ``bl`` after ``cached`` of the tree's own blocks.

    Returns (the node where ``t`` ends, the caller's duplicate blocks, tokens newly cached). See
    :meth:`RadixTree.insert`; the caller checked the block count. ``start``: a live node whose path
    spells ``t``'s first ``cached`` blocks (a lease's, see :func:`continues`); the walk starts there
    instead of at the root, and the nodes above it are not touched.
    """
    B = tree._bb
    n = len(t)
    nb = -(-n // B)
    c = cached  # positions from c on hold the caller's blocks (bl[i] is the block of position c + i)
    root = tree._roots.get(namespace)
    if root is None:
        root = tree._roots[namespace] = Node(b"", EMPTY, None, b"", 0)
    node = root if start is None else start
    dups: list[int] = []
    j = 0 if start is None else c
    nf = n // B
    clock = tree._clock
    while j < nf:
        pos = j * B
        child = node.children.get(t[pos : pos + B])
        if child is None:
            break
        clock += 1
        if child.in_lru:
            touch(tree, child, clock)
        else:
            child.tick = clock
        ct = child.tokens
        cb = child.blocks
        L = len(ct)
        if not L % B and t.startswith(ct, pos):  # compares in place, no slice copy
            k = bytes.__len__(cb) // ID_BYTES
            # Where the caller gave blocks, are they the tree's own? Others are duplicates.
            if j >= c:
                if not bl.startswith(cb, (j - c) * ID_BYTES):
                    dups += _differing(bl, j - c, cb, 0, k)
            elif j + k > c:
                dups += _differing(bl, 0, cb, c - j, k)
            j += k
            node = child
            continue
        k = common_prefix_bytes(t, pos, ct) // B  # >= 1: the first block matched as a key
        if j + k < c:  # the cached prefix would end inside this node: reported below, nothing split
            j += k
            break
        if j + k > c:
            lo = max(c - j, 0)
            dups += _differing(bl, j + lo - c, cb, lo, k)
        node = split(tree, child, k)
        j += k
        break
    tree._clock = clock
    if j < c:
        if not root.children:
            drop_root(tree, root)  # created for this insert only
        raise InvalidRequest(
            f"insert(cached={c}): only {j} leading blocks of these tokens are cached; hold the match's "
            "lease until the insert, or pass the blocks of every position"
        )
    if j == nb:
        return node, dups, 0
    rest = t[j * B :]
    # A BlockIds is immutable: when it is all new, the node can share the caller's object.
    rest_blocks = bl if j == c and type(bl) is BlockIds else BlockIds(memoryview(bl)[(j - c) * ID_BYTES :])
    by_first = node.by_first
    if by_first is not None and rest[:TOKEN_BYTES] in by_first:  # else no sibling can overlap
        covered = _settle_partial(tree, node, rest, rest_blocks, dups)
        if covered is not None:
            return covered, dups, 0
    return add_leaf(tree, node, rest, rest_blocks, donate), dups, len(rest) // TOKEN_BYTES


def continues(tree: RadixTree, node: Node | None, t: Tokens, cached: int) -> bool:
    """Whether ``node`` (a lease's) ends exactly after ``t``'s first ``cached`` blocks and its own edge
    spells them, so an insert of ``t`` may start there (:func:`insert`'s ``start``).

    NOTE: the edge compare (one memcmp) stands in for the walk from the root: the lease keeps the
    path alive and in place (a split keeps the lower node, and its end), so a path that ends in the
    right place with the right last edge is the caller's, short of a caller that changed earlier tokens.
    """
    if node is None or not node.alive or node.end != cached * tree._bb:
        return False
    return t.startswith(node.tokens, node.end - bytes.__len__(node.tokens))


def _settle_partial(
    tree: RadixTree, node: Node, rest: Tokens, rest_blocks: BlockIds, dups: list[int]
) -> Node | None:
    """Resolve partial-block overlaps between ``rest`` and ``node``'s children.

    Returns the child that already covers ``rest`` (``rest`` is a single partial block whose tokens
    begin a cached block) after recording the duplicate; otherwise drops unleased single-block partial
    leaves that ``rest`` supersedes and returns None (the caller adds ``rest`` as a leaf).
    """
    by_first = node.by_first
    cands = by_first.get(rest[:TOKEN_BYTES]) if by_first is not None else None
    if not cands:
        return None
    first = rest[: tree._bb]
    lf = len(first)
    for c in list(cands):
        key = c.key
        if len(key) >= lf:
            if lf < tree._bb and key[:lf] == first:
                if rest_blocks[0] != c.blocks[0]:
                    dups.append(rest_blocks[0])
                tree._clock += 1
                touch(tree, c, tree._clock)
                return c
        elif first[: len(key)] == key and c.hold == 0:
            # c is a one-block partial leaf whose tokens are a prefix of ours: ours supersedes it.
            remove_leaf(tree, c, "superseded", None, keep_root=True)
    return None


def check_fit(tree: RadixTree, n: int, got: int, cached: int) -> None:
    """Raise InvalidRequest unless ``got`` blocks after ``cached`` of the tree's own hold exactly the
    ``n`` key bytes (the one rule for ``insert`` and ``insert_table``)."""
    bb = tree._bb
    if got != -(-n // bb) - cached or not 0 <= cached <= n // bb:
        raise bad_insert(tree.block_size, n, got, cached)


def bad_insert(block_size: int, n: int, got: int, cached: int) -> InvalidRequest:
    """The error for an insert whose block count (or ``cached``) does not fit its ``n`` key bytes."""
    nt, bs = n // TOKEN_BYTES, block_size
    if not 0 <= cached <= nt // bs:
        return InvalidRequest(
            f"insert(cached={cached}) must be within [0, {nt // bs}]: the full blocks of {nt} tokens"
        )
    need = (
        f"ceil({nt}/{bs}) - {cached} = {-(-nt // bs) - cached} blocks"
        if cached
        else f"ceil({nt}/{bs}) = {-(-nt // bs)} blocks"
    )
    return InvalidRequest(f"insert of {nt} tokens needs {need}, got {got}")


def settle_known(
    tree: RadixTree, t: Tokens, table: BlockTable, done: int, known: int, namespace: str, dups: list[int]
) -> None:
    """After ``insert_table``: blocks ``done..known`` of ``table`` sat at positions the tree had cached.

    Where the tree holds this very block (a fork inserted it first) the donation left the table's
    reference with the table: drop it. Where it holds another block, the tree released ours (a
    duplicate), and the table reads the tree's block instead.
    """
    dup = set(dups)
    for i in range(done, known):
        if table.blocks[i] not in dup:
            tree.pool.decref(table.blocks[i])
    if dup:
        full, partial = tree.lookup(bytes.__getitem__(t, slice(0, known * tree._bb)), namespace)
        theirs = full.tolist() + ([partial] if partial is not None else [])
        table.blocks[done:known] = array("i", theirs[done:known])
