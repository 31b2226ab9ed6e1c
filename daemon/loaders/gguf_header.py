"""A GGUF file's header: its metadata and where each tensor lies, read in one pass.

gguf-py's reader builds a numpy view per field element, which takes seconds on a vocabulary of 50k-260k
strings; this reads the same format (versions 2 and 3, little-endian) with `struct` and numpy bulk
reads, and touches nothing past the header.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF value type -> (struct format, numpy dtype) of the scalar types.
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"),
    1: ("<b", "<i1"),
    2: ("<H", "<u2"),
    3: ("<h", "<i2"),
    4: ("<I", "<u4"),
    5: ("<i", "<i4"),
    6: ("<f", "<f4"),
    7: ("<?", "<u1"),
    10: ("<Q", "<u8"),
    11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_STRING, _ARRAY, _BOOL = 8, 9, 7


class GGUFFormatError(ValueError):
    """The bytes are not a GGUF file this reader understands; the message says where."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: `dims` in ggml order (the row length first), GGUF type id, absolute byte offset."""

    name: str
    dims: tuple[int, ...]
    type_id: int
    offset: int


class _Cursor:
    def __init__(self, buf: mmap.mmap, arrays: bool) -> None:
        self.buf, self.at, self.arrays = buf, 0, arrays

    def take(self, fmt: str) -> Any:
        try:
            (v,) = struct.unpack_from(fmt, self.buf, self.at)
        except struct.error as e:
            raise GGUFFormatError(f"the header ends early (at byte {self.at})") from e
        self.at += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("<Q")
        if n > len(self.buf) - self.at:
            raise GGUFFormatError(f"a string of {n} bytes at byte {self.at} runs past the file's end")
        s = bytes(self.buf[self.at : self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return s

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            v = self.take(_SCALARS[vtype][0])
            return bool(v) if vtype == _BOOL else v
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.take("<I"), self.take("<Q")
            if not self.arrays:
                return self._skip_array(etype, count)
            if etype in _SCALARS:
                dtype = np.dtype(_SCALARS[etype][1])
                end = self.at + count * dtype.itemsize
                if end > len(self.buf):
                    raise GGUFFormatError(f"an array of {count} values at byte {self.at} run past the end")
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.at)
                self.at = end
                return [bool(x) for x in arr] if etype == _BOOL else arr.tolist()
            return [self.value(etype) for _ in range(count)]
        raise GGUFFormatError(f"unknown GGUF value type {vtype} at byte {self.at}")

    def _skip_array(self, etype: int, count: int) -> None:
        if etype in _SCALARS:
            self.at += count * struct.calcsize(_SCALARS[etype][0])
        elif etype == _STRING:
            for _ in range(count):
                self.at += 8 + self.take("<Q")
        else:
            for _ in range(count):
                self.value(etype)


class GGUFHeader:
    """`fields`: metadata key -> value (arrays as lists, or None with `arrays=False`, which skips their
    contents: the cheap read of a file's scalars); `tensors`: in file order."""

    def __init__(self, path: str, arrays: bool = True) -> None:
        self._arrays = arrays
        with open(path, "rb") as f:
            try:
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as e:  # an empty file
                raise GGUFFormatError("the file is empty") from e
        try:
            self._read(buf)
        finally:
            buf.close()

    def _read(self, buf: mmap.mmap) -> None:
        if bytes(buf[:4]) != MAGIC:
            raise GGUFFormatError("it does not start with the GGUF magic bytes")
        c = _Cursor(buf, self._arrays)
        c.at = 4
        version = c.take("<I")
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} (supported: 2, 3; big-endian files are not)")
        n_tensors, n_kv = c.take("<Q"), c.take("<Q")
        self.fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = c.string()
            self.fields[key] = c.value(c.take("<I"))
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            dims = tuple(c.take("<Q") for _ in range(c.take("<I")))
            infos.append((name, dims, c.take("<I"), c.take("<Q")))
        align = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-c.at // align) * align
        self.tensors = [TensorInfo(n, d, t, start + off) for n, d, t, off in infos]
        for t in self.tensors:
            if t.offset > len(buf):
                raise GGUFFormatError(f"tensor {t.name} starts past the file's end (the file is truncated?)")

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)
