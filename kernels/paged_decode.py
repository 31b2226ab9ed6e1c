"""paged_decode: one query token per sequence attends to its KV through a block table.

Triton: split-K flash decoding. Stage 1 runs one program per (sequence, kv head, split); the query
heads of the GQA group are packed into one tile (padded to 16 rows for ``tl.dot``) and an fp32 online
softmax runs over KV tiles gathered through the block table. Stage 2 merges the splits by log-sum-exp:
``O = sum_k l_k exp(m_k - m) O_k / sum_k l_k exp(m_k - m)``. With one split stage 1 writes the output.

Torch twin (the daemon's CPU path, ``decode_plan.py``): per chunk of length-sorted sequences, one
gather of the needed blocks and one SDPA call in which the G query heads of a kv head play the role of
G query rows (no K/V repeat). The chunking is planned once per step and reused by every layer.
"""

from __future__ import annotations

import torch

from radixd.kernels.checks import check_block_tables, check_cache, check_int_vector, check_query
from radixd.kernels.decode_plan import DecodePlan, decode_with_plan, plan_decode
from radixd.kernels.dispatch import LazyKernel, check_same_device, resolve_backend

try:  # triton is a hard dependency, but keep the torch path importable without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    backend: str | None = None,
    plan: DecodePlan | None = None,
) -> torch.Tensor:
    """Decode attention over a paged KV pool.

    q [S, Hq, D] (one token per sequence); k_cache/v_cache [N, B, Hkv, D]; block_tables int32
    [S, max_blocks] (unused entries 0); seq_lens int32 [S], KV length incl. the current token
    (already stored); a length of 0 yields a zero output row. ``num_splits`` sets the split-K
    partitions of the Triton kernel (None = heuristic; the torch twin is exact and ignores it).
    ``plan``: the torch twin's work split from :func:`plan_for`, made once per step and shared by
    every layer (the Triton kernel ignores it); without one the twin plans the call itself.
    Returns [S, Hq, D] in q's dtype.
    """
    op = "paged_decode"
    _, _, hkv, d = check_cache(op, k_cache, v_cache)
    s, _group = check_query(op, q, hkv, d)
    check_int_vector(op, "seq_lens", seq_lens, s)
    max_blocks = check_block_tables(op, block_tables, s)
    dev = check_same_device(op, q, k_cache, v_cache, block_tables, seq_lens)
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"{op}: num_splits must be >= 1 or None, got {num_splits}")
    if resolve_backend(backend, dev) == "torch":
        return paged_decode_torch(q, k_cache, v_cache, block_tables, seq_lens, scale, plan)
    return paged_decode_triton(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, max_blocks)


# ----------------------------------------------------------------------------------------------
# torch twin
# ----------------------------------------------------------------------------------------------


def plan_for(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, k_cache: torch.Tensor, chunk_bytes: int | None = None
) -> DecodePlan:
    """The torch twin's plan for a decode step over pools shaped like ``k_cache`` (any layer)."""
    _, b, hkv, d = k_cache.shape
    return plan_decode(block_tables, seq_lens, b, hkv, 2 * b * hkv * d * k_cache.element_size(), chunk_bytes)


def decode_step_plan(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, k_cache: torch.Tensor, backend: str | None = None
) -> DecodePlan | None:
    """Plan a decode step once for all of its layers (pass the result as ``paged_decode(plan=)``);
    None where the resolved backend needs no plan (the Triton kernel splits work on the device)."""
    if resolve_backend(backend, k_cache.device) != "torch":
        return None
    return plan_for(block_tables, seq_lens, k_cache)


def paged_decode_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    plan: DecodePlan | None = None,
) -> torch.Tensor:
    """Vectorized torch twin of :func:`paged_decode` (no loop over sequences or tokens): the batch
    runs along ``plan`` (made here when not given), one gather + SDPA per chunk of sequences."""
    if plan is None:
        plan = plan_for(block_tables, seq_lens, k_cache)
    return decode_with_plan(q, k_cache, v_cache, plan, scale)


# ----------------------------------------------------------------------------------------------
# Triton
# ----------------------------------------------------------------------------------------------

