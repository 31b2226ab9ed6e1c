"""paged_prefill (extend) against a float64 reference, and against paged_decode for one-token chunks."""

from __future__ import annotations

import math

import pytest
import torch
from kernels_ref import make_pool, ref_prefill, tol

from radixd.kernels import paged_decode, paged_prefill


def _run(
    backend: str,
    hq: int,
    hkv: int,
    d: int,
    b: int,
    lens: list[int],
    q_lens: list[int],
    dtype: torch.dtype = torch.float32,
    share: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    pool = make_pool(lens, b, hkv, d, dtype, share_prefix_blocks=share, seed=7)
    q = torch.randn(sum(q_lens), hq, d, generator=torch.Generator().manual_seed(8)).to(dtype)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    scale = 1.0 / math.sqrt(d)
    out = paged_prefill(
        q,
        pool.k,
        pool.v,
        pool.block_tables,
        cu,
        torch.tensor(lens, dtype=torch.int32),
        scale,
        backend=backend,
    )
    return out, ref_prefill(q, pool.k, pool.v, pool.tables, q_lens, lens, scale)


# (Hq, Hkv, D, B, seq_lens, q_lens): plain prefill, chunk after a cached prefix (incl. lengths
# B-1, B, B+1 around a block edge), an empty chunk, a one-token chunk.
CASES = [
    (9, 3, 64, 16, [20, 17, 16, 15, 3, 0], [20, 5, 16, 1, 0, 0]),
    (4, 4, 80, 1, [9, 4], [3, 4]),
    (16, 2, 128, 8, [70, 9], [70, 2]),
]


@pytest.mark.parametrize("case", CASES, ids=["smollm2", "b1-d80", "gqa8-d128"])
def test_prefill_matches_reference_fp32(backend: str, case: tuple) -> None:  # type: ignore[type-arg]
    hq, hkv, d, b, lens, q_lens = case
    out, ref = _run(backend, hq, hkv, d, b, lens, q_lens)
    assert out.shape == ref.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, **tol(torch.float32))


def test_prefill_matches_reference_fp16(backend: str) -> None:
    out, ref = _run(backend, 8, 2, 64, 16, [40, 17], [24, 17], dtype=torch.float16)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.double(), ref, **tol(torch.float16))


def test_prefill_over_shared_prefix_blocks(backend: str) -> None:
    """Two requests hitting the same cached prefix blocks (radix hit) each extend correctly."""
    out, ref = _run(backend, 8, 2, 64, 4, [14, 14, 11], [3, 2, 11], share=3)
    torch.testing.assert_close(out.double(), ref, **tol(torch.float32))


def test_one_token_chunks_equal_decode(backend: str) -> None:
    lens = [33, 16, 1]
    pool = make_pool(lens, 16, 3, 64, seed=9)
    q = torch.randn(3, 9, 64)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    cu = torch.arange(4, dtype=torch.int32)
    pre = paged_prefill(q, pool.k, pool.v, pool.block_tables, cu, seq_lens, 0.125, backend=backend)
    dec = paged_decode(q, pool.k, pool.v, pool.block_tables, seq_lens, 0.125, backend=backend)
    torch.testing.assert_close(pre, dec, atol=1e-5, rtol=1e-5)


def test_prefill_rejects_bad_cu_q_lens() -> None:
    pool = make_pool([5], 4, 2, 64)
    with pytest.raises(ValueError, match="cu_q_lens"):
        paged_prefill(
            torch.zeros(5, 4, 64),
            pool.k,
            pool.v,
            pool.block_tables,
            torch.tensor([0, 5, 5], dtype=torch.int32),
            torch.tensor([5], dtype=torch.int32),
            0.1,
            backend="torch",
        )


def test_prefill_rejects_more_new_tokens_than_kv() -> None:
    pool = make_pool([5], 4, 2, 64)
    with pytest.raises(ValueError, match="q_len <= seq_len"):
        paged_prefill(
            torch.zeros(6, 4, 64),
            pool.k,
            pool.v,
            pool.block_tables,
            torch.tensor([0, 6], dtype=torch.int32),
            torch.tensor([5], dtype=torch.int32),
            0.1,
            backend="torch",
        )
