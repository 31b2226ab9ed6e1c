"""The Triton attention kernels' shared arithmetic: one split's online softmax over KV tiles gathered
through a block table (:func:`split_softmax`) and the fold of a split into a row's running result
(:func:`fold_split`). paged_decode.py and paged_prefill.py both call these, so a prefill row and the
decode of its position run the same expressions.

NOTE: the helpers are compiled-mode ``@triton.jit`` functions whatever ``TRITON_INTERPRET`` says at
import; an interpreted launch swaps in interpreted twins (dispatch.py's ``LazyKernel``).
NOTE: the fold: m_new = max(M, m_j); m_safe = m_new == -inf ? 0 : m_new; a = exp(M - m_safe); w_j =
l_j * exp(m_j - m_safe); W = W * a + w_j; O = O * a + o_j * w_j; M = m_new. An empty split (m_j = -inf,
l_j = 0, o_j = 0) leaves (M, W, O) bit for bit unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from radixd.kernels.dispatch import interpreting, tl, triton


def _split_softmax(
    q: tl.tensor,
    q_pos: tl.tensor,
    q_lo: tl.tensor,
    k_ptr: tl.tensor,
    v_ptr: tl.tensor,
    bt_row: tl.tensor,
    lo: tl.tensor,
    hi: tl.tensor,
    max_blocks: tl.tensor,
    kvh: tl.tensor,
    stride_kn: tl.tensor,
    stride_vn: tl.tensor,
    ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_TILE: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr,
    FP32_DOT: tl.constexpr,
    ROWWISE_DOT: tl.constexpr,
) -> tuple[tl.tensor, tl.tensor, tl.tensor]:
    """Keys [lo, hi) of one sequence (its table row `bt_row`) for the ROWS query rows `q` (scaled):
    (max, sum of weights, weighted values / sum). CAUSAL: row r sees keys <= q_pos[r] only; WINDOWED
    (a sliding window): keys >= q_lo[r] only. A tile a row sees nothing of leaves its result as it was
    (bit for bit), so where the walk starts left of a row's first key changes nothing for the row."""
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D_TILE], tl.float32)
    n = tl.arange(0, BLOCK_N)
    dd = tl.arange(0, D_TILE)
    d_mask = dd < HEAD_DIM
    row_stride = NUM_KV_HEADS * HEAD_DIM  # token stride inside a dense block
    for start in range(lo, hi, BLOCK_N):
        pos = start + n
        n_mask = pos < hi
        logical = pos // BLOCK_SIZE
        phys = tl.load(bt_row + logical, mask=n_mask & (logical < max_blocks), other=0)
        in_blk = (pos % BLOCK_SIZE).to(tl.int64) * row_stride + kvh * HEAD_DIM
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(
            k_ptr + (phys.to(tl.int64) * stride_kn + in_blk)[:, None] + dd[None, :], mask=kv_mask, other=0.0
        )
        if ROWWISE_DOT:  # the interpreter: see ROWWISE_DOT in paged_decode.py
            sc = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], 2)
        elif FP32_DOT:
            sc = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            sc = tl.dot(q, tl.trans(k))
        seen = n_mask[None, :]
        if CAUSAL:
            seen = seen & (pos[None, :] <= q_pos[:, None])
        if WINDOWED:
            seen = seen & (pos[None, :] >= q_lo[:, None])
        sc = tl.where(seen, sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        # NOTE: a row may see only -inf in a tile; a finite stand-in max keeps exp() NaN-free.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(sc - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_ptr + (phys.to(tl.int64) * stride_vn + in_blk)[:, None] + dd[None, :], mask=kv_mask, other=0.0
        )
        if ROWWISE_DOT:
            pv = tl.sum(p.to(v.dtype).to(tl.float32)[:, :, None] * v.to(tl.float32)[None, :, :], 1)
            acc = acc * alpha[:, None] + pv
        elif FP32_DOT:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    # An empty split: l = 0, m = -inf, o = 0, which the fold ignores exactly.
    return m_i, l_i, acc / tl.where(l_i > 0, l_i, 1.0)[:, None]


def _fold_split(
    big_m: tl.tensor, big_w: tl.tensor, big_o: tl.tensor, m_j: tl.tensor, l_j: tl.tensor, o_j: tl.tensor
) -> tuple[tl.tensor, tl.tensor, tl.tensor]:
    """A row's running (max, weight, output) with one more split folded in (the module's NOTE)."""
    m_new = tl.maximum(big_m, m_j)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = tl.exp(big_m - m_safe)
    w_j = l_j * tl.exp(m_j - m_safe)
    big_w = big_w * a + w_j
    big_o = big_o * a[:, None] + o_j * w_j[:, None]
    return m_new, big_w, big_o


def tile_constants(k_cache: torch.Tensor, block_n: int) -> dict[str, Any]:
    """The constexprs of a launch that `split_softmax` takes from the pool (shape, dtype), the key tile
    (`block_n`) and the mode (the interpreter's row-wise dot)."""
    _, b, hkv, d = k_cache.shape
    return {
        "HEAD_DIM": d,
        "D_TILE": max(16, triton.next_power_of_2(d)),
        "NUM_KV_HEADS": hkv,
        "BLOCK_SIZE": b,
        "BLOCK_N": block_n,
        "FP32_DOT": k_cache.dtype == torch.float32,
        "ROWWISE_DOT": interpreting(),
    }


def scale_and_strides(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, scale: float
) -> tuple[float, int, int, int, int, int]:
    """The launch arguments both kernels take in this order: the scale, q's token and head strides,
    the pools' block strides and the tables' row stride."""
    strides = (q.stride(0), q.stride(1), k_cache.stride(0), v_cache.stride(0), block_tables.stride(0))
    return (float(scale), *strides)


split_softmax: Any = None
fold_split: Any = None
if tl is not None:
    from triton.runtime.jit import JITFunction

    split_softmax = JITFunction(_split_softmax)
    fold_split = JITFunction(_fold_split)
