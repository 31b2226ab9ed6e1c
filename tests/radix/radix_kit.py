"""Helpers shared by the radix tests."""

from __future__ import annotations

from radixd.radix import RadixTree


def cache(tree: RadixTree, tokens: list[int], ns: str = "") -> list[int]:
    """Compute `tokens` into fresh blocks, insert them and drop the request's references."""
    pool = tree.pool
    blocks = pool.allocate(-(-len(tokens) // pool.block_size))
    tree.insert(tokens, blocks, ns)
    pool.decref_all(blocks)
    return blocks
