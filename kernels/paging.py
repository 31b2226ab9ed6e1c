"""Block-table gathers shared by the torch twins: whole dense blocks per index, length-sorted chunks.

The twins never loop per sequence or per token: a batch is gathered with one ``index_select`` per
pool (per chunk), and chunks group sequences of similar length so padding stays small.
"""

from __future__ import annotations

import torch


def gather_kv(
    cache: torch.Tensor, block_tables: torch.Tensor, num_blocks: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Gather the first ``num_blocks`` table entries of every sequence: [S, num_blocks * B, Hkv, D]."""
    s = block_tables.shape[0]
    _, b, h, d = cache.shape
    if num_blocks > block_tables.shape[1]:
        raise ValueError(
            f"block_tables has {block_tables.shape[1]} columns but a sequence length needs {num_blocks} "
            f"blocks of {b} tokens: the table must cover every position below seq_len"
        )
    idx = block_tables[:, :num_blocks].reshape(-1)  # int32 or int64: index_select takes both
    # NOTE: index_select on the block axis copies whole dense blocks (B*H*D elements) per index,
    # the cheapest gather torch offers on CPU.
    if out is None:
        return cache.index_select(0, idx).view(s, num_blocks * b, h, d)
    buf = out.view(-1)[: idx.numel() * b * h * d].view(idx.numel(), b, h, d)
    torch.index_select(cache, 0, idx, out=buf)
    return buf.view(s, num_blocks * b, h, d)


# Gathered K+V bytes per chunk of sequences: small enough to stay in the CPU's L2/L3 between the
# gather and the attention that reads it.
CHUNK_BYTES = 8 << 20


def length_chunks(
    lens: torch.Tensor, block_size: int, bytes_per_block: int
) -> tuple[torch.Tensor, list[int]]:
    """Sort sequences by length (longest first) and cut them into chunks of about CHUNK_BYTES.

    Returns the order (a permutation of sequence indices, empty sequences dropped) and the chunk sizes;
    similar lengths share a chunk, so padding to the chunk's longest stays small."""
    lens = lens.long().cpu()
    order = torch.argsort(lens, descending=True, stable=True)
    order = order[lens[order] > 0]
    if order.numel() == 0:
        return order, []
    blocks = (lens[order] + block_size - 1) // block_size
    cost = torch.cumsum(blocks * bytes_per_block, 0)
    chunk_id = torch.div(cost - 1, CHUNK_BYTES, rounding_mode="floor")
    _, counts = torch.unique_consecutive(chunk_id, return_counts=True)
    return order, [int(c) for c in counts]


def chunk_starts(counts: list[int]) -> list[int]:
    """Index of each chunk's first (longest) sequence in the sorted order."""
    starts, a = [], 0
    for c in counts:
        starts.append(a)
        a += c
    return starts
