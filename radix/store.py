"""NodeStore: the radix tree's nodes, with the state that changes whenever one does.

Roots (one per namespace), the LRU index, the counts of nodes, cached and evicted blocks, and the
listener. Every change of the tree's shape goes through it; :meth:`NodeStore.descend` is the one walk.
"""

from __future__ import annotations

from collections.abc import Iterator

from radixd.radix.blockids import EMPTY, ID_BYTES, BlockIds
from radixd.radix.errors import RadixError
from radixd.radix.events import CacheListener
from radixd.radix.lru import LruIndex
from radixd.radix.node import TOKEN_BYTES, Node, Tokens, common_prefix_bytes, split_runs, token_ids
from radixd.radix.ownership import CacheOwnership

EVICT_REASONS = ("lru", "prefix", "flush", "superseded")


class NodeStore:
    """The nodes of one tree and their LRU order (not thread-safe: the tree's owner drives it)."""

    def __init__(self, ownership: CacheOwnership, block_size: int) -> None:
        self.ownership = ownership
        self.block_size = block_size
        self.block_bytes = block_size * TOKEN_BYTES  # a block's tokens, in packed bytes
        self.roots: dict[str, Node] = {}  # read by all; changed only here
        self.lru = LruIndex()  # and the clock that gives ticks
        self.num_nodes = 0
        self.num_cached_blocks = 0
        self.evicted = dict.fromkeys(EVICT_REASONS, 0)
        # Observer of content changes (see radix/events.py); None costs one test per leaf added/removed.
        self.listener: CacheListener | None = None

    # ================================================================== lookup
    def root_for_insert(self, namespace: str) -> Node:
        """The namespace's root, created if missing (an insert that fails drops it again)."""
        root = self.roots.get(namespace)
        if root is None:
            root = self.roots[namespace] = Node(b"", EMPTY, None, b"", 0)
        return root

    def descend(self, t: Tokens, node: Node) -> tuple[list[Node], Node | None, int]:
        """Follow key ``t`` down from ``node`` by whole blocks, changing nothing; -> (the nodes whose whole
        edge ``t`` spells, the child whose edge ``t`` leaves inside or None, the bytes ``t`` shares there)."""
        B = self.block_bytes
        n = len(t)
        pos = node.end
        path: list[Node] = []
        while pos + B <= n:
            child = node.children.get(t[pos : pos + B])
            if child is None:
                break
            ct = child.tokens
            L = len(ct)
            if not L % B and t.startswith(ct, pos):  # compares in place, no slice copy
                path.append(child)
                pos += L
                node = child
                continue
            return path, child, common_prefix_bytes(t, pos, ct)
        return path, None, 0

    def path_of(self, node: Node) -> tuple[str, list[int]]:
        """The namespace and the token path from the root to the end of ``node`` (for listeners)."""
        parts: list[bytes] = []
        x: Node | None = node
        root = node
        while x is not None:
            parts.append(bytes(x.tokens))
            root = x
            x = x.parent
        ns = next((name for name, r in self.roots.items() if r is root), "")
        return ns, token_ids(b"".join(reversed(parts)))

    def nodes(self) -> Iterator[Node]:
        """Every live non-root node, parents before children."""
        for root in self.roots.values():
            stack = list(root.children.values())
            while stack:
                x = stack.pop()
                yield x
                stack.extend(x.children.values())

    def replay(self, listener: CacheListener) -> int:
        """Report every node to ``listener`` as ``stored``, parents first; -> nodes reported."""
        count = 0
        for ns, root in self.roots.items():
            stack = [(c, bytes(root.tokens)) for c in reversed(root.children.values())]
            while stack:
                x, above = stack.pop()
                path = above + bytes(x.tokens)
                listener.stored(ns, token_ids(path), len(above) // TOKEN_BYTES, len(x.blocks))
                count += 1
                stack.extend((c, path) for c in reversed(x.children.values()))
        return count

    # ================================================================= shape
    def add_leaf(self, parent: Node, tokens: Tokens, blocks: BlockIds, donate: bool) -> Node:
        """A new leaf under ``parent`` owning ``blocks``; a bad block raises with nothing changed."""
        leaf = Node(tokens, blocks, parent, tokens[: self.block_bytes], self.lru.next_tick())
        try:
            leaf.runs = self.ownership.adopt(leaf, blocks, donate)
        except RadixError:
            self.drop_if_empty_root(parent)
            raise
        if parent.in_lru:  # no longer a leaf
            self.lru.discard(parent)
        parent.children[leaf.key] = leaf
        if self.block_size > 1:
            parent.index_child(leaf)
        n = bytes.__len__(blocks) // ID_BYTES
        self.num_nodes += 1
        self.num_cached_blocks += n
        self.lru.add(leaf)
        if self.listener is not None:
            ns, path = self.path_of(leaf)
            self.listener.stored(ns, path, len(path) - len(tokens) // TOKEN_BYTES, n)
        return leaf

    def split(self, child: Node, k: int) -> Node:
        """Split ``child`` after its first ``k`` blocks; -> the new upper node. The lower part keeps the
        node's identity (leases and pins ending at it stay valid); the upper inherits its holds."""
        B = self.block_bytes
        parent = child.parent
        if parent is None or not 0 < k < len(child.blocks):
            raise RadixError(f"internal: cannot split a node of {len(child.blocks)} blocks at {k}")
        ct = child.tokens
        cb = memoryview(child.blocks)
        upper = Node(ct[: k * B], BlockIds(cb[: k * ID_BYTES]), parent, child.key, child.tick)
        self.lru.touch(child)  # keep ticks unique: the upper part took the old one
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
        if self.block_size > 1:
            upper.by_first = {child.key[:TOKEN_BYTES]: [child]}
        upper.hold = child.hold
        upper.pin = child.pin
        self.ownership.split_owner(upper, upper.blocks, upper.runs, child)
        self.num_nodes += 1
        return upper

    def remove_leaf(
        self,
        node: Node,
        reason: str,
        freed: list[int] | None,
        keep_root: bool = False,
        pending: list[tuple[int, int]] | None = None,
    ) -> int:
        """Drop a leaf and its blocks' tree references; -> blocks freed (``freed``, ``pending``: see
        :meth:`CacheOwnership.disown`)."""
        parent = node.parent
        if parent is None or node.children:
            raise RadixError("internal: only a leaf can be removed")
        blocks = node.blocks
        n = bytes.__len__(blocks) // ID_BYTES
        if self.listener is not None:
            ns, path = self.path_of(node)
            start = len(path) - len(node.tokens) // TOKEN_BYTES
            self.listener.removed(ns, path, start, n, reason)
        del parent.children[node.key]
        if parent.by_first is not None:
            parent.unindex_child(node)
        if node.in_lru:
            self.lru.discard(node)
        n_freed = self.ownership.disown(node, blocks, node.runs, freed, pending)
        node.alive = False
        self.num_nodes -= 1
        self.num_cached_blocks -= n
        self.evicted[reason] += n
        if parent.parent is not None:
            if not parent.children and parent.hold == 0:
                self.lru.add(parent)
        elif not parent.children and not keep_root:
            self.drop_if_empty_root(parent)
        return n_freed

    def drop_if_empty_root(self, node: Node) -> None:
        """Forget ``node`` if it is a root with nothing under it."""
        if node.parent is None and not node.children:
            for ns, r in self.roots.items():
                if r is node:
                    del self.roots[ns]
                    return

    def settle_partial(self, node: Node, rest: Tokens, rest_blocks: BlockIds, dups: list[int]) -> Node | None:
        """Resolve partial-block overlaps of ``rest`` (to be added under ``node``) with its children:
        -> the child that already covers ``rest`` (recording the duplicate), or None after dropping the
        unheld partial leaves ``rest`` supersedes."""
        by_first = node.by_first
        cands = by_first.get(rest[:TOKEN_BYTES]) if by_first is not None else None
        if not cands:
            return None
        first = rest[: self.block_bytes]
        lf = len(first)
        for c in list(cands):
            key = c.key
            if len(key) >= lf:
                if lf < self.block_bytes and key[:lf] == first:
                    if rest_blocks[0] != c.blocks[0]:
                        dups.append(rest_blocks[0])
                    self.lru.touch(c)
                    return c
            elif first[: len(key)] == key and c.hold == 0:
                # c is a one-block partial leaf whose tokens are a prefix of ours: ours supersedes it.
                self.remove_leaf(c, "superseded", None, keep_root=True)
        return None

    # ============================================================== eviction
    def evict_lru(self, n_blocks: int, freed: list[int] | None, reason: str = "lru") -> int:
        """Remove least recently used leaves until ``n_blocks`` blocks are free or none is evictable;
        -> blocks freed. Evicting a leaf can make its parent a leaf, which joins the LRU index."""
        got = 0
        pop_oldest = self.lru.pop_oldest
        runs: list[tuple[int, int]] = []  # freed together, merged where adjacent
        while got < n_blocks:
            node = pop_oldest()
            if node is None:
                break
            got += self.remove_leaf(node, reason, freed, pending=runs)
        if runs:
            self.ownership.release_runs(runs)
        return got

    def evict_subtree(self, top: Node, reason: str) -> int:
        """Remove every node under ``top`` (``top`` included) that no lease or pin holds; -> blocks
        dropped from the cache."""
        order: list[Node] = []
        stack = [top]
        while stack:
            x = stack.pop()
            if x.hold == 0:
                order.append(x)
            stack.extend(x.children.values())
        runs: list[tuple[int, int]] = []  # freed together, merged where adjacent
        dropped = 0
        for x in reversed(order):  # children before their parents
            if x.alive and not x.children and x.hold == 0:
                dropped += bytes.__len__(x.blocks) // ID_BYTES
                self.remove_leaf(x, reason, None, pending=runs)
        if runs:
            self.ownership.release_runs(runs)
        return dropped
