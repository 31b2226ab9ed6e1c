"""paged_decode: one query token per sequence attends to its KV through a block table.

Triton: split-K flash decoding, splits fixed by position (split ``j`` holds keys ``[j * split_tokens,
(j + 1) * split_tokens)`` whatever the batch); stage 1 runs tiles.py's online softmax per (sequence, kv
head, split) over the GQA group in one ``ROW_TILE``-row tile, stage 2 folds the splits in order with
tiles.py's fold, the prefill kernel's arithmetic. CPU twin: the compiled row kernel (cpu_attention.py),
else the split design (decode_plan.py), planned once per step for every layer (:func:`decode_step_plan`).
A sliding window (``window`` = W > 0: the row at ``p`` sees keys ``p - W + 1..p``) is the call's: both
kernels skip the key tiles wholly left of it, and the splits with them.

NOTE: a decode row equals the prefill row of its position wherever ``tl.dot`` gives a row the same bits
in both tiles (it does under TRITON_INTERPRET=1: tests/kernels/test_batch_invariance_triton.py).
"""

from __future__ import annotations

import torch

from radixd.kernels import cpu_attention
from radixd.kernels.checks import check_block_tables, check_cache, check_int_vector, check_query, check_window
from radixd.kernels.decode_plan import DecodePlan, check_plan, decode_with_plan, plan_decode
from radixd.kernels.dispatch import LazyKernel, check_same_device, resolve_backend, tl, triton
from radixd.kernels.tiles import fold_split, scale_and_strides, split_softmax, tile_constants


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    split_tokens: int | None = None,
    backend: str | None = None,
    plan: DecodePlan | cpu_attention.RowsPlan | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Decode attention over a paged KV pool: q [S, Hq, D] (a token per sequence) -> [S, Hq, D], q's dtype.

    k_cache/v_cache [N, B, Hkv, D]; block_tables int32 [S, max_blocks] (unused entries 0); seq_lens int32
    [S], KV length incl. the current (stored) token; a length of 0 yields a zero row. ``split_tokens``: the
    Triton kernel's keys per split (a multiple of its ``block_n``; None = ``SPLIT_TOKENS``; the torch twin
    keeps its own); neither derives a split from the batch. ``plan``: the torch twin's work split
    (:func:`plan_for`), made once per step for every layer, else planned per call (a plan serves every
    window). ``window``: 0 = every key; W > 0 = the last W keys (HF's ``sliding_window``).
    """
    op = "paged_decode"
    check_window(op, window)
    _, _, hkv, d = check_cache(op, k_cache, v_cache)
    s, _group = check_query(op, q, hkv, d)
    check_int_vector(op, "seq_lens", seq_lens, s)
    max_blocks = check_block_tables(op, block_tables, s)
    dev = check_same_device(op, q, k_cache, v_cache, block_tables, seq_lens)
    block_n = DECODE_CONFIG["block_n"]
    if split_tokens is not None and (split_tokens < block_n or split_tokens % block_n):
        raise ValueError(
            f"{op}: split_tokens must be a positive multiple of {block_n} or None, got {split_tokens}"
        )
    if resolve_backend(backend, dev) == "torch":
        return paged_decode_torch(q, k_cache, v_cache, block_tables, seq_lens, scale, plan, window)
    split = SPLIT_TOKENS if split_tokens is None else split_tokens
    return paged_decode_triton(q, k_cache, v_cache, block_tables, seq_lens, scale, split, max_blocks, window)


# ----------------------------------------------------------------------------------------------
# torch twin
# ----------------------------------------------------------------------------------------------


def plan_for(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, k_cache: torch.Tensor, chunk_bytes: int | None = None
) -> DecodePlan:
    """The torch twin's plan for a decode step over pools shaped like ``k_cache`` (any layer)."""
    _, b, hkv, d = k_cache.shape
    return plan_decode(block_tables, seq_lens, b, hkv, 2 * b * hkv * d * k_cache.element_size(), chunk_bytes)


def rows_plan_for(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, k_cache: torch.Tensor
) -> cpu_attention.RowsPlan:
    """The compiled kernel's rows for a decode step: sequence i is one row at position seq_len - 1."""
    pos = seq_lens.long().cpu() - 1
    rows = torch.arange(pos.shape[0])
    return cpu_attention.plan_rows(block_tables.cpu(), rows, pos, k_cache.shape[1], k_cache.shape[0])


def decode_step_plan(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, k_cache: torch.Tensor, backend: str | None = None
) -> DecodePlan | cpu_attention.RowsPlan | None:
    """Plan a decode step once for all of its layers (pass the result as ``paged_decode(plan=)``);
    None where the resolved backend needs no plan (the Triton kernel splits work on the device)."""
    if resolve_backend(backend, k_cache.device) != "torch":
        return None
    if cpu_attention.use_compiled(k_cache, 1):
        return rows_plan_for(block_tables, seq_lens, k_cache)
    return plan_for(block_tables, seq_lens, k_cache)


def paged_decode_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    plan: DecodePlan | cpu_attention.RowsPlan | None = None,
    window: int = 0,
) -> torch.Tensor:
    """CPU twin of :func:`paged_decode`: the compiled row kernel (cpu_attention.py) where it runs, each
    sequence one row at position ``seq_len - 1``; else the split design along ``plan`` (made here when
    not given), one gather + split_attention per chunk of sequences."""
    s, hq, _ = q.shape
    if cpu_attention.use_compiled(k_cache, hq // k_cache.shape[2]):
        if isinstance(plan, DecodePlan):  # made for the split design; still refused for another batch
            check_plan(plan, s, k_cache.shape[1])
        if not isinstance(plan, cpu_attention.RowsPlan):
            plan = rows_plan_for(block_tables, seq_lens, k_cache)
        return cpu_attention.attend_rows(q, k_cache, v_cache, plan, scale, window)
    if not isinstance(plan, DecodePlan):
        plan = plan_for(block_tables, seq_lens, k_cache)
    return decode_with_plan(q, k_cache, v_cache, plan, scale, window)


# ----------------------------------------------------------------------------------------------
# Triton
# ----------------------------------------------------------------------------------------------

# Tile sizes: KV tokens per inner step, shared with the prefill kernel (their rows must see the same
# tiles). DECODE_CONFIG is read at every launch so bench/gpu_check.py can sweep it on a real GPU.
DECODE_CONFIG: dict[str, int] = {"block_n": 64, "num_warps": 4, "num_stages": 2}
# Query rows per tile in both kernels: prefill's query block, decode's padded GQA group.
ROW_TILE = 64
# NOTE: ROWWISE_DOT (set under TRITON_INTERPRET=1 only): the interpreter runs tl.dot as numpy's BLAS
# matmul, whose bits for a row depend on the row's slot in the tile (a decode row sits at slot g, the
# same row of a prefill tile elsewhere). There the kernels multiply and tl.sum instead, which gives every
# row the same bits, so the interpreter can check everything else about the order bit for bit. On a GPU
# tl.dot runs, whose per-row bits are the hardware's to keep (bench/gpu_check.py is where to check).
# Keys per split, fixed by position (a multiple of block_n): the split of a key never depends on the
# batch, so neither does the order a row's keys are reduced in.
SPLIT_TOKENS = 256


def _decode_stage1(
    q_ptr: tl.tensor,
    k_ptr: tl.tensor,
    v_ptr: tl.tensor,
    bt_ptr: tl.tensor,
    lens_ptr: tl.tensor,
    part_o_ptr: tl.tensor,
    part_ml_ptr: tl.tensor,
    scale: tl.tensor,
    stride_qs: tl.tensor,
    stride_qh: tl.tensor,
    stride_kn: tl.tensor,
    stride_vn: tl.tensor,
    stride_bts: tl.tensor,
    max_blocks: tl.tensor,
    num_splits: tl.tensor,
    window: tl.tensor,
    GROUP: tl.constexpr,
    GROUP_TILE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_TILE: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    WINDOWED: tl.constexpr,
    FP32_DOT: tl.constexpr,
    ROWWISE_DOT: tl.constexpr,
) -> None:
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + seq).to(tl.int32)
    # Split `split` holds keys [split * SPLIT, (split + 1) * SPLIT): fixed by position, not by the batch.
    lo = split * SPLIT
    hi = tl.minimum(lo + SPLIT, seq_len)
    first = tl.zeros([GROUP_TILE], tl.int32)
    if WINDOWED:
        # The row's first key; the walk starts at its tile (tiles.py masks the keys before it), so a
        # split wholly left of the window walks nothing.
        first = first + tl.maximum(seq_len - window, 0)
        lo = tl.maximum(lo, (tl.maximum(seq_len - window, 0) // BLOCK_N) * BLOCK_N)

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

    m_i, l_i, o = split_softmax(
        q, g, first, k_ptr, v_ptr, bt_ptr + seq * stride_bts, lo, hi, max_blocks, kvh, stride_kn, stride_vn,
        GROUP_TILE, HEAD_DIM, D_TILE, NUM_KV_HEADS, BLOCK_SIZE, BLOCK_N, False, WINDOWED, FP32_DOT,
        ROWWISE_DOT,
    )  # fmt: skip
    gd_mask = g_mask[:, None] & d_mask[None, :]
    # partial buffers: o [S, Hq, num_splits, D_TILE], ml [S, Hq, num_splits, 2] (fp32, contiguous)
    row = (seq * NUM_KV_HEADS * GROUP + qh) * num_splits + split
    tl.store(part_o_ptr + row[:, None] * D_TILE + dd[None, :], o, mask=gd_mask)
    tl.store(part_ml_ptr + row * 2, m_i, mask=g_mask)
    tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=g_mask)


def _decode_stage2(
    part_o_ptr: tl.tensor,
    part_ml_ptr: tl.tensor,
    lens_ptr: tl.tensor,
    out_ptr: tl.tensor,
    stride_os: tl.tensor,
    stride_oh: tl.tensor,
    num_splits: tl.tensor,
    window: tl.tensor,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_TILE: tl.constexpr,
    SPLIT: tl.constexpr,
    WINDOWED: tl.constexpr,
) -> None:
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    dd = tl.arange(0, D_TILE)
    d_mask = dd < HEAD_DIM
    seq_len = tl.load(lens_ptr + seq).to(tl.int32)
    # One row kept as a [1, D] tile so that the fold is the prefill kernel's expression, shape for shape.
    one = tl.arange(0, 1)
    big_m = tl.full([1], float("-inf"), tl.float32)
    big_w = tl.zeros([1], tl.float32)
    big_o = tl.zeros([1, D_TILE], tl.float32)
    # The sequence's own splits, in order (a row's fold never depends on the batch's widest table);
    # under a window from the split of its first key (the empty splits before it would change nothing).
    j0 = 0
    if WINDOWED:
        j0 = tl.maximum(seq_len - window, 0) // SPLIT
    for j in range(j0, tl.cdiv(seq_len, SPLIT)):
        row = (seq * NUM_Q_HEADS + head) * num_splits + j + one
        m_j = tl.load(part_ml_ptr + row * 2)
        l_j = tl.load(part_ml_ptr + row * 2 + 1)
        o_j = tl.load(part_o_ptr + row[:, None] * D_TILE + dd[None, :])
        big_m, big_w, big_o = fold_split(big_m, big_w, big_o, m_j, l_j, o_j)
    res = big_o / tl.where(big_w > 0, big_w, 1.0)[:, None]
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + one[:, None] * 0 + dd[None, :],
        res.to(out_ptr.dtype.element_ty),
        mask=d_mask[None, :],
    )


