"""Tree node and the token comparison helper used by the radix tree."""

from __future__ import annotations

from collections.abc import Sequence

Tokens = tuple[int, ...]


def as_tokens(tokens: Sequence[int]) -> Tokens:
    """Token ids as a tuple (the tree's key form); a tuple is passed through without a copy."""
    return tokens if type(tokens) is tuple else tuple(tokens)


class Node:
    """One edge of the radix tree: a run of whole blocks (only a leaf may end in a partial block).

    ``tokens`` and ``blocks`` are parallel: block ``i`` holds ``tokens[i*B : (i+1)*B]``. ``key`` is the
    node's first block (its key in ``parent.children``). A root (one per namespace) has no tokens.
    """

    # NOTE: invariants (checked by radixd.radix.verify):
    #  * len(blocks) == ceil(len(tokens) / B); len(tokens) % B != 0 only for a leaf;
    #  * siblings never share a full first block (they may share a *partial* prefix of it);
    #  * hold == leases + pins whose path runs through this node; a parent's hold >= each child's,
    #    so hold == 0 means the whole subtree may be evicted;
    #  * n_solo == number of this node's blocks whose refcount is 1 (held by the tree alone);
    #  * in_lru  <=>  alive, not a root, no children, hold == 0.

    __slots__ = (
        "alive",
        "blocks",
        "by_first",
        "children",
        "hold",
        "in_lru",
        "key",
        "n_solo",
        "parent",
        "pin",
        "tick",
        "tokens",
    )

    def __init__(
        self, tokens: Tokens, blocks: list[int], parent: Node | None, key: Tokens, tick: int
    ) -> None:
        self.tokens = tokens
        self.blocks = blocks
        self.parent = parent
        self.key = key
        self.tick = tick
        self.children: dict[Tokens, Node] = {}
        # First token -> children starting with it; only kept when block_size > 1, where it finds the
        # sibling sharing the longest partial first block without scanning every child.
        self.by_first: dict[int, list[Node]] | None = None
        self.hold = 0
        self.pin = 0
        self.n_solo = 0
        self.in_lru = False
        self.alive = True

    def __repr__(self) -> str:
        return (
            f"Node(tokens={len(self.tokens)}, blocks={len(self.blocks)}, "
            f"children={len(self.children)}, hold={self.hold}, pin={self.pin})"
        )


def common_prefix_len(a: Tokens, off: int, b: Tokens) -> int:
    """Length of the longest common prefix of ``a[off:]`` and ``b``, comparing real tokens.

    Compares slices (C speed) and bisects on the first mismatch, so the Python-level work is
    O(log n) instead of one step per token.
    """
    n = min(len(a) - off, len(b))
    if a[off : off + n] == b[:n]:
        return n
    lo, hi = 0, n  # a[off:off+lo] == b[:lo]; the first mismatch lies in [lo, hi)
    while hi - lo > 8:
        mid = (lo + hi) >> 1
        if a[off + lo : off + mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[off + lo] == b[lo]:
        lo += 1
    return lo
