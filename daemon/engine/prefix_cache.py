"""The prefix cache behind `KVManager`: the radix tree, or `NullPrefixCache` (matches and keeps
nothing) when prefix caching is off."""

from __future__ import annotations

from dataclasses import dataclass

from radixd.radix import BlockIds, BlockTable, KeptWindow, Lease, RadixTree, TokenKey, WindowStore


@dataclass
class PrefixHit:
    """What admission may reuse: `full_blocks` (kept by `lease`) + `partial_tokens` of `partial_src`."""

    num_tokens: int
    full_blocks: BlockIds
    partial_src: int | None
    partial_tokens: int
    lease: Lease | None
    # A windowed KV layout: the kept sliding-layer window the hit resumes from (None: from scratch; held
    # from eviction until the hit is attached or released), and the tree's own match length when the
    # hit was cut back to that window (0: not cut).
    window: KeptWindow | None = None
    branch: int = 0

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        if self.window is not None:
            WindowStore.release_window(self.window)
            self.window = None


class TreePrefixCache:
    """Prefix caching in the radix tree."""

    # Sequences share cached blocks, so a waiting request may wait for a running one to publish them.
    shares_prefixes = True

    def __init__(self, tree: RadixTree) -> None:
        self.tree = tree

    def match(self, tokens: TokenKey | list[int], namespace: str) -> PrefixHit:
        """Longest cached prefix, locked by the hit's lease (live also for an empty match)."""
        m = self.tree.match(tokens, namespace)
        partial_tokens = m.partial_tokens if m.partial_block is not None else 0
        return PrefixHit(m.num_tokens + partial_tokens, m.block_ids, m.partial_block, partial_tokens, m.lease)

    def peek(self, tokens: TokenKey | list[int], namespace: str) -> int:
        return self.tree.peek(tokens, namespace)

    def continues(self, tokens: TokenKey | list[int], namespace: str) -> bool:
        """Whether cached tokens follow the whole of `tokens` (on some branch); no lock or LRU change."""
        return bool(self.tree.following(tokens, namespace, 1))

    def new_lease(self, namespace: str) -> Lease | None:
        """A lease on the empty path, for a sequence that resumes with blocks of its own."""
        return self.tree.match((), namespace).lease

    def evictable_blocks(self) -> int:
        return self.tree.evictable_blocks()

    def evict_count(self, n_blocks: int) -> int:
        return self.tree.evict_count(n_blocks)

    def evict_for_run(self, n_blocks: int) -> int:
        return self.tree.evict_for_run(n_blocks)

    def insert_table(
        self, key: TokenKey, table: BlockTable, n_blocks: int, namespace: str, lease: Lease, final: bool
    ) -> None:
        self.tree.insert_table(key, table, n_blocks, namespace, lease, final=final)


class NullPrefixCache:
    """No prefix caching: the same interface, matching and keeping nothing."""

    shares_prefixes = False

    def match(self, tokens: TokenKey | list[int], namespace: str) -> PrefixHit:
        return PrefixHit(0, BlockIds(), None, 0, None)

    def peek(self, tokens: TokenKey | list[int], namespace: str) -> int:
        return 0

    def continues(self, tokens: TokenKey | list[int], namespace: str) -> bool:
        return False

    def new_lease(self, namespace: str) -> Lease | None:
        return None

    def evictable_blocks(self) -> int:
        return 0

    def evict_count(self, n_blocks: int) -> int:
        return 0

    def evict_for_run(self, n_blocks: int) -> int:
        return 0

    def insert_table(
        self, key: TokenKey, table: BlockTable, n_blocks: int, namespace: str, lease: Lease, final: bool
    ) -> None:
        # Unreachable in practice (without a lease nothing is inserted), kept for the interface.
        return


PrefixCache = TreePrefixCache | NullPrefixCache
