"""BlockIds: block ids packed as native int32, the form in which the tree stores and hands out blocks.

A run of fresh ids is one slice; checking ids against the tree's (or a run) is one memcmp.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator
from operator import index
from typing import Any, SupportsIndex, overload

import numpy as np
import numpy.typing as npt

ID_BYTES = 4
"""Bytes per packed block id (native int32)."""
unpack_id = struct.Struct("i").unpack_from
"""``unpack_id(packed, offset) -> (id,)``: one packed id, read in place."""


def packed_getitem(packed: bytes, key: SupportsIndex | slice, name: str) -> int | bytes:
    """``packed[key]`` counting native int32 items (``BlockIds``, ``TokenKey``): an int, or packed bytes."""
    n = bytes.__len__(packed) // ID_BYTES
    if isinstance(key, slice):
        start, stop, step = key.indices(n)
        if step == 1:
            return bytes.__getitem__(packed, slice(start * ID_BYTES, max(start, stop) * ID_BYTES))
        return array("i", packed)[key].tobytes()
    i = index(key)
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(f"{name} index out of range")
    got: int = unpack_id(packed, i * ID_BYTES)[0]
    return got


class BlockIds(bytes):
    """Packed block ids that behave like a read-only sequence of ints (``len``, indexing, slicing count
    ids); equality is that of the packed bytes."""

    __slots__ = ()

    def __len__(self) -> int:
        return bytes.__len__(self) // ID_BYTES

    @overload
    def __getitem__(self, key: SupportsIndex) -> int: ...
    @overload
    def __getitem__(self, key: slice) -> BlockIds: ...
    def __getitem__(self, key: SupportsIndex | slice) -> int | BlockIds:
        got = packed_getitem(self, key, "BlockIds")
        return got if isinstance(got, int) else BlockIds(got)

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def tolist(self) -> list[int]:
        return array("i", self).tolist()

    def array(self) -> npt.NDArray[np.int32]:
        """The ids as a read-only ``int32`` array sharing this object's memory (no copy)."""
        return np.frombuffer(self, dtype=np.int32)

    def __repr__(self) -> str:
        return f"BlockIds({self.tolist()})"

    __str__ = __repr__


EMPTY = BlockIds()


def first_id(blocks: bytes) -> int:
    """The first of packed ids (``blocks`` must not be empty)."""
    got: int = unpack_id(blocks)[0]
    return got


def differing_ids(mine: bytes, start: int, node_blocks: bytes, lo: int, hi: int) -> list[int]:
    """The caller's ids (packed ``mine``, from id ``start`` on) that differ from ``node_blocks[lo:hi]``."""
    theirs = bytes.__getitem__(node_blocks, slice(lo * ID_BYTES, hi * ID_BYTES))
    if mine.startswith(theirs, start * ID_BYTES):  # the tree's own blocks (the usual case): one memcmp
        return []
    a = array("i", bytes.__getitem__(mine, slice(start * ID_BYTES, (start + hi - lo) * ID_BYTES)))
    return [x for x, y in zip(a, array("i", theirs), strict=True) if x != y]


def spells_runs(blocks: bytes, id_bytes: bytes, runs: list[tuple[int, int]]) -> bool:
    """Whether ``blocks`` (packed) is exactly the ids of ``runs`` in order: one in-place memcmp per run
    against ``id_bytes`` (the pool's ids ``0 .. num_blocks-1``, packed)."""
    mv = memoryview(blocks)
    i = 0
    for a, k in runs:
        if a < 1 or not id_bytes.startswith(mv[i : i + k * ID_BYTES], a * ID_BYTES):
            return False
        i += k * ID_BYTES
    return i == bytes.__len__(blocks)


def packed_runs(blocks: bytes, id_bytes: bytes, max_runs: int = 8) -> list[tuple[int, int]] | None:
    """``blocks`` (packed) as at most ``max_runs`` runs of consecutive ascending ids ``[(first, length)]``,
    or None when more fragmented or out of range. One run is proven by one memcmp against ``id_bytes``
    (the pool's ids, packed), several by one vectorised pass."""
    nbytes = bytes.__len__(blocks)
    n = nbytes // ID_BYTES
    if not n:
        return []
    a = first_id(blocks)
    if a >= 1 and id_bytes.startswith(blocks, a * ID_BYTES):  # consecutive ids, compared in place: one run
        return [(a, n)]
    ids: Any = memoryview(blocks).cast("i")
    # Several runs: one vectorised pass finds where consecutive ids break.
    arr = np.frombuffer(blocks, dtype=np.int32)
    ends = (arr[1:] != arr[:-1] + 1).nonzero()[0].tolist()
    if len(ends) >= max_runs:
        return None
    limit = bytes.__len__(id_bytes) // ID_BYTES
    runs: list[tuple[int, int]] = []
    i = 0
    for e in [*ends, n - 1]:
        a = ids[i]
        k = e + 1 - i
        if a < 1 or a + k > limit:
            return None  # the null block or out of range: the caller's per-block path reports it
        runs.append((a, k))
        i = e + 1
    return runs


def disjoint_within(runs: list[tuple[int, int]], nblocks: int) -> bool:
    """Runs lie in [1, nblocks) and do not overlap (no block is given twice)."""
    if len(runs) == 1:
        a, k = runs[0]
        return a >= 1 and a + k <= nblocks
    end = 1
    for a, k in sorted(runs):
        if a < end:
            return False
        end = a + k
    return end <= nblocks
