"""The CPU attention both torch twins run: one reduction order per query row, fixed by positions only.

A row at position ``p`` attends to keys ``0..p`` in splits of ``S = SPLIT_TOKENS`` positions (split
``j`` holds keys ``[j * S, (j + 1) * S)``), so its arithmetic is the same in a decode step or a prefill
chunk, alone or beside any rows: (1) scores, one batched GEMM per (split, row group, kv head) with
``N = S``, ``K = head_dim``, keys past ``p`` at ``-inf`` (a partial last split is padded, never
shortened); (2) ``m`` = the row's exact max score, ``e = exp(s - m)``; (3) per split ``l_j = sum(e)``
and ``acc_j = e @ V_j``; (4) splits summed by a pairwise tree over the split index, where trailing
all-zero splits leave the others' grouping as it was (padding a row to more splits changes nothing);
(5) ``out = acc / l + 0.0`` (a ``-0.0`` would depend on which zeros were added). Under a sliding window
``W`` the keys before ``p - W + 1`` are masked like those past ``p``: the row keeps its splits from 0,
so its order is still fixed by its position (this fallback skips nothing; the compiled and Triton
kernels do).

NOTE: this rests on (tests/kernels/test_batch_invariance.py checks it on the machine at hand): the CPU
GEMM gives a row of ``[M, K] @ [K, N]`` the same arithmetic for every allowed ``M`` (:func:`padded_rows`,
measured at first use; other counts take other kernels, hence the padding) and every slot in the batch,
and torch's ``exp`` and last-dim ``sum`` give a row the same bits whatever surrounds it. All in float32
(a bf16/fp16 pool is widened while gathered), so the compute dtype never changes the order.
"""

from __future__ import annotations

import functools
import warnings

import torch

