"""paged_decode (Triton under the interpreter and the torch twin) against a float64 reference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from kernels_ref import make_pool, ref_decode, tol

from radixd.kernels import paged_decode
from radixd.kernels.paged_decode import plan_for

# (Hq, Hkv, D, B): GQA ratios 3, 1, 8, 4; head dims 64, 80, 128; block sizes 16, 1, 64, 7.
SHAPES = [(9, 3, 64, 16), (4, 4, 80, 1), (16, 2, 128, 64), (8, 2, 64, 7)]


def _lens(b: int) -> list[int]:
    """Ragged lengths: 0, 1, B-1, B, B+1 and a multi-block one."""
    return sorted({0, 1, max(b - 1, 1), b, b + 1, 3 * b + 2}, reverse=True)


def _run(
    backend: str, shape: tuple[int, int, int, int], dtype: torch.dtype, lens: list[int], **kw: object
) -> tuple[torch.Tensor, torch.Tensor]:
    hq, hkv, d, b = shape
    pool = make_pool(lens, b, hkv, d, dtype, share_prefix_blocks=kw.pop("share", 0))  # type: ignore[arg-type]
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(1)).to(dtype)
    scale = 1.0 / math.sqrt(d)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    out = paged_decode(q, pool.k, pool.v, pool.block_tables, seq_lens, scale, backend=backend, **kw)  # type: ignore[arg-type]
    ref = ref_decode(q, pool.k, pool.v, pool.tables, lens, scale)
    return out, ref


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "hq{}-hkv{}-d{}-b{}".format(*s))
def test_decode_matches_reference_fp32(backend: str, shape: tuple[int, int, int, int]) -> None:
    out, ref = _run(backend, shape, torch.float32, _lens(shape[3]))
    assert out.dtype == torch.float32 and out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref, **tol(torch.float32))


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[2]], ids=["smollm2", "gqa8-d128"])
def test_decode_matches_reference_fp16(backend: str, shape: tuple[int, int, int, int]) -> None:
    out, ref = _run(backend, shape, torch.float16, _lens(shape[3]))
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.double(), ref, **tol(torch.float16))


def test_decode_shared_prefix_blocks(backend: str) -> None:
    """Sequences that share physical prefix blocks read the same keys and stay correct."""
    out, ref = _run(backend, (8, 2, 64, 4), torch.float32, [13, 13, 9, 6], share=3)
    torch.testing.assert_close(out.double(), ref, **tol(torch.float32))


def test_decode_splits_agree(interpret: None) -> None:
    """Splits of 64, 128 and 256 keys give the same result (and the reference's)."""
    shape = (9, 3, 64, 8)
    lens = [200, 70, 33, 8, 1, 0]
    outs = [_run("triton", shape, torch.float32, lens, split_tokens=n) for n in (64, 128, 256)]
    for out, ref in outs:
        torch.testing.assert_close(out.double(), ref, **tol(torch.float32))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(outs[0][0], outs[2][0], atol=1e-6, rtol=1e-6)


def test_identity_table_equals_contiguous_attention(backend: str) -> None:
    """Blocks 0..n-1 in order are one contiguous cache: compare with plain SDPA on it."""
    s, hq, hkv, d, b, n = 3, 8, 2, 64, 16, 4
    g = torch.Generator().manual_seed(3)
    k = torch.randn(s * n, b, hkv, d, generator=g)
    v = torch.randn(s * n, b, hkv, d, generator=g)
    q = torch.randn(s, hq, d, generator=g)
    tables = torch.arange(s * n, dtype=torch.int32).view(s, n)
    lens = torch.full((s,), n * b, dtype=torch.int32)
    out = paged_decode(q, k, v, tables, lens, 0.125, backend=backend)
    kc = k.view(s, n * b, hkv, d).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    vc = v.view(s, n * b, hkv, d).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    want = F.scaled_dot_product_attention(q[:, :, None], kc, vc, scale=0.125)[:, :, 0]
    torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)


