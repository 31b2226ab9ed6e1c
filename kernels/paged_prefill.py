"""paged_prefill (extend): a ragged batch of new tokens attends to the cached prefix and causally to itself.

New token i of sequence s sits at position ``seq_lens[s] - q_len[s] + i`` and attends to every KV
position <= its own (its K/V already in the pool): plain, chunked and prefix-hit prefill alike. Triton:
one program per (query tile, sequence, query head) with the decode kernel's splits, online softmax and
fold (tiles.py). CPU twin: each new token is a row of the compiled row kernel (cpu_attention.py), else
of the split design (one gather, one ``split_attention``). A sliding window (``window`` = W > 0) leaves
a token the keys ``pos - W + 1..pos``; the Triton kernel starts a query tile's walk at the key tile of
its first row's first key.

NOTE: a prefill row equals the decode of its position (the same splits and arithmetic).
"""

from __future__ import annotations

import torch

from radixd.kernels import cpu_attention
from radixd.kernels.checks import check_block_tables, check_cache, check_int_vector, check_query, check_window
from radixd.kernels.dispatch import LazyKernel, check_same_device, resolve_backend, tl, triton
from radixd.kernels.paged_decode import DECODE_CONFIG, ROW_TILE, SPLIT_TOKENS
from radixd.kernels.paging import length_chunks
from radixd.kernels.split_attention import (
    gather_split_kv,
    key_mask,
    num_splits,
    padded_rows,
    split_attention,
    split_index,
)
from radixd.kernels.tiles import fold_split, scale_and_strides, split_softmax, tile_constants


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_q_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    backend: str | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Extend attention: q [T, Hq, D] (new tokens of all sequences, concatenated), caches [N, B, Hkv, D],
    block_tables int32 [S, max_blocks], cu_q_lens int32 [S+1] (offsets into q), seq_lens int32 [S] (total
    KV length incl. the new, stored tokens; ``q_len <= seq_len``); ``window``: 0 = causal over every
    key, W > 0 = a token at ``pos`` sees keys ``pos - W + 1..pos`` (HF's ``sliding_window``). Returns
    [T, Hq, D] in q's dtype."""
    op = "paged_prefill"
    check_window(op, window)
    _, _, hkv, d = check_cache(op, k_cache, v_cache)
    _t, _group = check_query(op, q, hkv, d)
    s = int(seq_lens.shape[0]) if seq_lens.dim() == 1 else -1
    check_int_vector(op, "seq_lens", seq_lens)
    check_int_vector(op, "cu_q_lens", cu_q_lens, s + 1)
    max_blocks = check_block_tables(op, block_tables, s)
    dev = check_same_device(op, q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens)
    if resolve_backend(backend, dev) == "torch":
        return paged_prefill_torch(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens, scale, window)
    return paged_prefill_triton(
        q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens, scale, max_blocks, window
    )


def paged_prefill_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_q_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """Vectorized torch twin of :func:`paged_prefill`: one loop step per chunk of KV-length-sorted
    sequences (as in the decode twin), so padding a chunk's sequences to its longest stays cheap."""
    t, hq, d = q.shape
    _, b, hkv, _ = k_cache.shape
    out = q.new_zeros(t, hq, d)
    if t == 0 or seq_lens.shape[0] == 0:
        return out
    if cpu_attention.use_compiled(k_cache, hq // hkv):
        row_table, row_pos = cpu_attention.prefill_rows(cu_q_lens, seq_lens, t)
        plan = cpu_attention.plan_rows(block_tables.cpu(), row_table, row_pos, b, k_cache.shape[0])
        return cpu_attention.attend_rows(q, k_cache, v_cache, plan, scale, window)
    cu, lens, q_lens = cpu_attention.query_lens(cu_q_lens, seq_lens)
    # Sequences without new tokens contribute nothing: give them length 0 so the chunking drops them.
    order, counts = length_chunks(
        torch.where(q_lens > 0, lens, 0), b, 2 * b * hkv * d * k_cache.element_size()
    )
    a = 0
    for n in counts:
        idx = order[a : a + n]
        _prefill_chunk(
            q, k_cache, v_cache, block_tables, cu[idx], q_lens[idx], lens[idx], idx, scale, window, out
        )
        a += n
    return out


def _prefill_chunk(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    starts: torch.Tensor,  # [n] (CPU) offset of each sequence's first new token in q
    q_lens: torch.Tensor,  # [n] (CPU)
    lens: torch.Tensor,  # [n] (CPU) KV lengths, longest first
    seq_idx: torch.Tensor,  # [n] (CPU) rows of block_tables
    scale: float,
    window: int,
    out: torch.Tensor,
) -> None:
    """One :func:`split_attention` over a chunk of sequences: rows [n, Hkv, G*Qmax, D], each at its
    own position, exactly as a decode of that position would attend."""
    _, hq, d = q.shape
    _, b, hkv, _ = k_cache.shape
    group = hq // hkv
    n = seq_idx.shape[0]
    dev = q.device
    q_max = int(q_lens.max())
    rows = torch.arange(q_max)
    valid = rows[None, :] < q_lens[:, None]  # [n, Qmax]
    tok = torch.where(valid, starts[:, None] + rows[None, :], 0).to(dev)
    # Rows [n, Hkv, G*Qmax, D] (group heads as extra query rows), padded to an allowed count (padded_rows).
    qp = q[tok].view(n, q_max, hkv, group, d).permute(0, 2, 3, 1, 4).reshape(n, hkv, group * q_max, d)
    # Padding rows sit at position 0: they see key 0 only, and are dropped.
    pos = torch.where(valid, (lens - q_lens)[:, None] + rows[None, :], 0)
    pos = pos[:, None, :].expand(n, group, q_max).reshape(n, group * q_max)
    m = padded_rows(group * q_max, d)
    if m != group * q_max:
        qp = torch.nn.functional.pad(qp, (0, 0, 0, m - group * q_max))
        pos = torch.nn.functional.pad(pos, (0, m - group * q_max))
    splits = num_splits(int(lens[0]))
    tables = block_tables.index_select(0, seq_idx.to(block_tables.device))
    index = split_index(tables, b, hkv, splits)
    kg = gather_split_kv(k_cache, index)
    vg = gather_split_kv(v_cache, index)
    o = split_attention(qp.to(torch.float32), kg, vg, key_mask(pos.to(dev), splits, window), scale)
    o = o[:, :, : group * q_max].view(n, hkv, group, q_max, d).permute(0, 3, 1, 2, 4).reshape(n, q_max, hq, d)
    valid_dev = valid.to(dev)
    out[tok[valid_dev]] = o[valid_dev].to(out.dtype)


def _prefill_kernel(
    q_ptr: tl.tensor,
    k_ptr: tl.tensor,
    v_ptr: tl.tensor,
    bt_ptr: tl.tensor,
    cu_ptr: tl.tensor,
    lens_ptr: tl.tensor,
    out_ptr: tl.tensor,
    scale: tl.tensor,
    stride_qt: tl.tensor,
    stride_qh: tl.tensor,
    stride_kn: tl.tensor,
    stride_vn: tl.tensor,
    stride_bts: tl.tensor,
    stride_ot: tl.tensor,
    stride_oh: tl.tensor,
    max_blocks: tl.tensor,
    window: tl.tensor,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_TILE: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    WINDOWED: tl.constexpr,
    FP32_DOT: tl.constexpr,
    ROWWISE_DOT: tl.constexpr,
) -> None:
    m_tile = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    kvh = head // GROUP
    q_start = tl.load(cu_ptr + seq).to(tl.int64)
    q_len = (tl.load(cu_ptr + seq + 1) - tl.load(cu_ptr + seq)).to(tl.int32)
    seq_len = tl.load(lens_ptr + seq).to(tl.int32)
    ctx = seq_len - q_len
    first = m_tile * BLOCK_M
    rows = first + tl.arange(0, BLOCK_M)
    r_mask = rows < q_len
    dd = tl.arange(0, D_TILE)
    d_mask = dd < HEAD_DIM
    q_off = (q_start + rows.to(tl.int64))[:, None] * stride_qt + head * stride_qh + dd[None, :]
    q = tl.load(q_ptr + q_off, mask=r_mask[:, None] & d_mask[None, :], other=0.0)
    q = (q.to(tl.float32) * scale).to(k_ptr.dtype.element_ty)
    q_pos = ctx + rows
    # Keys up to the tile's last causal position; an empty tile walks nothing.
    hi = tl.minimum(seq_len, ctx + first + BLOCK_M)
    hi = tl.where(first < q_len, hi, 0)
    # Under a window each row sees keys from its own first one (q_lo); the walk starts at the key tile
    # of the tile's first row's first key, in that key's split: the splits and tiles before it hold no
    # key of any row here. Where a row's walk starts changes nothing for it (tiles.py).
    q_lo = q_pos
    start = 0
    tile_lo = 0
    if WINDOWED:
        q_lo = tl.maximum(q_pos - window + 1, 0)
        tile_lo = (tl.maximum(ctx + first - window + 1, 0) // BLOCK_N) * BLOCK_N
        start = (tile_lo // SPLIT) * SPLIT

    big_m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    big_w = tl.zeros([BLOCK_M], tl.float32)
    big_o = tl.zeros([BLOCK_M, D_TILE], tl.float32)
    # Splits of SPLIT keys fixed by position, each reduced alone and folded in order: the decode
    # kernel's split and fold (tiles.py), so a row here equals the decode of its position.
    for lo in range(start, hi, SPLIT):
        walk_lo = lo
        if WINDOWED:
            walk_lo = tl.maximum(lo, tile_lo)
        m_j, l_j, o_j = split_softmax(
            q, q_pos, q_lo, k_ptr, v_ptr, bt_ptr + seq * stride_bts, walk_lo, tl.minimum(lo + SPLIT, hi),
            max_blocks, kvh, stride_kn, stride_vn, BLOCK_M, HEAD_DIM, D_TILE, NUM_KV_HEADS, BLOCK_SIZE,
            BLOCK_N, True, WINDOWED, FP32_DOT, ROWWISE_DOT,
        )  # fmt: skip
        big_m, big_w, big_o = fold_split(big_m, big_w, big_o, m_j, l_j, o_j)

    o = big_o / tl.where(big_w > 0, big_w, 1.0)[:, None]
    o_off = (q_start + rows.to(tl.int64))[:, None] * stride_ot + head * stride_oh + dd[None, :]
    tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=r_mask[:, None] & d_mask[None, :])


_kernel = LazyKernel(_prefill_kernel, do_not_specialize=("max_blocks", "window"))


def paged_prefill_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_q_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_blocks: int,
    window: int = 0,
) -> torch.Tensor:
    """Launch the Triton extend kernel (inputs already validated by :func:`paged_prefill`)."""
    t, hq, d = q.shape
    hkv = k_cache.shape[2]
    s = seq_lens.shape[0]
    out = torch.zeros(t, hq, d, dtype=q.dtype, device=q.device)
    if t == 0 or s == 0:
        return out
    if q.stride(2) != 1:
        q = q.contiguous()
    if block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()
    # NOTE: one host sync for the grid's query-tile count (prefill is compute-bound; it is cheap here).
    q_max = int((cu_q_lens[1:] - cu_q_lens[:-1]).max())
    if q_max <= 0:
        return out
    consts = tile_constants(k_cache, DECODE_CONFIG["block_n"])
    grid = (triton.cdiv(q_max, ROW_TILE), s, hq)
    _kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_q_lens,
        seq_lens,
        out,
        *scale_and_strides(q, k_cache, v_cache, block_tables, scale),
        out.stride(0),
        out.stride(1),
        max_blocks,
        window,
        GROUP=hq // hkv,
        BLOCK_M=ROW_TILE,
        SPLIT=SPLIT_TOKENS,
        WINDOWED=window > 0,
        **consts,
        num_warps=4,
        num_stages=2,
    )
    return out
