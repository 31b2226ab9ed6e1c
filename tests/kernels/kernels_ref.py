"""Independent float64 references and pool builders for the kernel tests.

The references gather K/V token by token through the block table with plain indexing and run an
explicit softmax in float64: nothing is shared with the code under test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def ref_attention(
    q: torch.Tensor,  # [Hq, D] one token
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: list[int],
    n_keys: int,
    scale: float,
) -> torch.Tensor:
    """float64 attention of one query token over the first ``n_keys`` positions of a block table."""
    hq, d = q.shape
    _, b, hkv, _ = k_cache.shape
    group = hq // hkv
    out = torch.zeros(hq, d, dtype=torch.float64)
    if n_keys == 0:
        return out
    k = torch.stack([k_cache[table[p // b], p % b] for p in range(n_keys)]).double()  # [L, Hkv, D]
    v = torch.stack([v_cache[table[p // b], p % b] for p in range(n_keys)]).double()
    for h in range(hq):
        scores = (k[:, h // group] @ q[h].double()) * scale
        w = torch.softmax(scores, dim=0)
        out[h] = w @ v[:, h // group]
    return out


def ref_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: list[list[int]],
    lens: list[int],
    scale: float,
) -> torch.Tensor:
    """float64 decode reference: one query token per sequence, over ``lens[s]`` keys."""
    return torch.stack(
        [ref_attention(q[s], k_cache, v_cache, tables[s], lens[s], scale) for s in range(len(lens))]
    )


def ref_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: list[list[int]],
    q_lens: list[int],
    lens: list[int],
    scale: float,
) -> torch.Tensor:
    """float64 extend reference: new token i of s sits at lens[s] - q_lens[s] + i, causal."""
    rows: list[torch.Tensor] = []
    start = 0
    for s, (ql, sl) in enumerate(zip(q_lens, lens, strict=True)):
        for i in range(ql):
            rows.append(ref_attention(q[start + i], k_cache, v_cache, tables[s], sl - ql + i + 1, scale))
        start += ql
    if not rows:
        return torch.zeros(0, q.shape[1], q.shape[2], dtype=torch.float64)
    return torch.stack(rows)


def prefill_in_chunks(
    prefill: Callable[[torch.Tensor, list[int], list[int], list[int]], torch.Tensor],
    qs: list[torch.Tensor],
    chunks: list[list[int]],
) -> list[torch.Tensor]:
    """Prefill prompts (prompt i's query rows ``qs[i]``) in steps: step s prefills chunk ``chunks[i][s]``
    of every prompt that has one, all in one ``prefill(q, members, q_lens, ends)`` call (``ends``: each
    member's KV length after the step). Returns each prompt's output rows."""
    outs = [torch.empty_like(q) for q in qs]
    done = [0] * len(qs)
    for step in range(max(len(c) for c in chunks)):
        members = [i for i, c in enumerate(chunks) if step < len(c)]
        q_lens = [chunks[i][step] for i in members]
        ends = [done[i] + n for i, n in zip(members, q_lens, strict=True)]
        out = prefill(
            torch.cat([qs[i][done[i] : e] for i, e in zip(members, ends, strict=True)]), members, q_lens, ends
        )
        a = 0
        for i, n, e in zip(members, q_lens, ends, strict=True):
            outs[i][done[i] : e] = out[a : a + n]
            done[i], a = e, a + n
    return outs


@dataclass
class Pool:
    k: torch.Tensor
    v: torch.Tensor
    tables: list[list[int]]
    block_tables: torch.Tensor  # int32, padded with 0

    @property
    def block_size(self) -> int:
        return int(self.k.shape[1])


def make_pool(
    lens: list[int],
    block_size: int,
    hkv: int,
    d: int,
    dtype: torch.dtype = torch.float32,
    share_prefix_blocks: int = 0,
    extra_blocks: int = 3,
    seed: int = 0,
) -> Pool:
    """A random pool whose sequences use shuffled physical blocks (block 0 stays the null block).

    With ``share_prefix_blocks`` > 0, every sequence after the first reuses the first sequence's
    leading blocks (prefix sharing), as far as both are long enough.
    """
    g = torch.Generator().manual_seed(seed)
    need = [(n + block_size - 1) // block_size for n in lens]
    total = sum(need) + extra_blocks + 1
    k = torch.randn(total, block_size, hkv, d, generator=g).to(dtype)
    v = torch.randn(total, block_size, hkv, d, generator=g).to(dtype)
    free = (torch.randperm(total - 1, generator=g) + 1).tolist()
    tables: list[list[int]] = []
    for i, n in enumerate(need):
        if i > 0 and share_prefix_blocks:
            shared = tables[0][: min(share_prefix_blocks, n, len(tables[0]))]
        else:
            shared = []
        tables.append(shared + [free.pop() for _ in range(n - len(shared))])
    width = max([len(t) for t in tables] + [1]) + 1  # one spare padded column
    bt = torch.zeros(len(lens), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        bt[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    return Pool(k, v, tables, bt)


def tol(dtype: torch.dtype) -> dict[str, float]:
    if dtype == torch.float32:
        return {"atol": 2e-5, "rtol": 2e-5}
    if dtype == torch.float16:
        return {"atol": 3e-3, "rtol": 3e-3}
    return {"atol": 1.5e-2, "rtol": 1e-2}