def test_permuting_the_pool_changes_nothing(backend: str) -> None:
    hq, hkv, d, b = 9, 3, 64, 16
    lens = [40, 17, 1]
    pool = make_pool(lens, b, hkv, d, extra_blocks=5, seed=4)
    q = torch.randn(len(lens), hq, d)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    base = paged_decode(q, pool.k, pool.v, pool.block_tables, seq_lens, 0.125, backend=backend)
    n = pool.k.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(5))  # new block i = old perm[i]
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(n)
    tables = inv[pool.block_tables.long()].int()
    moved = paged_decode(q, pool.k[perm], pool.v[perm], tables, seq_lens, 0.125, backend=backend)
    torch.testing.assert_close(moved, base, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("chunk_bytes", [1, 3 * 2 * 16 * 3 * 64 * 4, 1 << 30], ids=["row", "mid", "one"])
def test_planned_chunks_match_reference(chunk_bytes: int) -> None:
    """Whatever the chunk size (one row per chunk, several rows, the whole batch), the twin's plan
    covers every sequence once, keeps empty ones at zero and matches the float64 reference."""
    hq, hkv, d, b = 9, 3, 64, 16
    lens = [5, 0, 70, 16, 33, 1, 70, 48]
    pool = make_pool(lens, b, hkv, d, share_prefix_blocks=1, seed=6)
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(7))
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    plan = plan_for(pool.block_tables, seq_lens, pool.k, chunk_bytes=chunk_bytes)
    rows = sorted(r for c in plan.chunks for r in range(c.start, c.end))
    assert rows == list(range(sum(n > 0 for n in lens)))
    if chunk_bytes == 1:
        assert len(plan.chunks) == 7
    out = paged_decode(q, pool.k, pool.v, pool.block_tables, seq_lens, 0.125, backend="torch", plan=plan)
    ref = ref_decode(q, pool.k, pool.v, pool.tables, lens, 0.125)
    torch.testing.assert_close(out.double(), ref, **tol(torch.float32))


def test_one_plan_serves_every_layer() -> None:
    """A plan depends only on the tables and lengths: reused on another layer's pool it gives what a
    fresh plan gives, and a plan for another batch shape is refused."""
    hq, hkv, d, b = 4, 2, 64, 8
    lens = [30, 9, 17]
    pool = make_pool(lens, b, hkv, d, seed=1)
    tables, seq_lens = pool.block_tables, torch.tensor(lens, dtype=torch.int32)
    k1, v1 = torch.randn_like(pool.k), torch.randn_like(pool.v)  # another layer: same tables
    q = torch.randn(len(lens), hq, d)
    plan = plan_for(tables, seq_lens, pool.k, chunk_bytes=1)
    for k, v in ((pool.k, pool.v), (k1, v1)):
        fresh = paged_decode(q, k, v, tables, seq_lens, 0.2, backend="torch")
        reused = paged_decode(q, k, v, tables, seq_lens, 0.2, backend="torch", plan=plan)
        torch.testing.assert_close(reused, fresh, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="plan was made for 3 sequences"):
        paged_decode(q[:2], k1, v1, tables[:2], seq_lens[:2], 0.2, backend="torch", plan=plan)


def test_all_empty_sequences_give_zeros(backend: str) -> None:
    pool = make_pool([0, 0], 16, 2, 64)
    q = torch.randn(2, 4, 64)
    out = paged_decode(
        q, pool.k, pool.v, pool.block_tables, torch.zeros(2, dtype=torch.int32), 0.1, backend=backend
    )
    assert torch.equal(out, torch.zeros_like(out))


def test_bf16_torch_twin() -> None:
    """bf16 on CPU runs the torch twin (bf16 is unreliable under the interpreter: the GPU check has it)."""
    out, ref = _run("torch", (9, 3, 64, 16), torch.bfloat16, [33, 5, 0])
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"q": torch.zeros(2, 5, 64)}, "multiple of num_kv_heads"),
        ({"q": torch.zeros(2, 4, 32)}, "head_dim"),
        ({"seq_lens": torch.zeros(3, dtype=torch.int32)}, "seq_lens"),
        ({"block_tables": torch.zeros(2, 3)}, "block_tables"),
        ({"split_tokens": 0}, "split_tokens"),
        ({"split_tokens": 96}, "split_tokens"),
        ({"seq_lens": torch.tensor([13, 3], dtype=torch.int32)}, "must cover every position"),
        ({"backend": "cuda"}, "unknown kernel backend"),
    ],
)
def test_decode_rejects_bad_inputs(change: dict[str, object], message: str) -> None:
    pool = make_pool([5, 3], 4, 2, 64)
    args: dict[str, object] = {
        "q": torch.zeros(2, 4, 64),
        "k_cache": pool.k,
        "v_cache": pool.v,
        "block_tables": pool.block_tables,
        "seq_lens": torch.tensor([5, 3], dtype=torch.int32),
        "scale": 0.1,
        "backend": "torch",
    }
    args.update(change)
    with pytest.raises(ValueError, match=message):
        paged_decode(**args)  # type: ignore[arg-type]
