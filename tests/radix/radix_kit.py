"""Helpers shared by the radix tests: requests driven through the product's protocol (KVManager's)."""

from __future__ import annotations

from radixd.radix import BlockTable, InsertResult, RadixTree


def computed(tree: RadixTree, n_tokens: int) -> BlockTable:
    """A table of `n_tokens` slots in fresh blocks (a request that matched nothing and computed them)."""
    table = BlockTable(tree.pool)
    table.append(n_tokens)
    return table


def insert_finished(tree: RadixTree, tokens: list[int], table: BlockTable, ns: str = "") -> InsertResult:
    """Cache every token of a finishing request whose match was empty (`KVManager.insert_all`), then
    release its table and lease."""
    lease = tree.match((), ns).lease
    res = tree.insert_table(tokens, table, table.num_blocks, ns, lease, final=True)
    table.release()
    lease.release()
    return res


def cache(tree: RadixTree, tokens: list[int], ns: str = "") -> list[int]:
    """Compute `tokens` into fresh blocks and cache them as a finishing request does; -> the blocks
    the tree holds for them."""
    table = computed(tree, len(tokens))
    blocks = table.blocks  # the tree's blocks once inserted (a released table starts a new array)
    insert_finished(tree, tokens, table, ns)
    return blocks.tolist()
