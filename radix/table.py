"""BlockTable: one running sequence's logical -> physical block map, with copy-on-write."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import NamedTuple

from radixd.radix.errors import InvalidRequest, OutOfBlocks
from radixd.radix.pool import BlockPool

CopyOp = tuple[int, int, int]
"""(src_block, dst_block, n_tokens): copy the first n_tokens slots of src into dst (kernels.copy_blocks)."""


class AppendResult(NamedTuple):
    """Slots for the new tokens (``block * block_size + offset``) and the copies to run before writing."""

    slots: list[int]
    copies: list[CopyOp]


class BlockTable:
    """Logical -> physical blocks of one sequence (token ``p`` in ``blocks[p // B]`` at ``p % B``); a
    shared, partly filled last block is copied before it is written (copy-on-write)."""

    # NOTE: invariants: each entry of `blocks[leased:]` is one reference this table holds in the pool;
    # `blocks[:leased]` are full blocks the radix tree owns, kept alive by the lease of the table's owner
    # (the table holds no reference on them); len(blocks) == ceil(num_tokens / B); release() drops the
    # table's references exactly once.

    __slots__ = ("blocks", "leased", "num_tokens", "pool")

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        # NOTE: packed native int32 ids (`array('i')`): the tree and the pool take them as bytes
        # (`tobytes()` of a slice is one memcpy), and allocations extend them from packed ids.
        self.blocks: array[int] = array("i")
        self.num_tokens = 0
        self.leased = 0

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def slot(self, pos: int) -> int:
        """Physical slot of token position ``pos``."""
        if not 0 <= pos < self.num_tokens:
            raise InvalidRequest(f"position {pos} is outside this sequence's {self.num_tokens} tokens")
        B = self.pool.block_size
        return self.blocks[pos // B] * B + pos % B

    def share_prefix(self, blocks: Sequence[int], num_tokens: int) -> None:
        """Start this (empty) table from cached blocks holding ``num_tokens`` (the last may be partial),
        taking one reference on each."""
        B = self.pool.block_size
        if self.blocks:
            raise InvalidRequest("share_prefix needs an empty table (it already holds blocks)")
        n = len(blocks)
        if not (n - 1) * B < num_tokens <= n * B and not (n == 0 and num_tokens == 0):
            raise InvalidRequest(f"{n} blocks of {B} tokens cannot hold exactly {num_tokens} tokens")
        taken: list[int] = []
        try:
            for b in blocks:
                self.pool.incref(b)
                taken.append(b)
        except Exception:
            self.pool.decref_all(taken)
            raise
        self.blocks = array("i", blocks)
        self.num_tokens = num_tokens

    def lease_prefix(self, blocks: Sequence[int]) -> None:
        """Start this (empty) table from full cached blocks that the caller's lease keeps alive until
        :meth:`release` (no reference per block: O(1) Python steps)."""
        if self.blocks:
            raise InvalidRequest("lease_prefix needs an empty table (it already holds blocks)")
        if isinstance(blocks, bytes):  # packed ids (BlockIds): one memcpy
            self.blocks.frombytes(blocks)
        else:
            self.blocks = array("i", blocks)
        self.leased = len(self.blocks)
        self.num_tokens = self.leased * self.pool.block_size

    def leased_up_to(self, n_blocks: int) -> None:
        """The first ``n_blocks`` blocks are now the tree's, kept alive by the owner's lease: the table's
        references on those past :attr:`leased` were handed to the tree (``RadixTree.insert_table``)."""
        if not self.leased <= n_blocks <= len(self.blocks):
            raise InvalidRequest(f"leased_up_to({n_blocks}) outside [{self.leased}, {len(self.blocks)}]")
        self.leased = n_blocks

    def settle_cached(self, done: int, known: int, dups: list[int], theirs: list[int] | None) -> None:
        """After ``RadixTree.insert_table``: blocks ``done..known`` sat at positions the tree had cached.
        The table drops its reference on blocks the tree holds itself, and reads the tree's blocks
        (``theirs``, from position 0) in place of its duplicates (``dups``), which the tree released."""
        blocks = self.blocks
        dup = set(dups)
        for i in range(done, known):
            if blocks[i] not in dup:
                self.pool.decref(blocks[i])
        if dup and theirs is not None:
            blocks[done:known] = array("i", theirs[done:known])

    def copy_partial(self, src_block: int, n_tokens: int) -> CopyOp:
        """Append a fresh block for the first ``n_tokens`` of ``src_block`` (a partial match) and return
        the copy to run; the table must end on a block boundary."""
        B = self.pool.block_size
        if self.num_tokens % B:
            raise InvalidRequest(
                f"copy_partial needs the table to end on a block boundary (it holds {self.num_tokens} "
                f"tokens, block size {B})"
            )
        if not 0 < n_tokens < B:
            raise InvalidRequest(f"copy_partial copies 1..{B - 1} tokens, got {n_tokens}")
        if self.pool.refcount(src_block) == 0 or src_block == 0:
            raise InvalidRequest(f"copy_partial source block {src_block} is not allocated")
        self.pool.allocate_into(self.blocks, 1, self.blocks[-1] if self.blocks else 0)
        dst = self.blocks[-1]
        self.num_tokens += n_tokens
        return (src_block, dst, n_tokens)

    def append(self, n_tokens: int) -> list[CopyOp]:
        """Reserve slots for ``n_tokens`` new tokens; -> copies to run first (a shared, partly filled last
        block). All-or-nothing: OutOfBlocks, with nothing changed, when the pool is short."""
        if n_tokens < 0:
            raise InvalidRequest(f"cannot append a negative number of tokens ({n_tokens})")
        pool = self.pool
        blocks = self.blocks
        filled = self.num_tokens % pool.block_size
        need, cow = self._growth(n_tokens)
        end = self.num_tokens + n_tokens
        if need > pool.num_free:
            raise OutOfBlocks(need, pool.num_free, pool.num_evictable)
        copies: list[CopyOp] = []
        if need:
            last = len(blocks) - 1
            prev = last - 1 if cow else last  # the block the new ones follow (the last is replaced)
            pool.allocate_into(blocks, need, blocks[prev] if prev >= 0 else 0)
            if cow:  # the newest block replaces the shared last one
                src = blocks[last]
                dst = blocks.pop()
                copies.append((src, dst, filled))
                blocks[last] = dst
                pool.decref(src)
        self.num_tokens = end
        return copies

    def new_blocks_for(self, n_tokens: int) -> int:
        """Fresh blocks :meth:`append` ``(n_tokens)`` takes: growth, plus the copy of a shared, partly
        filled last block that the first new token would write into."""
        return self._growth(n_tokens)[0]

    def _growth(self, n_tokens: int) -> tuple[int, bool]:
        B = self.pool.block_size
        cow = n_tokens > 0 and self.num_tokens % B > 0 and self.pool.refcount(self.blocks[-1]) > 1
        return -(-(self.num_tokens + n_tokens) // B) - len(self.blocks) + cow, cow

    def append_slots(self, n_tokens: int) -> AppendResult:
        """:meth:`append`, also listing the new tokens' slots (a Python step per token: callers that
        build device tensors from the block table use :meth:`append`)."""
        start = self.num_tokens
        copies = self.append(n_tokens)
        B = self.pool.block_size
        blocks = self.blocks
        return AppendResult([blocks[p // B] * B + p % B for p in range(start, start + n_tokens)], copies)

    def truncate(self, n_tokens: int) -> int:
        """Shrink to the first ``n_tokens`` slots (rejected draft tokens); -> blocks freed. Leased blocks
        stay: only the table's own blocks past the new end lose its reference."""
        B = self.pool.block_size
        if not self.leased * B <= n_tokens <= self.num_tokens:
            raise InvalidRequest(
                f"truncate({n_tokens}) outside [{self.leased * B}, {self.num_tokens}] (leased blocks stay)"
            )
        keep = -(-n_tokens // B)
        dropped = self.blocks[keep:]
        del self.blocks[keep:]
        self.num_tokens = n_tokens
        return self.pool.decref_all(dropped) if dropped else 0

    def fork(self, k: int) -> list[BlockTable]:
        """``k`` new tables sharing every block (metadata only: k references more per block the table
        holds; leased blocks stay leased)."""
        if k < 0:
            raise InvalidRequest(f"fork needs k >= 0, got {k}")
        pool = self.pool
        out: list[BlockTable] = []
        for _ in range(k):
            pool.incref_all(self.blocks[self.leased :])
            t = BlockTable(pool)
            t.blocks = array("i", self.blocks)
            t.num_tokens = self.num_tokens
            t.leased = self.leased  # each fork's owner needs a lease on the same path (Lease.clone)
            out.append(t)
        return out

    def release(self) -> int:
        """Drop every reference (idempotent; the table is empty and reusable); -> blocks freed."""
        blocks = self.blocks
        leased = self.leased
        self.blocks = array("i")
        self.num_tokens = self.leased = 0
        if leased == len(blocks):  # every block is the tree's (a finished sequence inserted them all)
            return 0
        return self.pool.decref_all(blocks[leased:] if leased else blocks)

    def __repr__(self) -> str:
        return (
            f"BlockTable(num_tokens={self.num_tokens}, blocks={self.blocks.tolist()}, leased={self.leased})"
        )


_pool_of = attrgetter("pool")


def _roomy(tables: Sequence[BlockTable]) -> list[bool]:
    """Per table: its last block is partly filled and held by it alone, so its next token goes there
    with no allocation and no copy. One vectorized refcount read for the whole batch."""
    pool = tables[0].pool
    if len(set(map(_pool_of, tables))) != 1:
        raise InvalidRequest("a decode batch's tables must share one pool")
    B = pool.block_size
    # NOTE: a table that ends on a block boundary asks about the null block, which never has a holder.
    return pool.solo(array("i", [t.blocks[-1] if t.num_tokens % B else 0 for t in tables]))


def blocks_for_one_each(tables: Sequence[BlockTable]) -> int:
    """Fresh blocks :func:`append_one_each` may take: one per table whose next token starts a block or
    writes into a shared last block (copy-on-write). An upper bound: of forks sharing a last block,
    the last to copy finds that block its own again and takes none."""
    return len(tables) - sum(_roomy(tables)) if tables else 0


def append_one_each(
    tables: Sequence[BlockTable], make_room: Callable[[int], bool] | None = None
) -> list[CopyOp]:
    """``append(1)`` on each of ``tables`` (distinct tables of one pool: a decode step); -> the copies
    to run first. All-or-nothing: OutOfBlocks, with nothing changed, when the pool is short and
    ``make_room(need)`` (asked once) does not free enough."""
    if not tables:
        return []
    roomy = _roomy(tables)
    need = len(tables) - sum(roomy)
    pool = tables[0].pool
    # NOTE: freeing cache cannot make a roomy block shared (it is the table's alone); it may leave a
    # shared last block solo, which `append(1)` then finds and writes in place: `need` stays a bound.
    if need > pool.num_free and (make_room is None or not make_room(need) or need > pool.num_free):
        raise OutOfBlocks(need, pool.num_free, pool.num_evictable)
    copies: list[CopyOp] = []
    for t, room in zip(tables, roomy, strict=True):
        if room:
            t.num_tokens += 1
        else:
            copies += t.append(1)
    return copies