# Tile sizes: KV tokens per inner step and the padded GQA group (tl.dot needs >= 16 on a GPU).
# DECODE_CONFIG is read at every launch so bench/gpu_check.py can sweep it on a real GPU.
DECODE_CONFIG: dict[str, int] = {"block_n": 64, "num_warps": 4, "num_stages": 2}
_MIN_GROUP_TILE = 16
# A split should cover at least this many tokens, or its fixed cost dominates.
_MIN_TOKENS_PER_SPLIT = 256
_MAX_SPLITS = 64


def default_num_splits(num_seqs: int, num_kv_heads: int, max_len: int, device: torch.device) -> int:
    """Split-K heuristic: ~4 programs per SM (loads in flight to saturate HBM), splits >= 256 tokens."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    programs = max(1, num_seqs * num_kv_heads)
    want = -(-4 * sms // programs)
    cap = max(1, -(-max_len // _MIN_TOKENS_PER_SPLIT))
    return int(max(1, min(want, cap, _MAX_SPLITS)))


def _decode_stage1(
    q_ptr: tl.tensor,
    k_ptr: tl.tensor,
    v_ptr: tl.tensor,
    bt_ptr: tl.tensor,
    lens_ptr: tl.tensor,
    out_ptr: tl.tensor,
    part_o_ptr: tl.tensor,
    part_ml_ptr: tl.tensor,
    scale: tl.tensor,
    stride_qs: tl.tensor,
    stride_qh: tl.tensor,
    stride_kn: tl.tensor,
    stride_vn: tl.tensor,
    stride_bts: tl.tensor,
    stride_os: tl.tensor,
    stride_oh: tl.tensor,
    max_blocks: tl.tensor,
    num_splits: tl.tensor,
    GROUP: tl.constexpr,
    GROUP_TILE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_TILE: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WRITE_OUT: tl.constexpr,
    FP32_DOT: tl.constexpr,
) -> None:
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + seq).to(tl.int32)
    # Each split takes a whole number of BLOCK_N tiles of this sequence.
    tiles = tl.cdiv(seq_len, BLOCK_N)
    tiles_per_split = tl.cdiv(tiles, num_splits)
    lo = split * tiles_per_split * BLOCK_N
    hi = tl.minimum(lo + tiles_per_split * BLOCK_N, seq_len)

    g = tl.arange(0, GROUP_TILE)
    dd = tl.arange(0, D_TILE)
    g_mask = g < GROUP
    d_mask = dd < HEAD_DIM
    qh = kvh * GROUP + g  # query heads of this kv head
    q = tl.load(
        q_ptr + seq * stride_qs + qh[:, None] * stride_qh + dd[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    q = (q.to(tl.float32) * scale).to(k_ptr.dtype.element_ty)

    m_i = tl.full([GROUP_TILE], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_TILE], tl.float32)
    acc = tl.zeros([GROUP_TILE, D_TILE], tl.float32)
    n = tl.arange(0, BLOCK_N)
    row_stride = NUM_KV_HEADS * HEAD_DIM  # token stride inside a dense block
    for start in range(lo, hi, BLOCK_N):
        pos = start + n
        n_mask = pos < hi
        logical = pos // BLOCK_SIZE
        phys = tl.load(bt_ptr + seq * stride_bts + logical, mask=n_mask & (logical < max_blocks), other=0)
        tok = phys.to(tl.int64) * stride_kn + (pos % BLOCK_SIZE).to(tl.int64) * row_stride + kvh * HEAD_DIM
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + tok[:, None] + dd[None, :], mask=kv_mask, other=0.0)
        if FP32_DOT:  # noqa: SIM108 (constexpr branch, kept explicit for the Triton frontend)
            sc = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            sc = tl.dot(q, tl.trans(k))
        sc = tl.where(n_mask[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vtok = phys.to(tl.int64) * stride_vn + (pos % BLOCK_SIZE).to(tl.int64) * row_stride + kvh * HEAD_DIM
        v = tl.load(v_ptr + vtok[:, None] + dd[None, :], mask=kv_mask, other=0.0)
        if FP32_DOT:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # Empty split (or length 0): l = 0, m = -inf; the output/merge treats it as weight 0.
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    o = acc / safe_l[:, None]
    gd_mask = g_mask[:, None] & d_mask[None, :]
    if WRITE_OUT:  # one split: no merge pass
        tl.store(
            out_ptr + seq * stride_os + qh[:, None] * stride_oh + dd[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=gd_mask,
        )
    else:
        # partial buffers: o [S, Hq, num_splits, D_TILE], ml [S, Hq, num_splits, 2] (fp32, contiguous)
        row = (seq * NUM_KV_HEADS * GROUP + qh) * num_splits + split
        tl.store(part_o_ptr + row[:, None] * D_TILE + dd[None, :], o, mask=gd_mask)
        tl.store(part_ml_ptr + row * 2, m_i, mask=g_mask)
        tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=g_mask)


def _decode_stage2(
    part_o_ptr: tl.tensor,
    part_ml_ptr: tl.tensor,
    out_ptr: tl.tensor,
    stride_os: tl.tensor,
    stride_oh: tl.tensor,
    num_splits: tl.tensor,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_TILE: tl.constexpr,
    SPLIT_TILE: tl.constexpr,
) -> None:
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    k = tl.arange(0, SPLIT_TILE)
    dd = tl.arange(0, D_TILE)
    k_mask = k < num_splits
    row = (seq * NUM_Q_HEADS + head) * num_splits + k
    m = tl.load(part_ml_ptr + row * 2, mask=k_mask, other=float("-inf"))
    l_k = tl.load(part_ml_ptr + row * 2 + 1, mask=k_mask, other=0.0)
    m_g = tl.max(m, 0)
    m_g = tl.where(m_g == float("-inf"), 0.0, m_g)
    w = tl.where(l_k > 0, l_k * tl.exp(m - m_g), 0.0)
    l_g = tl.sum(w, 0)
    d_mask = dd < HEAD_DIM
    o = tl.load(
        part_o_ptr + row[:, None] * D_TILE + dd[None, :], mask=k_mask[:, None] & d_mask[None, :], other=0.0
    )
    res = tl.sum(o * w[:, None], 0) / tl.where(l_g > 0, l_g, 1.0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + dd, res.to(out_ptr.dtype.element_ty), mask=d_mask)


_stage1 = LazyKernel(_decode_stage1, do_not_specialize=("max_blocks", "num_splits"))
_stage2 = LazyKernel(_decode_stage2, do_not_specialize=("num_splits",))


def paged_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None,
    max_blocks: int,
) -> torch.Tensor:
    """Launch the split-K Triton decode (inputs already validated by :func:`paged_decode`)."""
    s, hq, d = q.shape
    _, b, hkv, _ = k_cache.shape
    group = hq // hkv
    out = torch.empty(s, hq, d, dtype=q.dtype, device=q.device)
    if s == 0:
        return out
    if q.stride(2) != 1:
        q = q.contiguous()
    if block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()
    if num_splits is None:
        # NOTE: the heuristic uses the table width, not max(seq_lens), so it never syncs the host.
        num_splits = default_num_splits(s, hkv, max_blocks * b, q.device)
    d_tile = max(16, triton.next_power_of_2(d))
    group_tile = max(_MIN_GROUP_TILE, triton.next_power_of_2(group))
    if num_splits > 1:
        part_o = torch.empty(s, hq, num_splits, d_tile, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(s, hq, num_splits, 2, dtype=torch.float32, device=q.device)
    else:
        part_o = part_ml = out  # unused
    _stage1[(s, hkv, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_o,
        part_ml,
        float(scale),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        v_cache.stride(0),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        max_blocks,
        num_splits,
        GROUP=group,
        GROUP_TILE=group_tile,
        HEAD_DIM=d,
        D_TILE=d_tile,
        NUM_KV_HEADS=hkv,
        BLOCK_SIZE=b,
        BLOCK_N=DECODE_CONFIG["block_n"],
        WRITE_OUT=num_splits == 1,
        FP32_DOT=k_cache.dtype == torch.float32,
        num_warps=DECODE_CONFIG["num_warps"],
        num_stages=DECODE_CONFIG["num_stages"],
    )
    if num_splits > 1:
        _stage2[(s, hq)](
            part_o,
            part_ml,
            out,
            out.stride(0),
            out.stride(1),
            num_splits,
            NUM_Q_HEADS=hq,
            HEAD_DIM=d,
            D_TILE=d_tile,
            SPLIT_TILE=triton.next_power_of_2(num_splits),
            num_warps=4,
        )
    return out
