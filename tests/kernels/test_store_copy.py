"""store_kv and copy_blocks: exact writes, skips, copy-on-write and host/device pool swaps."""

from __future__ import annotations

import pytest
import torch

from radixd.kernels import copy_blocks, store_kv


def _pool(
    n: int = 8, b: int = 4, h: int = 2, d: int = 80, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return torch.randn(n, b, h, d).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_store_kv_writes_slots_and_skips_minus_one(backend: str, dtype: torch.dtype) -> None:
    kc, vc = _pool(dtype=dtype), _pool(dtype=dtype)
    k0, v0 = kc.clone(), vc.clone()
    k = torch.randn(6, 2, 80).to(dtype)
    v = torch.randn(6, 2, 80).to(dtype)
    slots = torch.tensor([5, -1, 0, 31, -1, 12], dtype=torch.int64)
    store_kv(k, v, kc, vc, slots, backend=backend)
    want_k, want_v = k0.view(32, 2, 80).clone(), v0.view(32, 2, 80).clone()
    keep = slots >= 0
    want_k[slots[keep]] = k[keep]
    want_v[slots[keep]] = v[keep]
    assert torch.equal(kc.view(32, 2, 80), want_k)
    assert torch.equal(vc.view(32, 2, 80), want_v)


def test_store_kv_strided_input(backend: str) -> None:
    """k/v often arrive as views of a fused qkv projection (non-contiguous token stride)."""
    kc, vc = _pool(), _pool()
    qkv = torch.randn(3, 3, 2, 80)
    k, v = qkv[:, 1], qkv[:, 2]
    store_kv(k, v, kc, vc, torch.tensor([1, 2, 3]), backend=backend)
    assert torch.equal(kc.view(32, 2, 80)[1:4], k)
    assert torch.equal(vc.view(32, 2, 80)[1:4], v)


def test_copy_on_write_leaves_source_intact(backend: str) -> None:
    layers = 3
    ks = [_pool() for _ in range(layers)]
    vs = [_pool() for _ in range(layers)]
    k0 = [t.clone() for t in ks]
    v0 = [t.clone() for t in vs]
    ops = torch.tensor([[2, 5, 3], [4, 6, 4], [1, 7, 1]], dtype=torch.int64)
    copy_blocks(ks, vs, ks, vs, ops, backend=backend)
    for before, after in [*zip(k0, ks, strict=True), *zip(v0, vs, strict=True)]:
        for src, dst, n in ops.tolist():
            assert torch.equal(after[dst, :n], before[src, :n])  # copied prefix
            assert torch.equal(after[dst, n:], before[dst, n:])  # tail of dst untouched
            assert torch.equal(after[src], before[src])  # source intact
        untouched = [i for i in range(8) if i not in (5, 6, 7)]
        assert torch.equal(after[untouched], before[untouched])


def test_swap_between_pools(backend: str) -> None:
    """Device pool -> host pool and back (distinct tensors; on CPU both live in host memory)."""
    dev_k, dev_v = [_pool(n=6)], [_pool(n=6)]
    host_k, host_v = [torch.zeros(10, 4, 2, 80)], [torch.zeros(10, 4, 2, 80)]
    out_ops = torch.tensor([[1, 9, 4], [3, 0, 4]])
    copy_blocks(dev_k, dev_v, host_k, host_v, out_ops, backend=backend)
    assert torch.equal(host_k[0][9], dev_k[0][1]) and torch.equal(host_v[0][0], dev_v[0][3])
    back = [torch.zeros(6, 4, 2, 80)], [torch.zeros(6, 4, 2, 80)]
    copy_blocks(host_k, host_v, back[0], back[1], torch.tensor([[9, 2, 4], [0, 5, 4]]), backend=backend)
    assert torch.equal(back[0][0][2], dev_k[0][1]) and torch.equal(back[1][0][5], dev_v[0][3])


def test_copy_blocks_rejects_mismatched_layers() -> None:
    with pytest.raises(ValueError, match="same number of layers"):
        copy_blocks([_pool()], [_pool()], [_pool(), _pool()], [_pool()], torch.zeros(1, 3, dtype=torch.int64))


def test_store_kv_rejects_wrong_head_shape() -> None:
    with pytest.raises(ValueError, match="match the cache"):
        store_kv(torch.zeros(2, 3, 80), torch.zeros(2, 3, 80), _pool(), _pool(), torch.tensor([0, 1]))
