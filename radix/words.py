"""BlockWords: one int64 state word per block (``owner_id << OWNER_SHIFT | refcount``) and the block ids.

The single record of who holds a block, written a run of words at a time (one memcpy per run).
"""

from __future__ import annotations

from array import array
from typing import NoReturn

import numpy as np
import numpy.typing as npt

from radixd.radix.errors import DoubleFree, InvalidRequest

NULL_BLOCK = 0
"""Block 0 is never handed out: padded block-table entries point at it."""
RC_MASK = 0xFFFFFFFF
"""The refcount half of a state word."""
OWNER_SHIFT = 32
"""The owner id sits above this bit (0: no owner)."""
WORD_BYTES = 8


class BlockWords:
    """The state words of ``num_blocks`` blocks, and every block id as an int and packed (int32)."""

    # NOTE: invariants: free blocks (and block 0) have word 0; `state` is never resized, so the byte
    # view `raw` stays valid.

    __slots__ = (
        "_ones",
        "_ones_view",
        "_zeros_view",
        "id_bytes",
        "id_view",
        "ids",
        "num_blocks",
        "raw",
        "state",
    )

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.state: npt.NDArray[np.int64] = np.zeros(num_blocks, dtype=np.int64)
        self.raw = memoryview(self.state.data).cast("B")  # the words as bytes, for run writes
        # Words of "refcount 1, no owner" (a fresh allocation) and of 0, as bytes to copy from.
        self._ones = np.ones(num_blocks, dtype=np.int64).tobytes()
        self._ones_view = memoryview(self._ones)
        self._zeros_view = memoryview(bytes(WORD_BYTES * num_blocks))
        # Every id as an int object (allocations hand out slices of it: no new ints) and packed, so that
        # a packed allocation is a slice and one memcmp proves that packed ids form a run.
        self.ids: list[int] = list(range(num_blocks))
        self.id_bytes = np.arange(num_blocks, dtype=np.int32).tobytes()
        self.id_view = memoryview(self.id_bytes)

    # ------------------------------------------------------------ run writes
    def set_fresh(self, a: int, n: int) -> None:
        """Blocks ``[a, a + n)`` get refcount 1 and no owner."""
        self.raw[a * WORD_BYTES : (a + n) * WORD_BYTES] = self._ones_view[: n * WORD_BYTES]

    def clear(self, a: int, e: int) -> None:
        """Blocks ``[a, e)`` get word 0 (free)."""
        self.raw[a * WORD_BYTES : e * WORD_BYTES] = self._zeros_view[: (e - a) * WORD_BYTES]

    def fill(self, a: int, n: int, word: bytes) -> None:
        """Blocks ``[a, a + n)`` get the packed state word ``word``."""
        self.raw[a * WORD_BYTES : (a + n) * WORD_BYTES] = word * n

    def fresh(self, runs: list[tuple[int, int]]) -> bool:
        """Whether every block of ``runs`` has refcount 1 and no owner (one memcmp per run)."""
        ones, raw = self._ones, self.raw
        if len(runs) == 1:  # the common case, without a generator
            a, k = runs[0]
            return ones.startswith(raw[a * WORD_BYTES : (a + k) * WORD_BYTES])
        return all(ones.startswith(raw[a * WORD_BYTES : (a + k) * WORD_BYTES]) for a, k in runs)

    # ----------------------------------------------------------------- reads
    def refcount(self, block: int) -> int:
        self.check_id(block)
        return int(self.state[block]) & RC_MASK

    def solo(self, blocks: array[int]) -> list[bool]:
        """Whether each of ``blocks`` (packed ids) has refcount 1, in one vectorized read."""
        if not blocks:
            return []
        ids = np.frombuffer(blocks, dtype=np.int32)
        if int(ids.min()) < 0 or int(ids.max()) >= self.num_blocks:
            self.check_id(next(b for b in blocks if not 0 <= b < self.num_blocks))
        return ((self.state[ids] & RC_MASK) == 1).tolist()  # type: ignore[no-any-return]

    def refcounts(self) -> list[int]:
        """Every block's refcount, by id (O(num_blocks))."""
        return (self.state & RC_MASK).tolist()  # type: ignore[no-any-return]

    def owner_ids(self) -> list[int]:
        """Every block's owner id (0: none), by id (O(num_blocks))."""
        return (self.state >> OWNER_SHIFT).tolist()  # type: ignore[no-any-return]

    # ------------------------------------------------------------ validation
    def check_id(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise InvalidRequest(f"block id {block} is out of range [0, {self.num_blocks})")

    def bad_incref(self, block: int) -> NoReturn:
        """Raise the error for gaining a holder on ``block`` (out of range, the null block, or free)."""
        self.check_id(block)
        if block == NULL_BLOCK:
            raise InvalidRequest("block 0 is the null block; it is never allocated or shared")
        raise InvalidRequest(f"block {block} is free; only allocated blocks can gain holders (incref)")

    def bad_decref(self, block: int) -> NoReturn:
        """Raise the error for dropping a holder of ``block`` (out of range, the null block, or free)."""
        self.check_id(block)
        if block == NULL_BLOCK:
            raise InvalidRequest("block 0 is the null block; it is never allocated or released")
        raise DoubleFree(f"block {block} is already free: one of its holders released it twice")
