"""Input validation shared by the ops: shapes and dtypes are checked on the host, without syncing.

Each error says what was wrong and what to pass instead (the model code is the main caller).
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_cache(op: str, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Validate a per-layer K/V pool pair and return ``(num_blocks, block_size, num_kv_heads, head_dim)``."""
    if k_cache.dim() != 4:
        raise ValueError(
            f"{op}: k_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape:
        raise ValueError(
            f"{op}: v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}"
        )
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"{op}: k_cache/v_cache must share one of {FLOAT_DTYPES}, got {k_cache.dtype}/{v_cache.dtype}"
        )
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        # NOTE: a block's [block_size, heads, dim] must be dense so a slot index addresses one row;
        # the block stride itself may be anything (e.g. a view into a bigger per-model tensor).
        if c.stride(3) != 1 or c.stride(2) != c.shape[3] or c.stride(1) != c.shape[2] * c.shape[3]:
            raise ValueError(
                f"{op}: {name} must be dense inside each block (strides [*, H*D, D, 1]), got {c.stride()}; "
                "allocate it with torch.empty(num_blocks, block_size, heads, dim)"
            )
    n, b, h, d = k_cache.shape
    return int(n), int(b), int(h), int(d)


def check_int_vector(op: str, name: str, t: torch.Tensor, length: int | None = None) -> None:
    """Raise unless ``t`` is a 1-D integer tensor (of ``length`` entries when given)."""
    if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: {name} must be a 1-D int32/int64 tensor, got {t.dtype} {tuple(t.shape)}")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{op}: {name} must have {length} entries, got {t.shape[0]}")


def check_query(op: str, q: torch.Tensor, num_kv_heads: int, head_dim: int) -> tuple[int, int]:
    """Validate ``q`` [rows, Hq, D] against the pool; return ``(rows, group)`` with Hq = group * Hkv."""
    if q.dim() != 3:
        raise ValueError(f"{op}: q must be [tokens, num_q_heads, head_dim], got {tuple(q.shape)}")
    rows, hq, d = q.shape
    if d != head_dim:
        raise ValueError(f"{op}: q head_dim {d} != cache head_dim {head_dim}")
    if hq % num_kv_heads != 0 or hq == 0:
        raise ValueError(
            f"{op}: num_q_heads {hq} must be a positive multiple of num_kv_heads {num_kv_heads} (GQA)"
        )
    if q.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{op}: q dtype must be one of {FLOAT_DTYPES}, got {q.dtype}")
    return int(rows), int(hq // num_kv_heads)


def check_block_tables(op: str, block_tables: torch.Tensor, num_seqs: int) -> int:
    """Validate ``block_tables`` [S, max_blocks] (int32/int64); return max_blocks."""
    if block_tables.dim() != 2 or block_tables.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"{op}: block_tables must be an int32 [num_seqs, max_blocks] tensor, "
            f"got {block_tables.dtype} {tuple(block_tables.shape)}"
        )
    if block_tables.shape[0] != num_seqs:
        raise ValueError(f"{op}: block_tables has {block_tables.shape[0]} rows for {num_seqs} sequences")
    return int(block_tables.shape[1])


def check_window(op: str, window: int) -> None:
    """Raise unless ``window`` is a sliding window's key count (> 0) or 0 (full causal attention)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"{op}: window must be an int >= 0 (0: full causal attention), got {window!r}")
