"""The host process's resources: compute threads, the garbage collector, freed heap, huge pages.

Threads default to min(torch's default, usable CPUs). The startup heap is frozen out of the cyclic GC
(full collections would stall steps); `HeapReleaser` runs `malloc_trim` only when idle; KV pools sit on
2 MiB pages where Linux lends them (scattered blocks miss the TLB)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import math
import mmap
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import torch

ENV_THREADS = "RADIXD_NUM_THREADS"
HUGE_PAGE = 2 << 20  # a transparent huge page on x86-64 and on arm64 with 4 KiB base pages
MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)  # Linux's madvise advice
# Idle time after which freed heap is released: longer than the gap between two steps or two
# back-to-back requests of one client, short enough that an idle daemon's RSS reflects live memory.
IDLE_RELEASE_S = 0.2


def cpu_quota(cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """CPUs the cgroup quota grants (rounded up), None when no quota is set (cgroup v2 or v1)."""
    for quota_file, period_file in (
        (cgroup / "cpu.max", None),
        (cgroup / "cpu" / "cpu.cfs_quota_us", cgroup / "cpu" / "cpu.cfs_period_us"),
    ):
        try:
            fields = quota_file.read_text().split()
            if period_file is not None:
                fields = [fields[0], period_file.read_text().strip()]
        except (OSError, IndexError):
            continue
        if len(fields) < 2 or fields[0] in ("max", "-1"):
            return None
        try:
            quota, period = int(fields[0]), int(fields[1])
        except ValueError:
            return None
        return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None
    return None


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by the cgroup quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(n, quota) if quota is not None else n)


def configure_threads() -> int:
    """Set torch's intra-op threads (RADIXD_NUM_THREADS, else min(default, usable CPUs)); -> the count."""
    env = os.environ.get(ENV_THREADS, "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{ENV_THREADS} must be a positive integer, got {env!r}")
    else:
        n = min(torch.get_num_threads(), usable_cpus())
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n


@contextmanager
def startup_heap_frozen() -> Iterator[int]:
    """Collect, then exempt every object alive now from GC while the block runs; yields the count.
    For a process serving one engine: frozen objects are never collected (thawed at the end)."""
    gc.collect()
    gc.freeze()
    try:
        yield gc.get_freeze_count()
    finally:
        gc.unfreeze()


@functools.cache
def _libc() -> ctypes.CDLL | None:
    # The process's own symbols first: find_library runs `ldconfig -p` (a subprocess, at start-up).
    for name in (None, "libc.so.6", "find"):
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") if name == "find" else name)
        except OSError:
            continue
        if hasattr(lib, "malloc"):
            return lib
    return None


def _libc_call(name: str, argtypes: list[type], restype: type) -> Callable[..., int] | None:
    """The C library's function `name` with its signature set; None where the library lacks it."""
    fn = getattr(_libc(), name, None)
    if fn is None:
        return None
    fn.argtypes = argtypes
    fn.restype = restype
    return cast(Callable[..., int], fn)


def zeros_on_huge_pages(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed contiguous CPU tensor, 2 MiB-aligned and advised as huge pages (elsewhere, or under
    2 MiB: `torch.zeros`). A view into a slightly longer anonymous mapping, which the kernel zeroes
    page by page on first touch: a pool costs neither start-up time nor memory until it is used."""
    nbytes = math.prod(shape) * dtype.itemsize
    if sys.platform != "linux" or nbytes < HUGE_PAGE:
        return torch.zeros(tuple(shape), dtype=dtype)
    buf = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(buf, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE
    with contextlib.suppress(OSError):  # advice only: a refusal leaves 4 KiB pages
        buf.madvise(MADV_HUGEPAGE, start, nbytes - nbytes % mmap.PAGESIZE)
    return whole[start : start + nbytes].view(dtype).view(tuple(shape))


class HeapReleaser:
    """Releases freed heap to the OS once per busy period, after `idle_s` without work (engine thread)."""

    def __init__(self, idle_s: float = IDLE_RELEASE_S) -> None:
        self.idle_s = idle_s
        # glibc only: musl and macOS have no malloc_trim
        self._trim = _libc_call("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
        self._dirty = False
        self._busy_at = 0.0
        self.releases = 0

    @property
    def available(self) -> bool:
        """Whether this C library can release heap (glibc's malloc_trim)."""
        return self._trim is not None

    def busy(self, now: float) -> None:
        """A step ran at `now` (time.monotonic())."""
        self._dirty = True
        self._busy_at = now

    def idle(self, now: float) -> bool:
        """Release if the engine has been idle long enough since its last step; -> released now."""
        if not self._dirty or now - self._busy_at < self.idle_s:
            return False
        self._dirty = False
        if self._trim is None:
            return False
        self._trim(0)
        self.releases += 1
        return True
