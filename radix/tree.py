"""RadixTree: token-exact prefix cache over paged KV blocks (match, insert, leases, pins, eviction)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from radixd.radix.blockids import EMPTY, ID_BYTES, BlockIds, pack_blocks
from radixd.radix.errors import InvalidRequest, UnknownLease
from radixd.radix.node import TOKEN_BYTES, Node, TokenKey, Tokens, as_tokens, common_prefix_len
from radixd.radix.results import InsertResult, Lease, PrefixMatch
from radixd.radix.tree_admin import FlushMode
from radixd.radix.tree_adopt import TreeAdopt
from radixd.radix.tree_core import EVICT_REASONS

__all__ = ["EVICT_REASONS", "FlushMode", "RadixTree"]


def _joined(parts: list[bytes]) -> BlockIds:
    """The packed blocks of a matched path (usually one node's own BlockIds, shared as is)."""
    if len(parts) == 1 and type(parts[0]) is BlockIds:
        return parts[0]
    return BlockIds(b"".join(parts)) if parts else EMPTY


def _differing(mine: bytes, start: int, node_blocks: bytes, lo: int, hi: int) -> list[int]:
    """The caller's ids (packed ``mine``, from id ``start`` on) that differ from ``node_blocks[lo:hi]``."""
    theirs = bytes.__getitem__(node_blocks, slice(lo * ID_BYTES, hi * ID_BYTES))
    if mine.startswith(theirs, start * ID_BYTES):  # the tree's own blocks (the usual case): one memcmp
        return []
    a = array("i", bytes.__getitem__(mine, slice(start * ID_BYTES, (start + hi - lo) * ID_BYTES)))
    return [x for x, y in zip(a, array("i", theirs), strict=True) if x != y]


class RadixTree(TreeAdopt):
    """Prefix cache of KV blocks keyed by (namespace, token ids).

    * ``match`` returns the longest cached prefix as full blocks plus the partially matching next
      block (block id + matched token count) and a :class:`Lease` locking that path.
    * ``insert`` caches any token sequence with its blocks (prompt and generated tokens; the last block
      may be partial) and reports the caller's blocks that duplicate cached ones.
    * ``evict`` frees least-recently-used unlocked, unpinned leaves in O(log n) per node, cascading to
      parents that become leaves; ``evict_prefix``, ``flush``, ``pin`` / ``unpin`` manage the cache.

    Not thread-safe: one owner (the engine thread) drives it.
    """

    # NOTE: ownership invariants (tests/radix check them after every step):
    #  * the tree holds exactly one pool reference per block it stores (per occurrence in a node);
    #  * a block is exactly one of: free / cached-evictable (refcount 1, held by the tree in a node
    #    with hold == 0) / in use; free + evictable + in_use == pool.num_usable;
    #  * a node with hold > 0 (leased or pinned, or an ancestor of one) is never evicted, except by
    #    flush("force"), which also invalidates every outstanding lease (epoch bump);
    #  * different namespaces have different roots and never share a node or a block.

    # ================================================================== lookup
    def match(self, tokens: Sequence[int] | bytes | TokenKey, namespace: str = "") -> PrefixMatch:
        """Longest cached prefix of ``tokens``; locks it until ``result.lease.release()``.

        ``tokens``: token ids, or packed ones (``encode_tokens``) to skip the conversion. To keep at
        least one token to compute (for logits), match ``tokens[:-1]``.
        """
        t = tokens.packed if type(tokens) is TokenKey else as_tokens(tokens)
        node, blocks, pblock, ptok = self._walk(t, namespace, touch=True)
        num_tokens = bytes.__len__(blocks) // ID_BYTES * self.block_size
        self._hit_tokens += num_tokens + ptok
        self._miss_tokens += len(t) // TOKEN_BYTES - num_tokens - ptok
        if node is None:
            # NOTE: a fresh lease, not a shared one: a caller that inserts with it gets its path locked.
            return PrefixMatch(blocks, num_tokens, pblock, ptok, Lease(self, None, self._epoch))
        self._lock_path(node)
        self._leases += 1
        return PrefixMatch(blocks, num_tokens, pblock, ptok, Lease(self, node, self._epoch))

    def peek(self, tokens: Sequence[int] | bytes | TokenKey, namespace: str = "") -> int:
        """Cached prefix length of ``tokens`` (full + partial block tokens); no lock, LRU or stats change."""
        _node, blocks, _pb, ptok = self._walk(as_tokens(tokens), namespace, touch=False)
        return len(blocks) * self.block_size + ptok

    def _walk(self, t: Tokens, namespace: str, touch: bool) -> tuple[Node | None, BlockIds, int | None, int]:
        """(deepest node used or None, full blocks, partial block, partial tokens)."""
        parts: list[bytes] = []
        node = self._roots.get(namespace)
        if node is None:
            return None, EMPTY, None, 0
        B = self._bb  # offsets below are in packed bytes
        n = len(t)
        pos = 0
        clock = self._clock
        while pos + B <= n:
            child = node.children.get(t[pos : pos + B])
            if child is None:
                break
            if touch:
                # Every touched node ends up on the leased path, so it leaves the LRU index anyway.
                if child.in_lru:
                    self._lru.discard(child)
                clock += 1
                child.tick = clock
            ct = child.tokens
            L = len(ct)
            if not L % B and t.startswith(ct, pos):  # compares in place, no slice copy
                parts.append(child.blocks)
                pos += L
                node = child
                continue
            # The query leaves this node inside it (or covers its partial last block).
            m = common_prefix_len(t, pos, ct)
            k = m // B
            if k:
                parts.append(bytes.__getitem__(child.blocks, slice(0, k * ID_BYTES)))
            self._clock = clock
            r = (m - k * B) // TOKEN_BYTES
            return child, _joined(parts), (child.blocks[k] if r else None), r
        self._clock = clock
        by_first = node.by_first
        if by_first and t[pos : pos + TOKEN_BYTES] in by_first:  # a child may share part of a block
            best, best_len = self._best_partial(node, t, pos)
            if best is not None:
                if touch:
                    self._lru.discard(best)
                    self._clock += 1
                    best.tick = self._clock
                return best, _joined(parts), best.blocks[0], best_len
        return (node if node.parent is not None else None), (_joined(parts) if parts else EMPTY), None, 0

    def _best_partial(self, node: Node, t: Tokens, pos: int) -> tuple[Node | None, int]:
        """The child whose first block shares the longest (partial) prefix with t[pos:pos+B]."""
        by_first = node.by_first
        cands = by_first.get(t[pos : pos + TOKEN_BYTES]) if by_first is not None else None
        best: Node | None = None
        best_len = 0
        if cands:
            q = t[pos : pos + self._bb]
            for c in cands:
                m = common_prefix_len(q, 0, c.key)
                if m > best_len:
                    best, best_len = c, m
        return best, best_len // TOKEN_BYTES

    # ================================================================== insert
    def insert(
        self,
        tokens: Sequence[int] | bytes | TokenKey,
        blocks: Sequence[int] | bytes,
        namespace: str = "",
        lease: Lease | None = None,
        *,
        donate: bool = False,
        cached: int = 0,
    ) -> InsertResult:
        """Cache ``tokens`` whose KV lives in ``blocks`` (``ceil(len(tokens) / block_size)`` of them).

        ``blocks``: block ids, or packed ones (``BlockIds``, e.g. from ``allocate_ids`` and
        ``PrefixMatch.block_ids``; any ``bytes`` is read as packed ids), which skips the conversion.

        ``cached=k``: the first ``k`` full blocks of ``tokens`` are the tree's own (typically
        ``len(match.block_ids)`` of the match whose lease the caller still holds), and ``blocks`` holds
        only the blocks after them, so the caller need not join its new blocks to the matched ones. The
        tree checks that those ``k`` blocks of tokens are still cached; if not it raises InvalidRequest,
        having cached and split nothing.

        The tree takes one reference on each block it adopts; the caller keeps its own. Blocks at
        positions the tree already caches in other blocks are returned as duplicates. If ``lease`` (a
        live lease of this tree) is given it is moved to the inserted path, so the caller's blocks stay
        protected until it releases the lease.

        ``donate=True`` hands the tree the caller's single reference on every block that is not already
        the tree's own block at its position (typically: the blocks the caller allocated for the
        uncached suffix). Adopted blocks keep that reference, duplicates are released by the tree, and
        the caller must not release any of them afterwards. It saves a pass over the blocks.
        """
        t = tokens.packed if type(tokens) is TokenKey else as_tokens(tokens)
        bl = blocks if type(blocks) is BlockIds or type(blocks) is bytes else pack_blocks(blocks)
        B = self._bb  # offsets below are in packed bytes
        n = len(t)
        nb = -(-n // B)
        c = cached  # positions from c on hold the caller's blocks (bl[i] is the block of position c + i)
        if bytes.__len__(bl) != (nb - c) * ID_BYTES or not 0 <= c <= n // B:
            raise self._bad_insert(n, bytes.__len__(bl) // ID_BYTES, c)
        if lease is not None and lease._tree is not self:
            raise UnknownLease("insert(lease=...) got a lease issued by another RadixTree")
        if n == 0:
            return InsertResult([], 0, 0)
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = Node(b"", EMPTY, None, b"", 0)
        node = root
        dups: list[int] = []
        j = 0
        nf = n // B
        clock = self._clock
        while j < nf:
            pos = j * B
            child = node.children.get(t[pos : pos + B])
            if child is None:
                break
            clock += 1
            if child.in_lru:
                self._touch(child, clock)
            else:
                child.tick = clock
            ct = child.tokens
            cb = child.blocks
            L = len(ct)
            if not L % B and t.startswith(ct, pos):  # compares in place, no slice copy
                k = bytes.__len__(cb) // ID_BYTES
                # Where the caller gave blocks, are they the tree's own? Others are duplicates.
                if j >= c:
                    if not bl.startswith(cb, (j - c) * ID_BYTES):
                        dups += _differing(bl, j - c, cb, 0, k)
                elif j + k > c:
                    dups += _differing(bl, 0, cb, c - j, k)
                j += k
                node = child
                continue
            k = common_prefix_len(t, pos, ct) // B  # >= 1: the first block matched as a key
            if j + k < c:  # the cached prefix would end inside this node: reported below, nothing split
                j += k
                break
            if j + k > c:
                lo = max(c - j, 0)
                dups += _differing(bl, j + lo - c, cb, lo, k)
            node = self._split(child, k)
            j += k
            break
        self._clock = clock
        if j < c:
            if not root.children:
                self._drop_root(root)  # created for this insert only
            raise InvalidRequest(
                f"insert(cached={c}): only {j} leading blocks of these tokens are cached; hold the match's "
                "lease until the insert, or pass the blocks of every position"
            )
        new_tokens = 0
        final = node
        if j < nb:
            rest = t[j * B :]
            # A BlockIds is immutable: when it is all new, the node can share the caller's object.
            rest_blocks = (
                bl if j == c and type(bl) is BlockIds else BlockIds(memoryview(bl)[(j - c) * ID_BYTES :])
            )
            by_first = node.by_first
            covered = None
            if by_first is not None and rest[:TOKEN_BYTES] in by_first:  # else no sibling can overlap
                covered = self._settle_partial(node, rest, rest_blocks, dups)
            if covered is not None:
                final = covered
            else:
                final = self._add_leaf(node, rest, rest_blocks, donate)
                new_tokens = len(rest) // TOKEN_BYTES
        if lease is not None and lease._open and lease._epoch == self._epoch:
            old = lease._node
            self._lock_path(final)
            if old is None:  # an empty match's lease starts locking here
                self._leases += 1
            else:
                self._unlock_path(old)
            lease._node = final
        if donate and dups:
            self.pool.decref_all(dups)
        return InsertResult(dups, n // TOKEN_BYTES - new_tokens, new_tokens)

    def _bad_insert(self, n: int, got: int, cached: int) -> InvalidRequest:
        """The error for an insert whose block count (or ``cached``) does not fit its tokens."""
        nt, bs = n // TOKEN_BYTES, self.block_size
        if not 0 <= cached <= nt // bs:
            return InvalidRequest(
                f"insert(cached={cached}) must be within [0, {nt // bs}]: the full blocks of {nt} tokens"
            )
        need = (
            f"ceil({nt}/{bs}) - {cached} = {-(-nt // bs) - cached} blocks"
            if cached
            else f"ceil({nt}/{bs}) = {-(-nt // bs)} blocks"
        )
        return InvalidRequest(f"insert of {nt} tokens needs {need}, got {got}")

    def _settle_partial(
        self, node: Node, rest: Tokens, rest_blocks: BlockIds, dups: list[int]
    ) -> Node | None:
        """Resolve partial-block overlaps between ``rest`` and ``node``'s children.

        Returns the child that already covers ``rest`` (``rest`` is a single partial block whose tokens
        begin a cached block) after recording the duplicate; otherwise drops unleased single-block
        partial leaves that ``rest`` supersedes and returns None (the caller adds ``rest`` as a leaf).
        """
        by_first = node.by_first
        cands = by_first.get(rest[:TOKEN_BYTES]) if by_first is not None else None
        if not cands:
            return None
        first = rest[: self._bb]
        lf = len(first)
        for c in list(cands):
            key = c.key
            if len(key) >= lf:
                if lf < self._bb and key[:lf] == first:
                    if rest_blocks[0] != c.blocks[0]:
                        dups.append(rest_blocks[0])
                    self._clock += 1
                    self._touch(c, self._clock)
                    return c
            elif first[: len(key)] == key and c.hold == 0:
                # c is a one-block partial leaf whose tokens are a prefix of ours: ours supersedes it.
                self._remove_leaf(c, "superseded", None, keep_root=True)
        return None
