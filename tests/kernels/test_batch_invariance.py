"""Batch invariance of the CPU attention (the torch twins the daemon runs, in both designs of
cpu_attention.py): bit for bit, not close.

- a prefill row equals the decode of the same position, whatever the chunking of the prompt and the
  other sequences of either call;
- a decode row is independent of the batch: its size (1..64), the other sequences' lengths, its slot
  in the batch and how the plan chunks the batch;
- the pieces this rests on (split_attention.py's NOTE): the GEMM gives a row the same bits for any
  row count padded_rows allows and any slot, the last-dim sum and exp give an element the same bits whatever
  surrounds it.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from kernels_ref import make_pool

from radixd.kernels import cpu_attention, paged_decode, paged_prefill
from radixd.kernels.paged_decode import plan_for
from radixd.kernels.split_attention import SPLIT_TOKENS, padded_rows

HQ, HKV, D = 9, 3, 64
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(params=["compiled", "split"])
def design(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both CPU attention designs: the compiled row kernel (the default) and the split design (the
    fallback where no C compiler is found); the contract holds for each."""
    monkeypatch.setenv(cpu_attention.ENV_DESIGN, str(request.param))
    return str(request.param)


def _decode(
    q: torch.Tensor,
    pool_k: torch.Tensor,
    pool_v: torch.Tensor,
    tables: torch.Tensor,
    lens: list[int],
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    plan = plan_for(tables, seq_lens, pool_k, chunk_bytes=chunk_bytes)
    return paged_decode(q, pool_k, pool_v, tables, seq_lens, D**-0.5, backend="torch", plan=plan)


def _prefill(
    q: torch.Tensor,
    pool_k: torch.Tensor,
    pool_v: torch.Tensor,
    tables: torch.Tensor,
    q_lens: list[int],
    lens: list[int],
) -> torch.Tensor:
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return paged_prefill(
        q, pool_k, pool_v, tables, cu, torch.tensor(lens, dtype=torch.int32), D**-0.5, backend="torch"
    )


def _chunking(rng: random.Random, total: int) -> list[int]:
    """Random chunk sizes summing to total (some 1-token chunks, some crossing split boundaries)."""
    sizes = []
    left = total
    while left:
        c = min(left, rng.choice([1, 2, 3, 7, SPLIT_TOKENS - 1, SPLIT_TOKENS + 5, 150]))
        sizes.append(c)
        left -= c
    return sizes


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prefill_rows_equal_decode_rows(dtype: torch.dtype, seed: int, design: str) -> None:
    """Every position of a chunked prefill (beside other prompts) equals its decode (in a random batch)."""
    rng = random.Random(seed)
    b = rng.choice([16, 8, 7])
    n_seq = 4
    lens = [rng.randint(1, 3 * SPLIT_TOKENS + 20) for _ in range(n_seq)]
    lens[0] = max(lens[0], 2 * SPLIT_TOKENS + 3)  # one long prompt crosses several splits
    pool = make_pool(lens, b, HKV, D, dtype, seed=seed)
    g = torch.Generator().manual_seed(seed)
    # One query per (sequence, position): the same rows feed the prefill and the decodes.
    qs = [torch.randn(n, HQ, D, generator=g).to(dtype) for n in lens]
    # Prefill: every sequence chunked its own way; each step carries one chunk of every unfinished one.
    chunks = [_chunking(rng, n) for n in lens]
    done = [0] * n_seq
    prefill_out = [torch.empty(n, HQ, D, dtype=dtype) for n in lens]
    step = 0
    while any(done[i] < lens[i] for i in range(n_seq)):
        members = [i for i in range(n_seq) if done[i] < lens[i]]
        rng.shuffle(members)
        q_lens = [chunks[i][step] if step < len(chunks[i]) else 0 for i in members]
        members = [i for i, ql in zip(members, q_lens, strict=True) if ql]
        q_lens = [ql for ql in q_lens if ql]
        ends = [done[i] + ql for i, ql in zip(members, q_lens, strict=True)]
        q = torch.cat([qs[i][done[i] : e] for i, e in zip(members, ends, strict=True)])
        out = _prefill(q, pool.k, pool.v, pool.block_tables[members], q_lens, ends)
        a = 0
        for i, ql, e in zip(members, q_lens, ends, strict=True):
            prefill_out[i][done[i] : e] = out[a : a + ql]
            done[i], a = e, a + ql
        step += 1
    # Decode: each position p of each sequence as one row of a random batch of other positions.
    for i in range(n_seq):
        for p in sorted([*rng.sample(range(lens[i]), min(lens[i], 12)), lens[i] - 1]):
            others = [(j, rng.randrange(lens[j])) for j in rng.choices(range(n_seq), k=rng.randint(0, 9))]
            batch = [*others[: len(others) // 2], (i, p), *others[len(others) // 2 :]]
            slot = len(others) // 2
            q = torch.stack([qs[j][pj] for j, pj in batch])
            tables = pool.block_tables[[j for j, _ in batch]]
            out = _decode(q, pool.k, pool.v, tables, [pj + 1 for _, pj in batch])
            assert torch.equal(out[slot], prefill_out[i][p]), f"seq {i} position {p}: prefill != decode"


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_decode_row_independent_of_batch(dtype: torch.dtype, design: str) -> None:
    """One sequence's decode row is the same alone and in batches of 1..64 of mixed lengths, at any slot
    and under any chunking of the plan."""
    rng = random.Random(7)
    lens = [rng.randint(1, 4 * SPLIT_TOKENS) for _ in range(64)]
    lens[0] = 2 * SPLIT_TOKENS + 17
    pool = make_pool(lens, 16, HKV, D, dtype, seed=3)
    q_all = torch.randn(64, HQ, D, generator=torch.Generator().manual_seed(4)).to(dtype)
    alone = _decode(q_all[:1], pool.k, pool.v, pool.block_tables[:1], lens[:1])
    for size in [1, 2, 3, 5, 8, 13, 32, 64]:
        idx = [0, *rng.sample(range(1, 64), size - 1)]
        rng.shuffle(idx)
        slot = idx.index(0)
        for chunk_bytes in (None, 1, 64 << 10):
            out = _decode(
                q_all[idx], pool.k, pool.v, pool.block_tables[idx], [lens[i] for i in idx], chunk_bytes
            )
            assert torch.equal(out[slot], alone[0]), f"batch {size}, chunk_bytes {chunk_bytes}"


def test_decode_rows_of_a_batch_equal_their_single_decodes(design: str) -> None:
    """Every row of a 64-sequence batch with mixed lengths equals that sequence decoded alone."""
    rng = random.Random(11)
    lens = [rng.randint(1, 5 * SPLIT_TOKENS) for _ in range(64)]
    pool = make_pool(lens, 16, HKV, D, torch.float32, seed=5)
    q = torch.randn(64, HQ, D, generator=torch.Generator().manual_seed(6))
    batch = _decode(q, pool.k, pool.v, pool.block_tables, lens)
    for i in range(64):
        one = _decode(q[i : i + 1], pool.k, pool.v, pool.block_tables[i : i + 1], lens[i : i + 1])
        assert torch.equal(batch[i], one[0]), f"row {i} (length {lens[i]})"


def test_gemm_row_bits_do_not_depend_on_row_count() -> None:
    """The premise: a row of float32 bmm's [M, K] @ [K, N] has the same bits for every row count
    padded_rows allows, at any slot and batch size, for both of split_attention's GEMMs (K = head dim,
    N = split; K = split, N = D). (A 16-bit pool is widened first: every GEMM runs in float32.)"""
    g = torch.Generator().manual_seed(0)
    for k_dim, n_dim in ((D, SPLIT_TOKENS), (SPLIT_TOKENS, D)):
        a = torch.randn(600, k_dim, generator=g)
        w = torch.randn(k_dim, n_dim, generator=g)
        want = torch.bmm(a[None], w[None])[0]
        for m in sorted({padded_rows(r, D) for r in (1, 3, 4, 5, 8, 9, 12, 13, 16, 31, 64, 100, 257)}):
            for off in (0, 3, 50):
                for batch in (1, 3, 40):
                    got = torch.bmm(
                        a[off : off + m][None].expand(batch, m, k_dim), w[None].expand(batch, k_dim, n_dim)
                    )
                    assert torch.equal(got[batch - 1], want[off : off + m]), (k_dim, n_dim, m, off, batch)


def test_exp_and_row_sum_bits_do_not_depend_on_surroundings() -> None:
    """The premise: exp of an element and the last-dim sum of a row do not depend on the tensor's size."""
    g = torch.Generator().manual_seed(1)
    x = -torch.rand(3000, SPLIT_TOKENS, generator=g) * 40
    e = torch.exp(x)
    s = e.sum(dim=-1)
    for n in (1, 2, 5, 17, 333, 2999):
        assert torch.equal(torch.exp(x[n - 1 : 2 * n - 1]), e[n - 1 : 2 * n - 1])
        assert torch.equal(e[:n].sum(dim=-1), s[:n])
    assert math.isfinite(float(s.sum()))