# Keys per split. A multiple of every block size the daemon uses (16); small enough that padding a
# short sequence's last split costs little, big enough that each GEMM amortizes its call.
SPLIT_TOKENS = 64
# Row counts probed for the GEMMs' row classes (every count up to 16, then a spread up to 512). The
# reference is a 600-row call; counts past the largest probed one count as agreeing when every probed
# count from 64 on did (a GEMM's big-M path does not change with M).
_PROBE_ROWS = (*range(1, 17), 20, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
_REF_ROWS = 600


@functools.cache
def _allowed_rows(head_dim: int, threads: int) -> tuple[tuple[int, ...], bool]:
    """Row counts whose float32 ``bmm`` gives a row the bits a 600-row call gives it, for both of
    split_attention's GEMMs (K = head_dim, N = split; K = split, N = head_dim), at any slot and batch size;
    and whether counts past the largest probed one agree too.

    NOTE: which counts share the big-M kernel is the BLAS library's undocumented choice (MKL on AVX2: 4, 8
    and >= 12; 1-3 rows and, one matrix in the batch, 5-7 and 9-11 take others), differing by CPU, build
    and thread count: measured once per process (milliseconds), not assumed."""
    del threads  # part of the cache key: the kernels split their work by thread
    g = torch.Generator().manual_seed(0)
    ok = {m: True for m in _PROBE_ROWS}
    with torch.inference_mode():
        for k_dim, n_dim in ((head_dim, SPLIT_TOKENS), (SPLIT_TOKENS, head_dim)):
            a = torch.randn(_REF_ROWS, k_dim, generator=g)
            w = torch.randn(k_dim, n_dim, generator=g)
            want = torch.bmm(a[None], w[None])[0]
            for m in _PROBE_ROWS:
                for off, batch in ((0, 1), (3, 3), (50, 40)):
                    got = torch.bmm(
                        a[off : off + m][None].expand(batch, m, k_dim), w[None].expand(batch, k_dim, n_dim)
                    )
                    ok[m] = ok[m] and torch.equal(got[batch - 1], want[off : off + m])
    allowed = tuple(m for m in _PROBE_ROWS if ok[m])
    tail = all(ok[m] for m in _PROBE_ROWS if m >= 64)
    if not tail:
        warnings.warn(
            "the float32 bmm of this CPU/BLAS gives rows of large calls different bits by row count: "
            "attention rows of long prefill chunks are not batch-invariant here",
            RuntimeWarning,
            stacklevel=2,
        )
    return allowed, tail


def padded_rows(rows: int, head_dim: int) -> int:
    """Query rows per (sequence, kv head) after padding to the smallest count whose GEMM arithmetic
    equals every other allowed count's (measured by :func:`_allowed_rows`)."""
    allowed, tail = _allowed_rows(head_dim, torch.get_num_threads())
    for m in allowed:
        if m >= rows:
            return m
    return rows if tail or not allowed else max(rows, allowed[-1])


def num_splits(max_len: int) -> int:
    """Splits covering positions ``0..max_len-1`` (at least one)."""
    return max(1, -(-max_len // SPLIT_TOKENS))


def split_index(tables: torch.Tensor, block_size: int, num_kv_heads: int, splits: int) -> torch.Tensor:
    """Pool rows of every (split, sequence, kv head, key) for :func:`gather_split_kv`: int64 [J*n*Hkv*S].

    Row ``r`` of a pool viewed as [N * B * Hkv, D] holds (block r // (B*Hkv), offset, head). Keys past the
    table's width read the null block 0, keys past a sequence's length whatever its blocks hold: finite
    values that the key mask removes."""
    n, width = tables.shape
    pos = torch.arange(splits * SPLIT_TOKENS, device=tables.device)
    col = pos // block_size
    blocks = tables.long()[:, col.clamp(max=max(width - 1, 0))]
    if width == 0:
        blocks = torch.zeros(n, pos.numel(), dtype=torch.long, device=tables.device)
    blocks = torch.where(col < width, blocks, 0)
    slot = (blocks * block_size + pos % block_size).view(n, splits, 1, SPLIT_TOKENS).transpose(0, 1)
    heads = torch.arange(num_kv_heads, device=tables.device).view(1, 1, num_kv_heads, 1)
    return (slot * num_kv_heads + heads).reshape(-1)


def gather_split_kv(
    cache: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Gather the rows of ``index`` (:func:`split_index`) in one copy: float32 [J*n*Hkv*S, D] (a 16-bit
    pool widened). The (split, sequence, head)-major order lets one ``bmm`` batch span all three."""
    d = cache.shape[3]
    # NOTE: the daemon's pools are contiguous; a strided one (a view into something bigger) is copied.
    flat = cache.view(-1, d) if cache.is_contiguous() else cache.reshape(-1, d)
    if cache.dtype == torch.float32:
        if out is None:
            return flat.index_select(0, index)
        return torch.index_select(flat, 0, index, out=out.view(-1)[: index.numel() * d].view(-1, d))
    return flat.index_select(0, index).float()


def key_mask(row_pos: torch.Tensor, splits: int, window: int = 0) -> torch.Tensor:
    """Additive float32 mask, ``-inf`` where a key lies past its row (or, ``window`` > 0, at or before
    ``row_pos - window``): row_pos [n, R] (int64) -> [J, n, 1, R, S] (broadcast over the kv heads; R = 1
    broadcasts over the rows too)."""
    keys = torch.arange(splits * SPLIT_TOKENS, device=row_pos.device).view(splits, 1, 1, 1, SPLIT_TOKENS)
    pos = row_pos[None, :, None, :, None]
    past = keys > pos
    if window > 0:
        past |= keys <= pos - window
    zero = torch.zeros((), dtype=torch.float32, device=row_pos.device)
    return torch.where(past, float("-inf"), zero)


def split_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of float32 q [n, Hkv, M, D] (M from :func:`padded_rows`) over the gathered keys and values
    (:func:`gather_split_kv`, [J*n*Hkv*S, D]) with :func:`key_mask`'s ``mask`` -> float32 [n, Hkv, M, D].
    Every row needs a key unmasked (a row always sees its own position; a padding row at 0, key 0).
    """
    n, hkv, m, d = q.shape
    s = SPLIT_TOKENS
    j = k.shape[0] // (n * hkv * s)
    if m != padded_rows(m, d):
        raise ValueError(f"split_attention needs an allowed row count per group (padded_rows), got {m}")
    # One copy scales the rows and repeats them for each split (the bmm batch is split-major).
    qx = torch.empty(j, n, hkv, m, d, dtype=torch.float32, device=q.device)
    torch.mul(q.unsqueeze(0).expand(j, n, hkv, m, d), scale, out=qx)
    qx = qx.view(j * n * hkv, m, d)
    sc = torch.bmm(qx, k.view(j * n * hkv, s, d).transpose(1, 2)).view(j, n, hkv, m, s)
    sc.add_(mask)
    sc.sub_(sc.amax(dim=(0, 4), keepdim=True)).exp_()
    acc = torch.bmm(sc.view(j * n * hkv, m, s), v.view(j * n * hkv, s, d)).view(j, n, hkv, m, d)
    l_sum = sc.sum(dim=4, keepdim=True)  # [j, n, hkv, m, 1]
    if j > 1:
        both = _tree_sum(torch.cat((acc, l_sum), dim=4))
        acc, l_sum = both[..., :d], both[..., d:]
    else:
        acc, l_sum = acc[0], l_sum[0]
    return torch.div(acc, l_sum).add_(0.0)


def _tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over dim 0 by a pairwise tree on the index ((0,1), (2,3), ...; an odd last passes up). A trailing
    zero term changes no group of the others, so padding rows to more splits is exact."""
    while x.shape[0] > 1:
        j = x.shape[0]
        h = j // 2
        y = torch.add(x[0 : 2 * h : 2], x[1 : 2 * h : 2])
        x = torch.cat((y, x[j - 1 :])) if j % 2 else y
    return x[0]
