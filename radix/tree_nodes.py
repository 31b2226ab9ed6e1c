"""The radix tree's structural steps: add, split and remove nodes, lock and unlock paths.

Functions over one :class:`radixd.radix.tree.RadixTree` (its helpers, not a public API): every change of
the tree's shape goes through here, and every change of block ownership through the pool's methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixd.radix.blockids import ID_BYTES, BlockIds
from radixd.radix.errors import RadixError
from radixd.radix.node import TOKEN_BYTES, Node, Tokens, split_runs, token_ids

if TYPE_CHECKING:
    from radixd.radix.tree import RadixTree


def touch(tree: RadixTree, node: Node, tick: int) -> None:
    """Give ``node`` a new last-use tick, moving it within the LRU index if it is there."""
    if node.in_lru:
        tree._lru.discard(node)
        node.tick = tick
        tree._lru.add(node)
    else:
        node.tick = tick


# The first-token index of a node's children (kept when block_size > 1) finds the sibling that shares
# the longest partial first block without scanning every child.
def index_first(parent: Node, child: Node) -> None:
    by_first = parent.by_first
    if by_first is None:
        by_first = parent.by_first = {}
    first = child.key[:TOKEN_BYTES]
    lst = by_first.get(first)
    if lst is None:
        by_first[first] = [child]
    else:
        lst.append(child)


def unindex_first(parent: Node, child: Node) -> None:
    by_first = parent.by_first
    if by_first is not None:
        first = child.key[:TOKEN_BYTES]
        lst = by_first[first]
        if len(lst) == 1:
            del by_first[first]
        else:
            lst.remove(child)


def add_leaf(tree: RadixTree, parent: Node, tokens: Tokens, blocks: BlockIds, donate: bool) -> Node:
    """A new leaf under ``parent`` holding ``tokens`` in ``blocks``; the pool makes it their owner.

    A bad block raises (from the pool) with nothing changed, dropping ``parent`` if it is a root that
    was created for this insert only.
    """
    pool = tree.pool
    clock = tree._clock = tree._clock + 1
    leaf = Node(tokens, blocks, parent, tokens[: tree._bb], clock)
    try:
        leaf.runs = pool.adopt(leaf, blocks, donate)
    except RadixError:
        if parent.parent is None and not parent.children:
            drop_root(tree, parent)
        raise
    if parent.in_lru:  # no longer a leaf
        tree._lru.discard(parent)
    parent.children[leaf.key] = leaf
    if tree.block_size > 1:
        index_first(parent, leaf)
    n = bytes.__len__(blocks) // ID_BYTES
    tree._nodes += 1
    tree._cached_blocks += n
    tree._lru.add(leaf)
    if tree.listener is not None:
        ns, path = path_of(tree, leaf)
        tree.listener.stored(ns, path, len(path) - len(tokens) // TOKEN_BYTES, n)
    return leaf


def split(tree: RadixTree, child: Node, k: int) -> Node:
    """Split ``child`` after its first ``k`` blocks; returns the new upper node.

    The lower part keeps the node's identity, so leases and pins that end at it stay valid and keep
    covering the whole path (the upper part inherits their hold and pin counts).
    """
    B = tree._bb
    parent = child.parent
    if parent is None or not 0 < k < len(child.blocks):
        raise RadixError(f"internal: cannot split a node of {len(child.blocks)} blocks at {k}")
    ct = child.tokens
    cb = memoryview(child.blocks)
    upper = Node(ct[: k * B], BlockIds(cb[: k * ID_BYTES]), parent, child.key, child.tick)
    tree._clock += 1
    touch(tree, child, tree._clock)  # keep ticks unique: the upper part took the old one
    # Re-seat: same key in the parent, so replace in place.
    parent.children[upper.key] = upper
    if parent.by_first is not None:
        lst = parent.by_first[upper.key[:TOKEN_BYTES]]
        lst[lst.index(child)] = upper
    child.tokens = ct[k * B :]
    child.blocks = BlockIds(cb[k * ID_BYTES :])
    if child.runs is not None:
        upper.runs, child.runs = split_runs(child.runs, k)
    child.key = child.tokens[:B]
    child.parent = upper
    upper.children[child.key] = child
    if tree.block_size > 1:
        upper.by_first = {child.key[:TOKEN_BYTES]: [child]}
    upper.hold = child.hold
    upper.pin = child.pin
    tree.pool.split_owner(upper, upper.blocks, upper.runs, child)
    tree._nodes += 1
    return upper


def remove_leaf(
    tree: RadixTree,
    node: Node,
    reason: str,
    freed: list[int] | None,
    keep_root: bool = False,
    pending: list[tuple[int, int]] | None = None,
) -> int:
    """Drop a leaf and its tree references; returns how many of its blocks became free.

    ``freed`` and ``pending`` are those of :meth:`BlockPool.disown`: the ids that became free, and
    runs left for the caller to free together (``pool.release_runs``).
    """
    parent = node.parent
    if parent is None or node.children:
        raise RadixError("internal: only a leaf can be removed")
    blocks = node.blocks
    n = bytes.__len__(blocks) // ID_BYTES
    if tree.listener is not None:
        ns, path = path_of(tree, node)
        start = len(path) - len(node.tokens) // TOKEN_BYTES
        tree.listener.removed(ns, path, start, n, reason)
    del parent.children[node.key]
    if parent.by_first is not None:
        unindex_first(parent, node)
    if node.in_lru:
        tree._lru.discard(node)
    n_freed = tree.pool.disown(node, blocks, node.runs, freed, pending)
    node.alive = False
    tree._nodes -= 1
    tree._cached_blocks -= n
    tree._evicted[reason] += n
    if parent.parent is not None:
        if not parent.children and parent.hold == 0:
            tree._lru.add(parent)
    elif not parent.children and not keep_root:
        drop_root(tree, parent)
    return n_freed


def drop_root(tree: RadixTree, root: Node) -> None:
    for ns, r in tree._roots.items():
        if r is root:
            del tree._roots[ns]
            return


def path_of(tree: RadixTree, node: Node) -> tuple[str, list[int]]:
    """The namespace and the token path from the root to the end of ``node`` (for listeners)."""
    parts: list[bytes] = []
    x: Node | None = node
    root = node
    while x is not None:
        parts.append(bytes(x.tokens))
        root = x
        x = x.parent
    ns = next((name for name, r in tree._roots.items() if r is root), "")
    return ns, token_ids(b"".join(reversed(parts)))


def lock_path(tree: RadixTree, node: Node) -> None:
    """One more hold on ``node`` and its ancestors: none of them is evictable while it lasts."""
    _lock_up_to(tree, node, None)


def move_lock(tree: RadixTree, old: Node, new: Node) -> None:
    """Move one hold from ``old``'s path to ``new``'s (a lease following its owner's inserts).

    NOTE: when ``old`` is an ancestor of ``new`` (a decoding sequence's lease moving onto the block it
    just filled) the path above ``old`` keeps its hold: only the nodes below it gain one, so the move
    costs the nodes added, not the path's depth (which grows by one node per block inserted).
    """
    if not _lock_up_to(tree, new, old):
        unlock_path(tree, old)


def _lock_up_to(tree: RadixTree, node: Node, stop: Node | None) -> bool:
    """One more hold on ``node`` and its ancestors below ``stop``; -> whether the walk met ``stop``."""
    pool = tree.pool
    x: Node | None = node
    while x is not None and x.parent is not None:
        if x is stop:
            return True
        x.hold += 1
        if x.hold == 1:
            pool.owner_held(x)
            if x.in_lru:
                tree._lru.discard(x)
        x = x.parent
    return False


def unlock_path(tree: RadixTree, node: Node) -> None:
    """Undo one :func:`lock_path`; leaves whose last hold went become evictable again."""
    pool = tree.pool
    x: Node | None = node
    while x is not None and x.parent is not None:
        x.hold -= 1
        if x.hold == 0:
            pool.owner_unheld(x)
            if not x.children:
                tree._lru.add(x)
        x = x.parent


def depth_tokens(node: Node) -> int:
    """Tokens on the path from the root to the end of ``node``."""
    total = 0
    x: Node | None = node
    while x is not None:
        total += len(x.tokens)
        x = x.parent
    return total // TOKEN_BYTES
