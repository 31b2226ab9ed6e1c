"""Batch invariance of the Triton kernels, run under TRITON_INTERPRET=1 (small shapes: it is slow).

What this proves is the kernels' *order*: splits fixed by position, the same tile body and fold in the
prefill and the decode kernel, no dependence on the batch. The interpreter runs ``tl.dot`` with numpy,
so bit equality here says nothing about a GPU's MMA units; that needs a GPU run (bench/gpu_check.py).
"""

from __future__ import annotations

import importlib
import random

import pytest
import torch
from kernels_ref import make_pool

from radixd.kernels import paged_decode, paged_prefill

# The package exports functions under the modules' names: reach the modules themselves.
paged_decode_mod = importlib.import_module("radixd.kernels.paged_decode")
paged_prefill_mod = importlib.import_module("radixd.kernels.paged_prefill")

HQ, HKV, D, B = 4, 2, 16, 8
SPLIT = 64  # smaller than the default so that short sequences cross several splits


@pytest.fixture
def small_splits(monkeypatch: pytest.MonkeyPatch, interpret: None) -> None:
    monkeypatch.setattr(paged_decode_mod, "SPLIT_TOKENS", SPLIT)
    monkeypatch.setattr(paged_prefill_mod, "SPLIT_TOKENS", SPLIT)


def _decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables: torch.Tensor, lens: list[int]
) -> torch.Tensor:
    return paged_decode(q, k, v, tables, torch.tensor(lens, dtype=torch.int32), D**-0.5, backend="triton")


def test_prefill_rows_equal_decode_rows_triton(small_splits: None) -> None:
    rng = random.Random(0)
    lens = [150, 70]
    pool = make_pool(lens, B, HKV, D, seed=2)
    g = torch.Generator().manual_seed(3)
    qs = [torch.randn(n, HQ, D, generator=g) for n in lens]
    chunks = [[40, 1, 70, 39], [3, 67]]
    outs = [torch.empty(n, HQ, D) for n in lens]
    done = [0, 0]
    for step in range(4):
        members = [i for i in range(2) if step < len(chunks[i])]
        q_lens = [chunks[i][step] for i in members]
        ends = [done[i] + ql for i, ql in zip(members, q_lens, strict=True)]
        q = torch.cat([qs[i][done[i] : e] for i, e in zip(members, ends, strict=True)])
        cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        out = paged_prefill(
            q,
            pool.k,
            pool.v,
            pool.block_tables[members],
            cu,
            torch.tensor(ends, dtype=torch.int32),
            D**-0.5,
            backend="triton",
        )
        a = 0
        for i, ql, e in zip(members, q_lens, ends, strict=True):
            outs[i][done[i] : e] = out[a : a + ql]
            done[i], a = e, a + ql
    for i, n in enumerate(lens):
        for p in sorted({0, SPLIT - 1, SPLIT, n - 1, *rng.sample(range(n), 4)}):
            if p >= n:
                continue
            other = 1 - i
            po = rng.randrange(lens[other])
            q = torch.stack([qs[other][po], qs[i][p]])
            got = _decode(q, pool.k, pool.v, pool.block_tables[[other, i]], [po + 1, p + 1])
            assert torch.equal(got[1], outs[i][p]), f"seq {i} position {p}"


def test_decode_row_independent_of_batch_triton(small_splits: None) -> None:
    rng = random.Random(1)
    lens = [rng.randint(1, 3 * SPLIT) for _ in range(12)]
    lens[0] = 2 * SPLIT + 5
    pool = make_pool(lens, B, HKV, D, seed=4)
    q = torch.randn(12, HQ, D, generator=torch.Generator().manual_seed(5))
    alone = _decode(q[:1], pool.k, pool.v, pool.block_tables[:1], lens[:1])
    for size in (2, 5, 12):
        idx = [0, *rng.sample(range(1, 12), size - 1)]
        rng.shuffle(idx)
        got = _decode(q[idx], pool.k, pool.v, pool.block_tables[idx], [lens[i] for i in idx])
        assert torch.equal(got[idx.index(0)], alone[0]), f"batch of {size}"
