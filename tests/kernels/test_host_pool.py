"""CPU KV pools in one mapping on huge pages (kernels/host_pool.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from radixd.kernels import cpu_pools
from radixd.kernels.host_pool import HUGE_PAGE, huge_page_bytes

THP = Path("/sys/kernel/mm/transparent_hugepage")


def thp_setting(name: str) -> str:
    """The bracketed choice of a THP setting ("" where the file is missing)."""
    try:
        text = (THP / name).read_text()
    except OSError:
        return ""
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else ""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_pools_are_zeroed_separate_and_aligned(dtype: torch.dtype) -> None:
    shape = (257, 16, 3, 64)  # an odd block count: pools are not multiples of 64 bytes apart by luck
    pools = cpu_pools(6, shape, dtype)
    assert len(pools) == 6
    for p in pools:
        assert p.shape == shape and p.dtype == dtype and p.is_contiguous()
        assert p.data_ptr() % 64 == 0
        assert not p.any()
    for i, p in enumerate(pools):
        p.fill_(i + 1)
    for i, p in enumerate(pools):
        assert bool((p == i + 1).all()), f"pool {i} was written through another"
    ends = sorted((p.data_ptr(), p.data_ptr() + p.nbytes) for p in pools)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(ends))


def test_small_pools_are_plain_tensors() -> None:
    pools = cpu_pools(2, (4, 16, 3, 64), torch.float16)
    assert all(p.nbytes < HUGE_PAGE and not p.any() for p in pools)


def test_pools_outlive_their_mapping_handle() -> None:
    """The views keep the mapping: dropping all but one pool leaves it readable and writable."""
    keep = cpu_pools(4, (512, 16, 3, 64), torch.float32)[2]
    keep.fill_(3.0)
    assert float(keep.sum()) == 3.0 * keep.numel()


@pytest.mark.skipif(
    thp_setting("enabled") not in ("always", "madvise")
    or thp_setting("defrag") not in ("always", "defer+madvise", "madvise"),
    reason="this kernel gives no huge pages to madvised ranges on their first touch",
)
def test_pools_lie_on_huge_pages_where_the_kernel_gives_them() -> None:
    """Where THP serves madvised ranges and compacts for them at fault time, the pools are huge pages
    (the point of the module: torch.zeros gets none in THP's madvise mode)."""
    pools = cpu_pools(4, (1024, 16, 3, 64), torch.float16)  # 4 x 6 MiB
    assert pools[0].data_ptr() % HUGE_PAGE == 0
    total = sum(p.nbytes for p in pools)
    assert sum(huge_page_bytes(p) for p in pools) >= total // 2
