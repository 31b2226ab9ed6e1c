"""The radix tree's administration: evicting by prefix, flushing, pins.

Functions over one :class:`radixd.radix.tree.RadixTree` (its helpers, not a public API); the tree's
``evict_prefix``, ``flush``, ``pin`` and ``unpin`` call them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixd.radix.errors import NotPinned, PinBudgetExceeded
from radixd.radix.lru import LruIndex
from radixd.radix.node import TOKEN_BYTES, Node, Tokens, common_prefix_bytes, token_ids
from radixd.radix.tree_nodes import depth_tokens, remove_leaf, split

if TYPE_CHECKING:
    from radixd.radix.events import CacheListener
    from radixd.radix.tree import RadixTree


def subtrees_with_prefix(tree: RadixTree, root: Node, t: Tokens) -> list[Node]:
    """The topmost nodes whose paths start with ``t`` (the whole namespace for an empty ``t``)."""
    B = tree._bb
    node = root
    pos = 0
    n = len(t)
    while pos < n:
        rem = n - pos
        if rem >= B:
            child = node.children.get(t[pos : pos + B])
            if child is None:
                return []
            L = len(child.tokens)
            if rem <= L:
                return [child] if child.tokens[:rem] == t[pos:] else []
            if L % B or child.tokens != t[pos : pos + L]:
                return []
            node = child
            pos += L
        else:
            by_first = node.by_first
            cands = by_first.get(t[pos : pos + TOKEN_BYTES], []) if by_first is not None else []
            return [c for c in cands if c.tokens[:rem] == t[pos:]]
    return list(node.children.values()) if node.parent is None else [node]


def evict_subtree(tree: RadixTree, top: Node, reason: str) -> None:
    """Remove every node under ``top`` (``top`` included) that no lease or pin holds."""
    order: list[Node] = []
    stack = [top]
    while stack:
        x = stack.pop()
        if x.hold == 0:
            order.append(x)
        stack.extend(x.children.values())
    runs: list[tuple[int, int]] = []  # freed together, merged where adjacent
    for x in reversed(order):  # children before their parents
        if x.alive and not x.children and x.hold == 0:
            remove_leaf(tree, x, reason, None, pending=runs)
    if runs:
        tree.pool.release_runs(runs)


def evict_lru(tree: RadixTree, n_blocks: int, freed: list[int] | None, reason: str = "lru") -> int:
    """Remove least recently used leaves until ``n_blocks`` blocks are free or none is evictable.

    Evicting a leaf can make its parent a leaf, which joins the LRU index (the cascade).
    """
    got = 0
    pop_oldest = tree._lru.pop_oldest
    runs: list[tuple[int, int]] = []  # freed together, merged where adjacent
    while got < n_blocks:
        node = pop_oldest()
        if node is None:
            break
        got += remove_leaf(tree, node, reason, freed, pending=runs)
    if runs:
        tree.pool.release_runs(runs)
    return got


def drop_all(tree: RadixTree) -> None:
    """Drop every node, held or not; outstanding leases become inert (the epoch moves on)."""
    pool = tree.pool
    dropped = 0
    for root in tree._roots.values():
        stack = list(root.children.values())
        while stack:
            x = stack.pop()
            stack.extend(x.children.values())
            # NOTE: a held node's solo blocks are not counted as evictable; disown must not take them
            # off that count again.
            hold, x.hold = x.hold, 0
            if hold:
                pool.owner_unheld(x)
            dropped += len(x.blocks)
            pool.disown(x, x.blocks, None, None, None)
            x.alive = False
            x.in_lru = False
    tree._evicted["flush"] += dropped
    tree._roots.clear()
    tree._lru = LruIndex()
    tree._pins.clear()
    tree._nodes = tree._cached_blocks = tree._pinned_blocks = tree._leases = 0
    tree._epoch += 1
    if tree.listener is not None:
        tree.listener.cleared()


def pin(tree: RadixTree, t: Tokens, namespace: str) -> int:
    """See :meth:`RadixTree.pin` (``t`` packed)."""
    key = (namespace, t)
    done = tree._pins.get(key)
    if done is not None:
        return depth_tokens(done)
    root = tree._roots.get(namespace)
    if root is None:
        return 0
    node = _pin_target(tree, root, t)
    if node is None:
        return 0
    add = 0
    x: Node | None = node
    while x is not None and x.parent is not None:
        if x.pin == 0:
            add += len(x.blocks)
        x = x.parent
    if tree._pinned_blocks + add > tree.pin_budget_blocks:
        raise PinBudgetExceeded(
            f"pinning {add} more blocks would exceed the pin budget: {tree._pinned_blocks} of "
            f"{tree.pin_budget_blocks} already pinned; unpin something or raise pin_budget_fraction"
        )
    pool = tree.pool
    x = node
    while x is not None and x.parent is not None:
        x.pin += 1
        x.hold += 1
        if x.pin == 1:
            tree._pinned_blocks += len(x.blocks)
        if x.hold == 1:
            pool.owner_held(x)
            tree._lru.discard(x)
        x = x.parent
    tree._pins[key] = node
    return depth_tokens(node)


def _pin_target(tree: RadixTree, root: Node, t: Tokens) -> Node | None:
    """Deepest node fully covered by ``t`` (splitting at a block boundary when ``t`` ends inside)."""
    B = tree._bb
    node = root
    pos = 0
    n = len(t)
    while pos < n:
        child = node.children.get(t[pos : pos + B]) if pos + B <= n else node.children.get(t[pos:])
        if child is None:
            break
        L = len(child.tokens)
        if t[pos : pos + L] == child.tokens:
            node = child
            pos += L
            if L % B:
                break
            continue
        k = common_prefix_bytes(t, pos, child.tokens) // B
        if k >= 1:
            node = split(tree, child, k)
        break
    return node if node.parent is not None else None


def unpin(tree: RadixTree, t: Tokens, namespace: str) -> int:
    """See :meth:`RadixTree.unpin` (``t`` packed)."""
    node = tree._pins.pop((namespace, t), None)
    if node is None:
        raise NotPinned(
            f"no pin for these {len(t) // TOKEN_BYTES} tokens in namespace {namespace!r}; "
            "unpin takes the same tokens that were pinned"
        )
    pool = tree.pool
    x: Node | None = node
    while x is not None and x.parent is not None:
        x.pin -= 1
        x.hold -= 1
        if x.pin == 0:
            tree._pinned_blocks -= len(x.blocks)
        if x.hold == 0:
            pool.owner_unheld(x)
            if not x.children:
                tree._lru.add(x)
        x = x.parent
    return depth_tokens(node)


def replay(tree: RadixTree, listener: CacheListener) -> int:
    """See :meth:`RadixTree.replay`."""
    count = 0
    for ns, root in tree._roots.items():
        stack: list[tuple[Node, bytes]] = [(c, bytes(root.tokens)) for c in reversed(root.children.values())]
        while stack:
            x, above = stack.pop()
            path = above + bytes(x.tokens)
            listener.stored(ns, token_ids(path), len(above) // TOKEN_BYTES, len(x.blocks))
            count += 1
            stack.extend((c, path) for c in reversed(x.children.values()))
    return count