_stage1 = LazyKernel(_decode_stage1, do_not_specialize=("max_blocks", "num_splits", "window"))
_stage2 = LazyKernel(_decode_stage2, do_not_specialize=("num_splits", "window"))


def paged_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    split_tokens: int,
    max_blocks: int,
    window: int = 0,
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
    # NOTE: the grid covers the table's width (no host sync for max(seq_lens)); programs past a
    # sequence's end write empty partials that its fold never reads.
    num_splits = max(1, triton.cdiv(max_blocks * b, split_tokens))
    consts = tile_constants(k_cache, DECODE_CONFIG["block_n"])
    d_tile = consts["D_TILE"]
    if group > ROW_TILE:
        raise ValueError(f"paged_decode: a GQA group of {group} query heads exceeds the {ROW_TILE}-row tile")
    part_o = torch.empty(s, hq, num_splits, d_tile, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(s, hq, num_splits, 2, dtype=torch.float32, device=q.device)
    _stage1[(s, hkv, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        part_o,
        part_ml,
        *scale_and_strides(q, k_cache, v_cache, block_tables, scale),
        max_blocks,
        num_splits,
        window,
        GROUP=group,
        GROUP_TILE=ROW_TILE,
        SPLIT=split_tokens,
        WINDOWED=window > 0,
        **consts,
        num_warps=DECODE_CONFIG["num_warps"],
        num_stages=DECODE_CONFIG["num_stages"],
    )
    _stage2[(s, hq)](
        part_o,
        part_ml,
        seq_lens,
        out,
        out.stride(0),
        out.stride(1),
        num_splits,
        window,
        NUM_Q_HEADS=hq,
        HEAD_DIM=d,
        D_TILE=d_tile,
        SPLIT=split_tokens,
        WINDOWED=window > 0,
        num_warps=1,
    )
    return out
