"""store_kv: write the new tokens' K/V rows into their pool slots (``slot = block * B + offset``).

A slot of -1 marks a padded entry and is skipped. Slots must be distinct (each names one token).
"""

from __future__ import annotations

import torch

from radixd.kernels.checks import check_cache, check_int_vector
from radixd.kernels.dispatch import LazyKernel, check_same_device, resolve_backend, tl, triton


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    backend: str | None = None,
) -> None:
    """Write k/v [T, Hkv, D] into k_cache/v_cache [N, B, Hkv, D] at ``slot_mapping`` (int64 [T]; -1 skips)."""
    op = "store_kv"
    _, _, hkv, d = check_cache(op, k_cache, v_cache)
    if k.dim() != 3 or k.shape[1:] != (hkv, d) or v.shape != k.shape:
        raise ValueError(
            f"{op}: k and v must both be [T, {hkv}, {d}] to match the cache, "
            f"got {tuple(k.shape)}/{tuple(v.shape)}"
        )
    check_int_vector(op, "slot_mapping", slot_mapping, k.shape[0])
    dev = check_same_device(op, k, v, k_cache, v_cache, slot_mapping)
    if resolve_backend(backend, dev) == "torch":
        store_kv_torch(k, v, k_cache, v_cache, slot_mapping)
    else:
        store_kv_triton(k, v, k_cache, v_cache, slot_mapping)


def _slot_view(cache: torch.Tensor) -> torch.Tensor:
    """The pool as [N*B, Hkv, D] rows sharing storage with ``cache`` (needs a dense pool)."""
    n, b, h, d = cache.shape
    if cache.stride(0) != b * h * d:
        raise ValueError(
            "store_kv (torch): the pool must be contiguous (block stride B*H*D) so slots are rows; "
            f"got strides {cache.stride()}"
        )
    return cache.view(n * b, h, d)


def store_kv_torch(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Torch twin of :func:`store_kv`: one masked index_copy per pool."""
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):
        slots, k, v = slots[keep], k[keep], v[keep]
    _slot_view(k_cache).index_copy_(0, slots, k.to(k_cache.dtype))
    _slot_view(v_cache).index_copy_(0, slots, v.to(v_cache.dtype))


def _store_kv_kernel(
    k_ptr: tl.tensor,
    v_ptr: tl.tensor,
    kc_ptr: tl.tensor,
    vc_ptr: tl.tensor,
    slot_ptr: tl.tensor,
    stride_kt: tl.tensor,
    stride_kh: tl.tensor,
    stride_vt: tl.tensor,
    stride_vh: tl.tensor,
    stride_kcn: tl.tensor,
    stride_vcn: tl.tensor,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
) -> None:
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    valid = slot >= 0
    block = tl.where(valid, slot, 0) // BLOCK_SIZE
    offset = tl.where(valid, slot, 0) % BLOCK_SIZE
    i = tl.arange(0, TILE)
    h = i // HEAD_DIM
    d = i % HEAD_DIM
    # NOTE: the scalar `valid` is broadcast to the tile explicitly (the interpreter rejects a 0-d mask).
    mask = (i < NUM_KV_HEADS * HEAD_DIM) & ((i.to(tl.int64) * 0 + slot) >= 0)
    row = offset * (NUM_KV_HEADS * HEAD_DIM) + i  # dense inside a block
    kv = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask, other=0.0)
    tl.store(kc_ptr + block * stride_kcn + row, kv.to(kc_ptr.dtype.element_ty), mask=mask)
    vv = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask, other=0.0)
    tl.store(vc_ptr + block * stride_vcn + row, vv.to(vc_ptr.dtype.element_ty), mask=mask)


_kernel = LazyKernel(_store_kv_kernel)


def store_kv_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Launch the Triton store: one program per token, all heads in one tile."""
    t = k.shape[0]
    if t == 0:
        return
    _, b, hkv, d = k_cache.shape
    if k.stride(2) != 1:
        k = k.contiguous()
    if v.stride(2) != 1:
        v = v.contiguous()
    _kernel[(t,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        v_cache.stride(0),
        NUM_KV_HEADS=hkv,
        HEAD_DIM=d,
        BLOCK_SIZE=b,
        TILE=triton.next_power_of_2(hkv * d),
        num_warps=4,
    )
