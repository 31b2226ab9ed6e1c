"""The compiled CPU attention (kernels/cpu_attention.c): right answers, and batch invariance bit for bit.

Its rows cross the kernel's 256-key splits (the split design's tests in test_batch_invariance.py stay
below them), its thread split is forced both ways, and the paged_prefill / paged_decode twins are
checked to run it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch
from kernels_ref import make_pool, ref_decode, ref_prefill, tol

from radixd.kernels import cpu_attention, paged_decode, paged_prefill
from radixd.kernels.paged_decode import decode_step_plan

SPLIT = 256  # keys per split in cpu_attention.c
HQ, HKV, D = 9, 3, 64


@pytest.fixture(autouse=True)
def compiled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(cpu_attention.ENV_DESIGN, "compiled")
    monkeypatch.delenv("RADIXD_KERNEL_BACKEND", raising=False)
    yield


def _decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables: torch.Tensor, lens: list[int]
) -> torch.Tensor:
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    plan = decode_step_plan(tables, seq_lens, k, backend="torch")
    assert isinstance(plan, cpu_attention.RowsPlan)
    return paged_decode(q, k, v, tables, seq_lens, D**-0.5, backend="torch", plan=plan)


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tables: torch.Tensor,
    q_lens: list[int],
    lens: list[int],
) -> torch.Tensor:
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return paged_prefill(q, k, v, tables, cu, seq_lens, D**-0.5, backend="torch")


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
@pytest.mark.parametrize(("hq", "hkv", "d", "b"), [(9, 3, 64, 16), (8, 2, 16, 7), (4, 4, 128, 8)])
def test_matches_float64_reference(dtype: torch.dtype, hq: int, hkv: int, d: int, b: int) -> None:
    """Decode and prefill agree with an independent float64 softmax, across split edges and empty rows."""
    lens = [1, SPLIT - 1, SPLIT, SPLIT + 1, 2 * SPLIT + 37, 0]
    pool = make_pool(lens, b, hkv, d, dtype, seed=hq + d)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(len(lens), hq, d, generator=g).to(dtype)
    scale = d**-0.5
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    got = paged_decode(q, pool.k, pool.v, pool.block_tables, seq_lens, scale, backend="torch")
    want = ref_decode(q, pool.k, pool.v, pool.tables, lens, scale)
    torch.testing.assert_close(got.double(), want, **tol(dtype))
    assert torch.equal(got[-1], torch.zeros_like(got[-1]))  # a length-0 sequence gives zeros
    q_lens = [1, 9, 2, 3, 20, 0]  # rows on both sides of split edges; the reference is slow
    qp = torch.randn(sum(q_lens), hq, d, generator=g).to(dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    got_p = paged_prefill(qp, pool.k, pool.v, pool.block_tables, cu, seq_lens, scale, backend="torch")
    want_p = ref_prefill(qp, pool.k, pool.v, pool.tables, q_lens, lens, scale)
    torch.testing.assert_close(got_p.double(), want_p, **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prefill_rows_equal_decode_rows_across_splits(dtype: torch.dtype) -> None:
    """Every position of prompts chunked at random (chunks crossing the 256-key split edges, other
    prompts in the step) equals, bit for bit, its decode in a random batch of other positions."""
    rng = random.Random(5)
    lens = [3 * SPLIT + 11, SPLIT + 1, 90]
    pool = make_pool(lens, 16, HKV, D, dtype, seed=2)
    g = torch.Generator().manual_seed(3)
    qs = [torch.randn(n, HQ, D, generator=g).to(dtype) for n in lens]
    prefill_out = [torch.empty(n, HQ, D, dtype=dtype) for n in lens]
    done = [0, 0, 0]
    while any(done[i] < lens[i] for i in range(3)):
        members = [i for i in range(3) if done[i] < lens[i]]
        q_lens = [min(lens[i] - done[i], rng.choice([1, 5, SPLIT - 3, SPLIT + 9])) for i in members]
        ends = [done[i] + n for i, n in zip(members, q_lens, strict=True)]
        q = torch.cat([qs[i][done[i] : e] for i, e in zip(members, ends, strict=True)])
        out = _prefill(q, pool.k, pool.v, pool.block_tables[members], q_lens, ends)
        a = 0
        for i, n, e in zip(members, q_lens, ends, strict=True):
            prefill_out[i][done[i] : e] = out[a : a + n]
            done[i], a = e, a + n
    edges = [0, SPLIT - 1, SPLIT, SPLIT + 1, 2 * SPLIT, 3 * SPLIT + 10]
    for i, n in enumerate(lens):
        for p in sorted({*(x for x in edges if x < n), *rng.sample(range(n), 6), n - 1}):
            others = [(j, rng.randrange(lens[j])) for j in rng.choices(range(3), k=rng.randint(0, 12))]
            batch = [*others[:2], (i, p), *others[2:]]
            slot = min(2, len(others))
            q = torch.stack([qs[j][pj] for j, pj in batch])
            out = _decode(
                q, pool.k, pool.v, pool.block_tables[[j for j, _ in batch]], [pj + 1 for _, pj in batch]
            )
            assert torch.equal(out[slot], prefill_out[i][p]), f"seq {i} position {p}: prefill != decode"


def test_decode_row_independent_of_batch_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row alone, single-threaded, equals the same row in batches of 1..64 (any slot, mixed lengths
    up to 4 splits), whether the kernel runs them on one thread or spreads them over several."""
    rng = random.Random(9)
    lens = [rng.randint(1, 4 * SPLIT) for _ in range(64)]
    lens[0] = 2 * SPLIT + 5
    pool = make_pool(lens, 16, HKV, D, torch.float32, seed=4)
    q_all = torch.randn(64, HQ, D, generator=torch.Generator().manual_seed(8))
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:
        monkeypatch.setattr(cpu_attention, "_PARALLEL_MIN_WORK", 1 << 62)  # one thread
        alone = _decode(q_all[:1], pool.k, pool.v, pool.block_tables[:1], lens[:1])
        whole = _decode(q_all, pool.k, pool.v, pool.block_tables, lens)
        monkeypatch.setattr(cpu_attention, "_PARALLEL_MIN_WORK", 0)  # every call threaded
        for size in [1, 2, 3, 8, 13, 64]:
            idx = [0, *rng.sample(range(1, 64), size - 1)]
            rng.shuffle(idx)
            out = _decode(q_all[idx], pool.k, pool.v, pool.block_tables[idx], [lens[i] for i in idx])
            assert torch.equal(out[idx.index(0)], alone[0]), f"batch {size}"
            for slot, i in enumerate(idx):
                assert torch.equal(out[slot], whole[i]), f"batch {size}, row {i}"
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("pool_dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("threads", [3, 8])  # uneven runs; more threads than units
def test_every_unit_runs_once_at_any_thread_count(
    monkeypatch: pytest.MonkeyPatch, threads: int, pool_dtype: torch.dtype
) -> None:
    """The threads share a call's (row, split) units by their keys in contiguous runs: with more threads
    than units, with uneven rows, in a prefill chunk and a decode batch, every unit is computed once and
    the answer is the one-thread answer bit for bit. The f16 pool with float32 queries is the default
    mode's (w4a8)."""
    lens = [3 * SPLIT + 40, 1, SPLIT + 1, 0, 90]
    q_lens = [SPLIT + 7, 1, 30, 0, 2]
    pool = make_pool(lens, 16, HKV, D, pool_dtype, seed=11)
    g = torch.Generator().manual_seed(12)
    qp = torch.randn(sum(q_lens), HQ, D, generator=g)
    qd = torch.randn(len(lens), HQ, D, generator=g)
    monkeypatch.setattr(cpu_attention, "_PARALLEL_MIN_WORK", 0)  # every call threaded
    before = torch.get_num_threads()
    outs = []
    try:
        for n in (1, threads):
            torch.set_num_threads(n)
            outs.append(
                (
                    _prefill(qp, pool.k, pool.v, pool.block_tables, q_lens, lens),
                    _decode(qd, pool.k, pool.v, pool.block_tables, lens),
                )
            )
    finally:
        torch.set_num_threads(before)
    (one_p, one_d), (many_p, many_d) = outs
    assert torch.equal(one_p, many_p) and torch.equal(one_d, many_d)
    want = ref_prefill(qp, pool.k, pool.v, pool.tables, q_lens, lens, D**-0.5)
    torch.testing.assert_close(many_p.double(), want, **tol(pool_dtype))
    want_d = ref_decode(qd, pool.k, pool.v, pool.tables, lens, D**-0.5)
    torch.testing.assert_close(many_d.double(), want_d, **tol(pool_dtype))


@pytest.mark.parametrize("pool_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bfloat16_queries_go_in_and_out_as_they_are(pool_dtype: torch.dtype) -> None:
    """A bfloat16 query is read and its output rounded (to nearest even) inside the kernel: the very
    bits of widening it to float32, attending, and rounding with torch; other dtypes still go
    through float32."""
    lens = [SPLIT + 40, 3, 0]
    pool = make_pool(lens, 16, HKV, D, pool_dtype, seed=13)
    plan = cpu_attention.plan_rows(
        pool.block_tables, torch.arange(3), torch.tensor(lens) - 1, 16, pool.k.shape[0]
    )
    q = torch.randn(3, HQ, D, generator=torch.Generator().manual_seed(14)) * 4
    for dtype in (torch.bfloat16, torch.float16):
        got = cpu_attention.attend_rows(q.to(dtype), pool.k, pool.v, plan, 0.125)
        want = cpu_attention.attend_rows(q.to(dtype).float(), pool.k, pool.v, plan, 0.125).to(dtype)
        assert got.dtype == dtype and torch.equal(got, want)


def test_designs_agree_and_the_switch_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The split design (RADIXD_CPU_ATTENTION=split) answers the same to rounding; an unknown name is
    refused with the names to use."""
    lens = [300, 17]
    pool = make_pool(lens, 16, HKV, D, seed=6)
    q = torch.randn(2, HQ, D, generator=torch.Generator().manual_seed(2))
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    assert cpu_attention.design() == "compiled"
    compiled_out = paged_decode(q, pool.k, pool.v, pool.block_tables, seq_lens, 0.125, backend="torch")
    monkeypatch.setenv(cpu_attention.ENV_DESIGN, "split")
    assert cpu_attention.design() == "split"
    assert not isinstance(
        decode_step_plan(pool.block_tables, seq_lens, pool.k, "torch"), cpu_attention.RowsPlan
    )
    split_out = paged_decode(q, pool.k, pool.v, pool.block_tables, seq_lens, 0.125, backend="torch")
    torch.testing.assert_close(compiled_out, split_out, atol=2e-6, rtol=2e-5)
    monkeypatch.setenv(cpu_attention.ENV_DESIGN, "fastest")
    with pytest.raises(ValueError, match="compiled"):
        cpu_attention.design()


def test_out_of_range_indices_are_refused_before_the_kernel_reads() -> None:
    """The C loop follows block ids unchecked, so a bad table or row is a ValueError, not a wild read."""
    pool = make_pool([40], 16, HKV, D, seed=1)
    q = torch.randn(1, HQ, D)
    bad = pool.block_tables.clone()
    bad[0, 1] = pool.k.shape[0]  # one past the pool
    with pytest.raises(ValueError, match="block ids"):
        paged_decode(q, pool.k, pool.v, bad, torch.tensor([40], dtype=torch.int32), 0.1, backend="torch")
    plan = cpu_attention.plan_rows(
        pool.block_tables, torch.tensor([0]), torch.tensor([39]), 16, pool.k.shape[0]
    )
    with pytest.raises(ValueError, match="planned for 1 rows"):
        cpu_attention.attend_rows(q, pool.k[:-1], pool.v[:-1], plan, 0.1)
    with pytest.raises(ValueError, match="row_table"):
        cpu_attention.plan_rows(pool.block_tables, torch.tensor([1]), torch.tensor([3]), 16, pool.k.shape[0])
