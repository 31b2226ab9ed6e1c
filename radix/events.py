"""Cache events: what a tree tells an observer (a router, metrics) about the prefixes it holds.

The tree reports every change of its content at the node that changed: a new leaf (``stored``), and a
removed leaf, whatever removed it (LRU pressure, an admin eviction, a flush, a longer insert that
superseded a partial block: ``removed``). Each event names the namespace, the whole token path from
the root to the end of the node, and ``start``, where the node's own tokens begin: the node covers
``tokens[start:]``.

An observer that counts, for every prefix, the live nodes covering it (``stored`` adds one to the
prefixes ``tokens[:start+1] .. tokens``, ``removed`` takes it back) knows exactly what is cached: a
prefix is cached while its count is positive. Counting matters because two sibling leaves may both
end in a partial block that starts with the same tokens.

NOTE: the listener runs inside the tree's operation, on the thread that owns the tree. It must be
quick and must not call back into the tree; the daemon's listener only hands the event to another
thread.
"""

from __future__ import annotations

from typing import Protocol


class CacheListener(Protocol):
    """Receives the tree's content changes (set ``RadixTree.listener``)."""

    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        """A node covering ``tokens[start:]`` (with ``num_blocks`` blocks) joined the cache; ``tokens`` is
        its whole path from the root."""

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        """The node covering ``tokens[start:]`` left the cache with its ``num_blocks`` blocks (its parent,
        ending at ``tokens[:start]``, stays). ``reason`` is one of ``EVICT_REASONS``."""


class FanOut:
    """One listener that hands every change to several, in order (the tree takes one listener)."""

    def __init__(self, *listeners: CacheListener) -> None:
        self._listeners = listeners

    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        for listener in self._listeners:
            listener.stored(namespace, tokens, start, num_blocks)

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        for listener in self._listeners:
            listener.removed(namespace, tokens, start, num_blocks, reason)
