"""KV pools in host memory, on transparent huge pages where Linux offers them.

The CPU attention reads a sequence's KV block by block, and blocks lie anywhere in the pool. On 4 KiB
pages a block (SmolLM2's 16 tokens of keys: 6 KiB in f16) spans two or three pages; the hardware
prefetcher stops at every page boundary, and a 4,000-token context's 30 layers touch ~45,000 pages,
far more than the TLB holds. On 2 MiB pages a block lies in one page with its neighbours in the pool.

Linux's THP in its common `madvise` mode backs a range with huge pages only if it was marked
MADV_HUGEPAGE before its first touch, which torch's allocator never does; `cpu_pools` maps all the
layers' pools at once, marks the mapping, then touches it all (so the pools' memory is committed at
start, as `torch.zeros` commits it, and no page fault falls into a step). Elsewhere, or for pools
under 2 MiB in all, it is `torch.zeros`.
"""

from __future__ import annotations

import contextlib
import math
import mmap

import torch

HUGE_PAGE = 2 << 20


def cpu_pools(count: int, shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    """`count` zeroed CPU tensors of `shape` and `dtype` (a model's layers' pools), in one mapping on
    huge pages where the OS gives them (2 MiB aligned, each tensor 64-byte aligned within), else as
    `torch.zeros` allocates them."""
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    stride = -(-size // 64) * 64
    if count * stride < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return [torch.zeros(shape, dtype=dtype) for _ in range(count)]
    # One huge page more than needed, so that the first tensor can start on a 2 MiB boundary.
    buf = mmap.mmap(-1, count * stride + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # THP compiled out or disabled: plain pages, still zeroed
        buf.madvise(mmap.MADV_HUGEPAGE)
    # NOTE: every view keeps `buf` alive (frombuffer holds it); the mapping goes with the last of them.
    raw = torch.frombuffer(buf, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    arena = raw[start : start + count * stride]
    arena.zero_()  # the first touch: after the advice, so the pages are huge
    return [arena[i * stride : i * stride + size].view(dtype).view(shape) for i in range(count)]


def huge_page_bytes(t: torch.Tensor) -> int:
    """How many bytes of `t` lie on huge pages (Linux's smaps for the range; 0 where unknown)."""
    lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    total = 0
    try:
        with open("/proc/self/smaps") as f:
            in_range = False
            for line in f:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):
                    a, b = (int(x, 16) for x in head.split("-"))
                    in_range = a < hi and b > lo
                elif in_range and head == "AnonHugePages:":
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return min(total, hi - lo)
