"""Matrices as a GGUF file stores them: memory-mapped blocks, never widened at load.

A `Stored` is one tensor's rows in its file format (`kind`: the GGUF type name). Its bytes view a
copy-on-write mapping of the file, so replicas of one file share their pages and loading reads nothing
it does not use; `dequantize()` widens it to fp32 only where a precision asks for floats. A fused
projection (q, k, v; gate, up) is a tuple of parts, each in its own format.
NOTE: the mapping is never written: a tensor that must change (a row permutation, another layout) is
copied out and the pages it came from are released (`release`), so it is not held twice.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np
import torch

# GGUF type -> (weights a block, bytes a block); the float types are blocks of one weight.
BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}
FLOATS = ("F32", "F16", "BF16")
_FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


class FileMap:
    """A read-only view of a whole file as one copy-on-write mapping (its pages shared with the page
    cache and with other processes mapping the file)."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self.size = len(self._map)

    def bytes_at(self, offset: int, count: int) -> torch.Tensor:
        """uint8 [count] viewing the file at `offset` (the tensor keeps the mapping alive)."""
        if offset < 0 or offset + count > self.size:
            raise ValueError(f"bytes {offset}..{offset + count} lie outside the file ({self.size} bytes)")
        return torch.frombuffer(self._map, dtype=torch.uint8, count=count, offset=offset)

    def release(self, offset: int, count: int) -> None:
        """Drop the pages of bytes `offset`..`offset + count` from this process (read again on use)."""
        page = mmap.PAGESIZE
        start = -(-offset // page) * page
        end = (offset + count) // page * page
        if end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)


@dataclass(frozen=True)
class Stored:
    """A [rows, cols] matrix in GGUF format `kind`: `data` is uint8 [rows, bytes a row] (the float
    kinds: their dtype [rows, cols]), row r holding weight row r's blocks in input order."""

    kind: str
    rows: int
    cols: int
    data: torch.Tensor
    # Where `data` views a file: its mapping and byte offset (`release`).
    origin: FileMap | None = None
    offset: int = 0

    def __post_init__(self) -> None:
        per, size = BLOCKS[self.kind]
        if self.cols % per:
            raise ValueError(f"a {self.kind} row holds whole blocks of {per}, got {self.cols} weights")
        want = (self.rows, self.cols) if self.kind in FLOATS else (self.rows, self.cols // per * size)
        if tuple(self.data.shape) != want:
            got = tuple(self.data.shape)
            raise ValueError(f"{self.kind} [{self.rows}, {self.cols}] data must be {want}, got {got}")

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def dequantize(self) -> torch.Tensor:
        """fp32 [rows, cols]: the weights the file's format encodes (gguf-py's reference arithmetic)."""
        if self.kind in FLOATS:
            return self.data.float()
        import gguf.quants

        kind = gguf.GGMLQuantizationType[self.kind]
        return torch.from_numpy(np.asarray(gguf.quants.dequantize(self.data.numpy(), kind), dtype=np.float32))

    def take_rows(self, index: torch.Tensor) -> Stored:
        """The rows `index` (a permutation or a subset) as a new matrix in its own memory."""
        return Stored(self.kind, int(index.numel()), self.cols, self.data.index_select(0, index).contiguous())

    def release(self) -> None:
        """Once the data was copied elsewhere: drop the file pages this matrix read (no-op if not mapped)."""
        if self.origin is not None:
            self.origin.release(self.offset, self.nbytes)


# A weight as a loader hands it over: float rows, or a matrix's stored parts (outputs in order).
Weight = torch.Tensor | tuple[Stored, ...]


def stored_from_file(fm: FileMap, kind: str, shape: tuple[int, int], offset: int) -> Stored:
    """The matrix of GGUF type `kind` and [rows, cols] `shape` whose data starts at byte `offset`."""
    if kind not in BLOCKS:
        raise ValueError(kind)
    rows, cols = shape
    per, size = BLOCKS[kind]
    row_bytes = cols // per * size
    raw = fm.bytes_at(offset, rows * row_bytes)
    if kind in FLOATS:
        return Stored(kind, rows, cols, raw.view(_FLOAT_DTYPES[kind]).view(rows, cols), fm, offset)
    return Stored(kind, rows, cols, raw.view(rows, row_bytes), fm, offset)
