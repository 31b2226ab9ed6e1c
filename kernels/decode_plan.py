"""The CPU decode twin's work split, planned once per step and replayed by every layer.

All layers of a decode step attend through the same block tables and lengths, so everything that
depends only on them (length sort, chunk boundaries, the flat gather indices, the padding masks) is
computed once by :func:`plan_decode`; each layer then only gathers K/V and runs SDPA per chunk.

Chunks hold sequences of similar length whose gathered K+V fit in about ``TARGET_CHUNK_BYTES``, so
the freshly gathered chunk is still in the core's L2 when SDPA reads it back. Between two layers the
weights stream through the caches, so a layer's pool comes from memory; gathering a big batch at once
would make SDPA read every gathered byte from memory a second time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Gathered K+V bytes per chunk: one core's L2 (2 MiB on this project's CPUs). Measured over whole
# 30-layer decode steps with cold pools (bench/decode_chunks.py, docs/bench-kernels.md): 0.5-2 MiB
# chunks beat gathering the whole batch at once by up to 2.3x (3-5x under heavier load).
TARGET_CHUNK_BYTES = 2 << 20


@dataclass(frozen=True)
class DecodeChunk:
    """Rows ``[start, end)`` of the length-sorted batch, padded to ``num_blocks`` blocks."""

    start: int
    end: int
    num_blocks: int
    block_ids: torch.Tensor  # [(end - start) * num_blocks] pool block of each gathered slot
    mask: torch.Tensor | None  # additive [n, 1, 1, num_blocks * B], None when no row is padded


@dataclass(frozen=True)
class DecodePlan:
    """How the torch twin of ``paged_decode`` splits one step; valid for any layer of that step."""

    num_seqs: int
    block_size: int
    order: torch.Tensor | None  # sorted position -> sequence (only non-empty ones); None: identity
    chunks: tuple[DecodeChunk, ...]
    max_chunk_blocks: int  # largest chunk, in gathered blocks: sizes the reusable K/V buffers


def plan_decode(
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    bytes_per_block: int,
    dtype: torch.dtype,
    chunk_bytes: int | None = None,
) -> DecodePlan:
    """Split a decode batch into length-sorted chunks of about ``chunk_bytes`` gathered K+V.

    ``bytes_per_block``: one block of K plus one of V. Sequences of length 0 belong to no chunk
    (their output is zeros). A batch that fits one chunk keeps its order and needs no permutation.
    """
    target = TARGET_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    s = block_tables.shape[0]
    lens = seq_lens.long().cpu()
    nblocks = (lens + block_size - 1) // block_size
    if s > 0 and bool((lens > 0).all()) and s * int(nblocks.max()) * bytes_per_block <= target:
        order: torch.Tensor | None = None
        sorted_lens, sorted_nb, counts = lens, nblocks, [s]
    else:
        perm = torch.argsort(lens, descending=True, stable=True)
        perm = perm[lens[perm] > 0]
        sorted_lens, sorted_nb = lens[perm], nblocks[perm]
        # Greedy cut: a chunk grows while its padded size (rows x longest row) stays in the target.
        counts = []
        nb_list = sorted_nb.tolist()
        a = 0
        while a < len(nb_list):
            per_row = max(nb_list[a], 1) * bytes_per_block
            n = max(1, min(len(nb_list) - a, target // per_row))
            counts.append(n)
            a += n
        order = perm.to(block_tables.device)
    tables = block_tables if order is None else block_tables.index_select(0, order)
    chunks = []
    a = 0
    for n in counts:
        nb = int(sorted_nb[a : a + n].max())
        chunk_lens = sorted_lens[a : a + n]
        length = nb * block_size
        mask = None
        if bool((chunk_lens != length).any()):
            # An additive float mask: SDPA would turn a boolean one into this anyway, one op later.
            pos = torch.arange(length)
            mask = torch.where(pos[None, :] < chunk_lens[:, None], 0.0, float("-inf")).to(dtype)
            mask = mask.view(n, 1, 1, length).to(block_tables.device)
        if nb > tables.shape[1]:
            raise ValueError(
                f"block_tables has {tables.shape[1]} columns but a sequence length needs {nb} blocks of "
                f"{block_size} tokens: the table must cover every position below seq_len"
            )
        ids = tables[a : a + n, :nb].reshape(-1)
        chunks.append(DecodeChunk(a, a + n, nb, ids, mask))
        a += n
    biggest = max((c.num_blocks * (c.end - c.start) for c in chunks), default=0)
    return DecodePlan(s, block_size, order, tuple(chunks), biggest)


def decode_with_plan(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodePlan, scale: float
) -> torch.Tensor:
    """Run the torch twin of ``paged_decode`` for one layer along ``plan``: q [S, Hq, D] -> [S, Hq, D].

    Per chunk: one ``index_select`` per pool into a reused buffer, then one SDPA in which the G
    query heads of a kv head act as G query rows (no K/V repeat).
    """
    s, hq, d = q.shape
    _, b, hkv, _ = k_cache.shape
    group = hq // hkv
    if plan.num_seqs != s or plan.block_size != b:
        raise ValueError(
            f"paged_decode: the plan was made for {plan.num_seqs} sequences of {plan.block_size}-token "
            f"blocks, called with {s} and {b}"
        )
    qg = q.view(s, hkv, group, d).to(k_cache.dtype)
    if plan.order is not None:
        qg = qg.index_select(0, plan.order)
    slots = plan.max_chunk_blocks * b * hkv * d
    k_buf = torch.empty(slots, dtype=k_cache.dtype, device=k_cache.device)
    v_buf = torch.empty(slots, dtype=k_cache.dtype, device=k_cache.device)
    outs = []
    for c in plan.chunks:
        n, m = c.end - c.start, c.block_ids.numel()
        kg = torch.index_select(k_cache, 0, c.block_ids, out=k_buf[: m * b * hkv * d].view(m, b, hkv, d))
        vg = torch.index_select(v_cache, 0, c.block_ids, out=v_buf[: m * b * hkv * d].view(m, b, hkv, d))
        length = c.num_blocks * b
        outs.append(
            F.scaled_dot_product_attention(
                qg[c.start : c.end],
                kg.view(n, length, hkv, d).transpose(1, 2),
                vg.view(n, length, hkv, d).transpose(1, 2),
                attn_mask=c.mask,
                scale=scale,
            )
        )
    got = outs[0] if len(outs) == 1 else torch.cat(outs) if outs else qg[:0]
    if plan.order is None:
        return got.to(q.dtype).view(s, hq, d)
    # NOTE: sequences of length 0 are in no chunk; the contract gives them zero rows.
    out = torch.empty(s, hkv, group, d, dtype=q.dtype, device=q.device)
    if plan.order.numel() < s:
        out.zero_()
    out.index_copy_(0, plan.order, got.to(q.dtype))
    return out.view(s, hq, d)
