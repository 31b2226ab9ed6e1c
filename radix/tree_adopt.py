"""TreeAdopt: how a new leaf takes over its blocks (run by run when it can, else block by block)."""

from __future__ import annotations

import sys

from radixd.radix.blockids import ID_BYTES, BlockIds, packed_runs, spells_runs, unpack_id
from radixd.radix.errors import InvalidRequest
from radixd.radix.node import TOKEN_BYTES, Node, Tokens
from radixd.radix.pool import OWNER_SHIFT, RC_MASK
from radixd.radix.tree_admin import TreeAdmin


def _disjoint_within(runs: list[tuple[int, int]], nblocks: int) -> bool:
    """Runs lie in [1, nblocks) and do not overlap (no block is given twice)."""
    if len(runs) == 1:
        a, k = runs[0]
        return a >= 1 and a + k <= nblocks
    ordered = sorted(runs)
    end = 1
    for a, k in ordered:
        if a < end:
            return False
        end = a + k
    return end <= nblocks


class TreeAdopt(TreeAdmin):
    """Leaf creation for :class:`radixd.radix.RadixTree` (use that class)."""

    def _add_leaf(self, parent: Node, tokens: Tokens, blocks: BlockIds, donate: bool) -> Node:
        pool = self.pool
        clock = self._clock = self._clock + 1
        leaf = Node(tokens, blocks, parent, tokens[: self._bb], clock)
        n = bytes.__len__(blocks) // ID_BYTES
        runs: list[tuple[int, int]] | None
        a = unpack_id(blocks)[0]  # the first id
        if a >= 1 and pool._id_bytes.startswith(blocks, a * ID_BYTES):  # one run (the common case)
            runs = [(a, n)]
        else:
            # Split over several runs: the pool remembers how it split its recent allocations, and runs
            # from one allocation are disjoint, so spelling them out is proof enough.
            hint = pool._split_hints.pop(a, None)
            if hint is not None and spells_runs(blocks, pool._id_bytes, hint):
                runs = hint
            else:
                runs = packed_runs(blocks, pool._id_bytes)
                if runs is not None and not _disjoint_within(runs, pool.num_blocks):
                    runs = None
        # Blocks just allocated have refcount 1 and no owner, which one in-place memcmp of each run's
        # state words confirms; adopting a run is then one memcpy.
        ones = pool._ones_bytes
        sb = pool._state_bytes
        if runs is not None:
            for a, k in runs:
                if not ones.startswith(sb[a * 8 : (a + k) * 8]):
                    runs = None
                    break
        if runs is None:
            solo = self._adopt_each(parent, leaf, donate)
        else:
            # Donated blocks keep the caller's reference; otherwise the caller keeps its own too: counts
            # are 2 and nobody is solo yet.
            oid = pool._register(leaf)
            word = ((oid << OWNER_SHIFT) | (1 if donate else 2)).to_bytes(8, sys.byteorder)
            for a, k in runs:
                sb[a * 8 : (a + k) * 8] = word * k
            leaf.runs = runs
            solo = n if donate else 0
        leaf.n_solo = solo
        pool._evictable += solo
        if parent.in_lru:  # no longer a leaf
            self._lru.discard(parent)
        parent.children[leaf.key] = leaf
        if self.block_size > 1:
            self._index_first(parent, leaf)
        self._nodes += 1
        self._cached_blocks += n
        self._lru.add(leaf)
        if self.listener is not None:
            ns, path = self._path(leaf)
            self.listener.stored(ns, path, len(path) - len(tokens) // TOKEN_BYTES, n)
        return leaf

    def _adopt_each(self, parent: Node, leaf: Node, donate: bool) -> int:
        """Adopt ``leaf.blocks`` one by one (blocks shared with tables, or scattered ids); -> solo count.

        Validates as it goes and undoes everything on the first bad block, so a failed insert changes
        nothing.
        """
        pool = self.pool
        st = pool._state
        nblocks = pool.num_blocks
        step = 0 if donate else 1  # donated blocks keep the caller's reference; others gain one
        high = pool._register(leaf) << OWNER_SHIFT
        solo = 0
        ids = leaf.blocks.tolist()
        for i, b in enumerate(ids):
            w = int(st[b]) if 0 < b < nblocks else 0
            if w & RC_MASK == 0 or w >> OWNER_SHIFT:
                for a in ids[:i]:
                    st[a] = (int(st[a]) & RC_MASK) - step
                pool._unregister(leaf)
                if parent.parent is None and not parent.children:
                    self._drop_root(parent)  # created for this insert only
                if w & RC_MASK:
                    raise InvalidRequest(
                        f"block {b} is already cached by the tree (or given twice); "
                        "every position needs its own block"
                    )
                pool._bad_incref(b)
            # Without donate the caller keeps its reference, so the count goes to >= 2 and n_solo
            # starts at 0; the pool's hook keeps it exact when the caller drops its reference later.
            c = (w & RC_MASK) + step
            st[b] = high | c
            if c == 1:
                solo += 1
        return solo
