"""Pins: cached prefixes an operator exempted from eviction, within a budget of blocks."""

from __future__ import annotations

from radixd.radix.errors import NotPinned, PinBudgetExceeded
from radixd.radix.holds import Holds
from radixd.radix.node import TOKEN_BYTES, Node, Tokens
from radixd.radix.store import NodeStore


class Pins:
    """The pins of one tree: each holds its path as a lease does (a hold per node, see
    :meth:`Holds.lock`) and counts it in the nodes' ``pin``; the pinned blocks stay within
    ``budget_blocks``."""

    # NOTE: node.pin == the pins whose path runs through the node; num_pinned_blocks == the blocks of
    # the nodes with pin > 0 (radixd.radix.verify checks both).

    def __init__(self, store: NodeStore, holds: Holds, budget_blocks: int) -> None:
        self._store = store
        self._holds = holds
        self.budget_blocks = budget_blocks
        self.num_pinned_blocks = 0
        self._pins: dict[tuple[str, Tokens], Node] = {}

    def pin(self, t: Tokens, namespace: str) -> int:
        """See :meth:`RadixTree.pin` (``t`` packed)."""
        key = (namespace, t)
        done = self._pins.get(key)
        if done is not None:
            return done.end // TOKEN_BYTES
        node = self._target(t, namespace)
        if node is None:
            return 0
        add = 0
        x: Node | None = node
        while x is not None and x.parent is not None:
            if x.pin == 0:
                add += len(x.blocks)
            x = x.parent
        if self.num_pinned_blocks + add > self.budget_blocks:
            raise PinBudgetExceeded(
                f"pinning {add} more blocks would exceed the pin budget: {self.num_pinned_blocks} of "
                f"{self.budget_blocks} already pinned; unpin something or raise pin_budget_fraction"
            )
        self._holds.lock(node)
        x = node
        while x is not None and x.parent is not None:
            x.pin += 1
            if x.pin == 1:
                self.num_pinned_blocks += len(x.blocks)
            x = x.parent
        self._pins[key] = node
        return node.end // TOKEN_BYTES

    def unpin(self, t: Tokens, namespace: str) -> int:
        """See :meth:`RadixTree.unpin` (``t`` packed)."""
        node = self._pins.pop((namespace, t), None)
        if node is None:
            raise NotPinned(
                f"no pin for these {len(t) // TOKEN_BYTES} tokens in namespace {namespace!r}; "
                "unpin takes the same tokens that were pinned"
            )
        x: Node | None = node
        while x is not None and x.parent is not None:
            x.pin -= 1
            if x.pin == 0:
                self.num_pinned_blocks -= len(x.blocks)
            x = x.parent
        self._holds.unlock(node)
        return node.end // TOKEN_BYTES

    def _target(self, t: Tokens, namespace: str) -> Node | None:
        """Deepest node fully covered by ``t`` (splitting at a block boundary when ``t`` ends inside)."""
        store = self._store
        root = store.roots.get(namespace)
        if root is None:
            return None
        path, child, m = store.descend(t, root)
        node = path[-1] if path else root
        rest = len(t) - node.end
        if child is not None:
            # t covers the whole edge (one that ends in a partial block), or ends inside it.
            node = child if m == len(child.tokens) else store.split(child, m // store.block_bytes)
        elif 0 < rest < store.block_bytes:
            # A one-block partial leaf whose tokens are exactly the rest of t (its key is all of them).
            node = node.children.get(t[node.end :], node)
        return node if node.parent is not None else None
