"""Tree node and the token comparison helper used by the radix tree."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import SupportsIndex, overload

from radixd.radix.blockids import ID_BYTES, BlockIds, packed_getitem
from radixd.radix.errors import InvalidRequest

TOKEN_BYTES = ID_BYTES
"""Token ids are packed as native int32 like block ids (``packed_getitem`` indexes both): comparing two
runs of tokens is then a memcmp."""

Tokens = bytes
"""The tree's key form: ``TOKEN_BYTES`` bytes per token. Every offset inside the tree is in bytes."""


class TokenKey:
    """Token ids packed once (:func:`encode_tokens`), behaving like a read-only sequence of ids (``len``,
    indexing, slicing count tokens); the tree reads ``packed`` as it is. A wrapper, not a ``bytes``
    subclass, so that nothing mistakes byte offsets for token offsets."""

    __slots__ = ("packed",)

    def __init__(self, packed: bytes) -> None:
        if len(packed) % TOKEN_BYTES:
            raise InvalidRequest(
                f"packed tokens must be a multiple of {TOKEN_BYTES} bytes, got {len(packed)}"
            )
        self.packed: Tokens = packed if type(packed) is bytes else bytes(packed)

    def __len__(self) -> int:
        return len(self.packed) // TOKEN_BYTES

    def __bytes__(self) -> bytes:
        return self.packed

    def __eq__(self, other: object) -> bool:
        return type(other) is TokenKey and other.packed == self.packed

    def __hash__(self) -> int:
        return hash(self.packed)

    @overload
    def __getitem__(self, key: SupportsIndex) -> int: ...
    @overload
    def __getitem__(self, key: slice) -> TokenKey: ...
    def __getitem__(self, key: SupportsIndex | slice) -> int | TokenKey:
        got = packed_getitem(self.packed, key, "TokenKey")
        return got if isinstance(got, int) else TokenKey(got)

    def __iter__(self) -> Iterator[int]:
        return iter(token_ids(self.packed))

    def __repr__(self) -> str:
        return f"TokenKey({token_ids(self.packed)})"


def encode_tokens(tokens: Sequence[int]) -> TokenKey:
    """Pack token ids once so repeated tree calls skip the conversion (``match``/``insert_table`` take it)."""
    return TokenKey(as_tokens(tokens))


def as_tokens(tokens: Sequence[int] | bytes | TokenKey) -> Tokens:
    """Token ids in the tree's packed form. A TokenKey gives its bytes; ``bytes`` is taken as packed."""
    if type(tokens) is TokenKey:
        return tokens.packed
    if isinstance(tokens, bytes):
        t = tokens if type(tokens) is bytes else bytes(tokens)
        if len(t) % TOKEN_BYTES:
            raise InvalidRequest(f"packed tokens must be a multiple of {TOKEN_BYTES} bytes, got {len(t)}")
        return t
    try:
        return array("i", tokens).tobytes()
    except (OverflowError, TypeError) as e:
        raise InvalidRequest(f"token ids must be integers in [-2**31, 2**31): {e}") from None


def token_ids(t: bytes | TokenKey) -> list[int]:
    """Unpack (for tests, debugging and admin output)."""
    return array("i", t.packed if type(t) is TokenKey else t).tolist()


