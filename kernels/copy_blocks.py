"""copy_blocks: a batch of (src_block, dst_block, n_tokens) copies applied to every layer.

Copy-on-write (one pool) and swapping between the device pool and a host pool (the torch path moves
the gathered rows across). Only a destination's first ``n_tokens`` slots are written.
NOTE: ops are applied as one batch: a block must not be both a destination and a source in one call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixd.kernels.checks import check_cache
from radixd.kernels.dispatch import LazyKernel, resolve_backend, tl, triton

Pools = Sequence[torch.Tensor]  # one pool per layer


def copy_blocks(
    src_k: Pools,
    src_v: Pools,
    dst_k: Pools,
    dst_v: Pools,
    ops: torch.Tensor,
    backend: str | None = None,
) -> None:
    """Copy the first n_tokens slots of block src into block dst, for every layer's K and V pool.

    ``ops``: int64 [n, 3] rows ``(src_block, dst_block, n_tokens)`` on any device. Triton runs when both
    pools share a CUDA device; cross-device copies use torch."""
    op = "copy_blocks"
    layers = len(src_k)
    if not (len(src_v) == len(dst_k) == len(dst_v) == layers):
        raise ValueError(
            f"{op}: src_k/src_v/dst_k/dst_v must list the same number of layers, "
            f"got {len(src_k)}/{len(src_v)}/{len(dst_k)}/{len(dst_v)}"
        )
    if ops.dim() != 2 or ops.shape[1] != 3 or ops.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"{op}: ops must be an int64 [n, 3] tensor of (src, dst, n_tokens), got {ops.dtype} "
            f"{tuple(ops.shape)}"
        )
    if layers == 0 or ops.shape[0] == 0:
        return
    src_dev, dst_dev = src_k[0].device, dst_k[0].device
    for i in range(layers):
        s_shape = check_cache(op, src_k[i], src_v[i])
        d_shape = check_cache(op, dst_k[i], dst_v[i])
        if s_shape[1:] != d_shape[1:]:
            raise ValueError(
                f"{op}: layer {i}: source block shape {s_shape[1:]} != destination {d_shape[1:]}"
            )
        if src_k[i].dtype != dst_k[i].dtype:
            raise ValueError(f"{op}: layer {i}: dtype {src_k[i].dtype} -> {dst_k[i].dtype}; pools must match")
        for t in (src_k[i], src_v[i]):
            if t.device != src_dev:
                raise ValueError(f"{op}: all source pools must be on one device ({src_dev}), got {t.device}")
        for t in (dst_k[i], dst_v[i]):
            if t.device != dst_dev:
                raise ValueError(
                    f"{op}: all destination pools must be on one device ({dst_dev}), got {t.device}"
                )
    name = resolve_backend(backend, dst_dev)
    if name == "triton" and src_dev != dst_dev:
        name = "torch"  # NOTE: a Triton kernel cannot reach the other device's memory
    if name == "torch":
        copy_blocks_torch(src_k, src_v, dst_k, dst_v, ops)
    else:
        copy_blocks_triton(src_k, src_v, dst_k, dst_v, ops)


def _slot_indices(ops: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat slot indices (src, dst) of every copied token, built without a Python loop."""
    ops = ops.long()
    n_tok = ops[:, 2].clamp(min=0, max=block_size)
    total = int(n_tok.sum())
    op_of = torch.repeat_interleave(torch.arange(ops.shape[0], device=ops.device), n_tok, output_size=total)
    starts = torch.cumsum(n_tok, 0) - n_tok
    within = torch.arange(total, device=ops.device) - starts[op_of]
    return ops[op_of, 0] * block_size + within, ops[op_of, 1] * block_size + within


def copy_blocks_torch(src_k: Pools, src_v: Pools, dst_k: Pools, dst_v: Pools, ops: torch.Tensor) -> None:
    """Torch twin: one index_select / index_copy pair per pool; whole blocks when every op is full."""
    b = src_k[0].shape[1]
    src_dev, dst_dev = src_k[0].device, dst_k[0].device
    ops_cpu = ops.long().cpu()
    full = bool((ops_cpu[:, 2] >= b).all())
    if full:
        src_idx, dst_idx = ops_cpu[:, 0], ops_cpu[:, 1]
    else:
        src_idx, dst_idx = _slot_indices(ops_cpu, b)
    src_idx, dst_idx = src_idx.to(src_dev), dst_idx.to(dst_dev)
    for src, dst in [*zip(src_k, dst_k, strict=True), *zip(src_v, dst_v, strict=True)]:
        _copy_rows(src, dst, src_idx, dst_idx, full)


def _copy_rows(
    src: torch.Tensor, dst: torch.Tensor, src_idx: torch.Tensor, dst_idx: torch.Tensor, full: bool
) -> None:
    n, b, h, d = src.shape
    # NOTE: non_blocking only host -> device; a non-blocking device -> host copy could still be in
    # flight when index_copy_ reads it on the CPU.
    non_blocking = dst.device.type == "cuda"
    if full:
        rows = src.index_select(0, src_idx)
        dst.index_copy_(0, dst_idx, rows.to(dst.device, non_blocking=non_blocking))
        return
    if src.stride(0) != b * h * d or dst.stride(0) != b * h * d:
        raise ValueError("copy_blocks (torch): partial-block copies need contiguous pools")
    rows = src.view(n * b, h, d).index_select(0, src_idx)
    dst.view(dst.shape[0] * b, h, d).index_copy_(0, dst_idx, rows.to(dst.device, non_blocking=non_blocking))


def _copy_kernel(
    src_ptr: tl.tensor,
    dst_ptr: tl.tensor,
    ops_ptr: tl.tensor,
    stride_src: tl.tensor,
    stride_dst: tl.tensor,
    ROW: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
) -> None:
    i = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    src = tl.load(ops_ptr + i * 3).to(tl.int64)
    dst = tl.load(ops_ptr + i * 3 + 1).to(tl.int64)
    n_tok = tl.minimum(tl.load(ops_ptr + i * 3 + 2).to(tl.int64), BLOCK_SIZE)
    off = chunk.to(tl.int64) * TILE + tl.arange(0, TILE)
    mask = off < n_tok * ROW
    x = tl.load(src_ptr + src * stride_src + off, mask=mask, other=0.0)
    tl.store(dst_ptr + dst * stride_dst + off, x, mask=mask)


_kernel = LazyKernel(_copy_kernel)
_TILE = 2048


def copy_blocks_triton(src_k: Pools, src_v: Pools, dst_k: Pools, dst_v: Pools, ops: torch.Tensor) -> None:
    """One launch per pool; each program copies one TILE-element chunk of one op's block."""
    _, b, h, d = src_k[0].shape
    ops_dev = ops.to(device=dst_k[0].device, dtype=torch.int64).contiguous()
    row = h * d
    tile = min(_TILE, triton.next_power_of_2(b * row))
    grid = (ops_dev.shape[0], triton.cdiv(b * row, tile))
    for src, dst in [*zip(src_k, dst_k, strict=True), *zip(src_v, dst_v, strict=True)]:
        _kernel[grid](src, dst, ops_dev, src.stride(0), dst.stride(0), ROW=row, BLOCK_SIZE=b, TILE=tile)
