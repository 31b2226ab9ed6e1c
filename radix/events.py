"""Cache events: what a tree tells an observer (a router, metrics) about the prefixes it holds.

Each change of content is reported at its node: ``stored`` (a new leaf) or ``removed`` (any reason),
with the namespace, the token path to the node's end, and ``start``, where the node's own tokens begin.
NOTE: the listener runs inside the tree's operation, on its thread: quick, and no calls back into it.
A windowed layout's kept windows are reported the same way by the `WindowStore` (`WindowListener`).
"""

from __future__ import annotations

from typing import Protocol

from radixd.radix.windows import WindowListener


class CacheListener(Protocol):
    """Receives the tree's content changes (set ``RadixTree.listener``)."""

    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        """A node covering ``tokens[start:]`` (with ``num_blocks`` blocks) joined the cache; ``tokens`` is
        its whole path from the root."""

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        """The node covering ``tokens[start:]`` left the cache with its ``num_blocks`` blocks (its parent,
        ending at ``tokens[:start]``, stays). ``reason`` is one of ``EVICT_REASONS``."""


class FanOut:
    """One listener that hands every change to several, in order (the tree and the window store take one
    listener each); a window's change goes to those that are `WindowListener`s."""

    def __init__(self, *listeners: CacheListener) -> None:
        self._listeners = listeners
        self._window_listeners = [x for x in listeners if isinstance(x, WindowListener)]

    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        for listener in self._listeners:
            listener.stored(namespace, tokens, start, num_blocks)

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        for listener in self._listeners:
            listener.removed(namespace, tokens, start, num_blocks, reason)

    def kept(self, namespace: str, tokens: list[int], start: int, num_pages: int) -> None:
        for listener in self._window_listeners:
            listener.kept(namespace, tokens, start, num_pages)

    def dropped(self, namespace: str, tokens: list[int], start: int, num_pages: int, reason: str) -> None:
        for listener in self._window_listeners:
            listener.dropped(namespace, tokens, start, num_pages, reason)