class Node:
    """One edge of the radix tree: packed ``tokens`` and the parallel packed ``blocks`` holding them;
    ``key`` is its first block of tokens (its key in ``parent.children``). Roots have no tokens."""

    # NOTE: invariants (checked by radixd.radix.verify):
    #  * len(blocks) == ceil(len(tokens) / B); len(tokens) % B != 0 only for a leaf;
    #  * siblings never share a full first block (they may share a *partial* prefix of it);
    #  * hold == leases + pins whose path runs through this node; a parent's hold >= each child's,
    #    so hold == 0 means the whole subtree may be evicted;
    #  * n_solo == number of this node's blocks whose refcount is 1 (held by the tree alone);
    #  * in_lru  <=>  alive, not a root, no children, hold == 0;
    #  * runs is None, or the (first_id, length) runs of consecutive ids that spell out blocks exactly;
    #  * end == parent.end + len(tokens) (0 at a root): the node's path from its root spells end bytes.

    __slots__ = (
        "alive",
        "blocks",
        "by_first",
        "children",
        "end",
        "hold",
        "in_lru",
        "key",
        "n_solo",
        "oid",
        "parent",
        "pin",
        "runs",
        "tick",
        "tokens",
    )

    def __init__(self, tokens: Tokens, blocks: BlockIds, parent: Node | None, key: Tokens, tick: int) -> None:
        self.tokens = tokens
        self.blocks = blocks
        self.parent = parent
        self.key = key
        self.tick = tick
        # Where the node's path ends, in key bytes: an insert that continues a leased path starts here.
        self.end: int = len(tokens) + parent.end if parent is not None else 0
        self.children: dict[Tokens, Node] = {}
        # First token (packed) -> children starting with it; only kept when block_size > 1, where it
        # finds the sibling sharing the longest partial first block without scanning every child.
        self.by_first: dict[bytes, list[Node]] | None = None
        self.hold = 0
        self.pin = 0
        self.n_solo = 0
        self.oid = 0  # the pool's id for this node while it holds blocks (0: none yet)
        self.in_lru = False
        self.alive = True
        # Known when the blocks came in as a few runs of consecutive ids (the common case): freeing the
        # node then takes one slice store per run, with no pass over the blocks to rediscover them.
        self.runs: list[tuple[int, int]] | None = None

    # The first-token index of the children (kept when block_size > 1) finds the sibling that shares the
    # longest partial first block without scanning every child.
    def index_child(self, child: Node) -> None:
        by_first = self.by_first
        if by_first is None:
            by_first = self.by_first = {}
        first = child.key[:TOKEN_BYTES]
        lst = by_first.get(first)
        if lst is None:
            by_first[first] = [child]
        else:
            lst.append(child)

    def unindex_child(self, child: Node) -> None:
        by_first = self.by_first
        if by_first is not None:
            first = child.key[:TOKEN_BYTES]
            lst = by_first[first]
            if len(lst) == 1:
                del by_first[first]
            else:
                lst.remove(child)

    def best_partial(self, q: Tokens) -> tuple[Node | None, int]:
        """The child whose first block shares the longest prefix with ``q`` (at most a block of a
        query), and that prefix in tokens; (None, 0) when no child starts with ``q``'s first token."""
        by_first = self.by_first
        cands = by_first.get(q[:TOKEN_BYTES]) if by_first is not None else None
        best: Node | None = None
        best_len = 0
        if cands:
            for c in cands:
                m = common_prefix_bytes(q, 0, c.key)
                if m > best_len:
                    best, best_len = c, m
        return best, best_len // TOKEN_BYTES

    def children_starting(self, q: Tokens) -> list[Node]:
        """The children whose tokens start with ``q`` (shorter than a block)."""
        by_first = self.by_first
        cands = by_first.get(q[:TOKEN_BYTES], []) if by_first is not None else []
        return [c for c in cands if c.tokens.startswith(q)]

    def __repr__(self) -> str:
        return (
            f"Node(tokens={len(self.tokens) // TOKEN_BYTES}, blocks={len(self.blocks)}, "
            f"children={len(self.children)}, hold={self.hold}, pin={self.pin})"
        )


def split_runs(runs: list[tuple[int, int]], k: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Runs of the first ``k`` blocks and of the rest (``0 < k < total``)."""
    head: list[tuple[int, int]] = []
    for i, (a, n) in enumerate(runs):
        if k < n:
            head.append((a, k))
            return head, [(a + k, n - k), *runs[i + 1 :]]
        head.append((a, n))
        k -= n
        if not k:
            return head, runs[i + 1 :]
    raise ValueError("split point past the end of the runs")


def common_prefix_bytes(a: Tokens, off: int, b: Tokens) -> int:
    """Length in bytes (whole tokens) of the longest common prefix of ``a[off:]`` and ``b``; compares
    slices and bisects on the first mismatch (O(log n) Python steps)."""
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
    return lo - lo % TOKEN_BYTES  # whole tokens only
