"""The CPU decode twin's work split, planned once per step and replayed by every layer.

:func:`plan_decode` computes once what depends only on the step's block tables and lengths (length
sort, chunk boundaries, gather indices, key masks); each layer then gathers K/V and runs
:func:`~radixd.kernels.split_attention.split_attention` per chunk of sequences of similar length whose
K+V fit in about ``TARGET_CHUNK_BYTES`` (still in L2 when the attention reads them back).

NOTE: chunking changes no row's result: a row's arithmetic depends only on its own position and keys
(split_attention.py), so its chunk, and how far that chunk pads it, are invisible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixd.kernels.split_attention import (
    SPLIT_TOKENS,
    gather_split_kv,
    key_mask,
    padded_rows,
    split_attention,
    split_index,
)

# Gathered K+V bytes per chunk: one core's L2 (2 MiB on this project's CPUs), so a chunk's gather
# stays in cache for the attention that reads it (bench/decode_chunks.py, docs/measurements/bench-kernels.md).
TARGET_CHUNK_BYTES = 2 << 20


@dataclass(frozen=True)
class DecodeChunk:
    """Rows ``[start, end)`` of the length-sorted batch, gathered over ``splits`` splits each."""

    start: int
    end: int
    splits: int
    index: torch.Tensor  # int64 [splits * n * Hkv * S] pool row of each gathered key (split_index)
    mask: torch.Tensor  # additive [splits, n, 1, 1, S]: -inf on keys past each row's position
    last: torch.Tensor  # int64 [n, 1] each row's position (a sliding window's mask is made from it)


@dataclass(frozen=True)
class DecodePlan:
    """How the torch twin of ``paged_decode`` splits one step; valid for any layer of that step."""

    num_seqs: int
    block_size: int
    order: torch.Tensor | None  # sorted position -> sequence (only non-empty ones); None: identity
    chunks: tuple[DecodeChunk, ...]
    max_chunk_rows: int  # largest chunk, in gathered pool rows: sizes the reusable K/V buffers


def plan_decode(
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    num_kv_heads: int,
    bytes_per_block: int,
    chunk_bytes: int | None = None,
) -> DecodePlan:
    """Split a decode batch into length-sorted chunks of about ``chunk_bytes`` gathered K+V.

    ``bytes_per_block``: one block of K plus one of V. Sequences of length 0 belong to no chunk (their
    output is zeros). A batch that fits one chunk keeps its order and needs no permutation."""
    target = TARGET_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    s = block_tables.shape[0]
    lens = seq_lens.long().cpu()
    nsplits = torch.clamp((lens + SPLIT_TOKENS - 1) // SPLIT_TOKENS, min=1)
    split_bytes = SPLIT_TOKENS * bytes_per_block // block_size
    if s > 0 and bool((lens > 0).all()) and s * int(nsplits.max()) * split_bytes <= target:
        order: torch.Tensor | None = None
        sorted_lens, sorted_ns, counts = lens, nsplits, [s]
    else:
        perm = torch.argsort(lens, descending=True, stable=True)
        perm = perm[lens[perm] > 0]
        sorted_lens, sorted_ns = lens[perm], nsplits[perm]
        # Greedy cut: a chunk grows while its padded size (rows x longest row) stays in the target.
        counts = []
        ns_list = sorted_ns.tolist()
        a = 0
        while a < len(ns_list):
            per_row = max(ns_list[a] * split_bytes, 1)
            n = max(1, min(len(ns_list) - a, target // per_row))
            counts.append(n)
            a += n
        order = perm.to(block_tables.device)
    tables = block_tables if order is None else block_tables.index_select(0, order)
    chunks = []
    a = 0
    for n in counts:
        j = int(sorted_ns[a : a + n].max())
        need = -(-int(sorted_lens[a : a + n].max()) // block_size)
        if need > tables.shape[1]:
            raise ValueError(
                f"block_tables has {tables.shape[1]} columns but a sequence length needs {need} blocks of "
                f"{block_size} tokens: the table must cover every position below seq_len"
            )
        index = split_index(tables[a : a + n], block_size, num_kv_heads, j)
        # A decode row sits at position len - 1 and sees every key of its sequence.
        last = (sorted_lens[a : a + n] - 1)[:, None].to(block_tables.device)
        chunks.append(DecodeChunk(a, a + n, j, index, key_mask(last, j), last))
        a += n
    biggest = max((c.index.numel() for c in chunks), default=0)
    return DecodePlan(s, block_size, order, tuple(chunks), biggest)


def check_plan(plan: DecodePlan, num_seqs: int, block_size: int) -> None:
    """Refuse a plan made for another batch shape (ValueError)."""
    if plan.num_seqs != num_seqs or plan.block_size != block_size:
        raise ValueError(
            f"paged_decode: the plan was made for {plan.num_seqs} sequences of {plan.block_size}-token "
            f"blocks, called with {num_seqs} and {block_size}"
        )


def decode_with_plan(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: DecodePlan,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """Run the torch twin of ``paged_decode`` for one layer along ``plan``: q [S, Hq, D] -> [S, Hq, D].
    Per chunk: one gather per pool into a reused float32 buffer, then :func:`split_attention`, where a
    kv head's G query heads act as G query rows (padded, :func:`padded_rows`). ``window`` > 0: each row
    sees its last ``window`` keys (the plan serves every window; the layer's mask is made here)."""
    s, hq, d = q.shape
    _, b, hkv, _ = k_cache.shape
    group = hq // hkv
    rows = padded_rows(group, d)
    check_plan(plan, s, b)
    qg = q.view(s, hkv, group, d).to(torch.float32)
    if plan.order is not None:
        qg = qg.index_select(0, plan.order)
    if rows != group:
        qg = torch.nn.functional.pad(qg, (0, 0, 0, rows - group))
    k_buf = v_buf = None
    if len(plan.chunks) > 1 and k_cache.dtype == torch.float32:
        k_buf = torch.empty(plan.max_chunk_rows, d, dtype=torch.float32, device=k_cache.device)
        v_buf = torch.empty(plan.max_chunk_rows, d, dtype=torch.float32, device=k_cache.device)
    outs = []
    for c in plan.chunks:
        kg = gather_split_kv(k_cache, c.index, k_buf)
        vg = gather_split_kv(v_cache, c.index, v_buf)
        mask = c.mask if window <= 0 else key_mask(c.last, c.splits, window)
        outs.append(split_attention(qg[c.start : c.end], kg, vg, mask, scale))
    got = outs[0] if len(outs) == 1 else torch.cat(outs) if outs else qg[:0].float()
    got = got[:, :, :group]
    if plan.order is None:
        return got.to(q.dtype).reshape(s, hq, d)
    # NOTE: sequences of length 0 are in no chunk; the contract gives them zero rows.
    out = torch.empty(s, hkv, group, d, dtype=q.dtype, device=q.device)
    if plan.order.numel() < s:
        out.zero_()
    out.index_copy_(0, plan.order, got.to(q.dtype))
    return out.view(s, hq, d)
