"""Sliding-window attention (``window`` = W > 0: a query at position p sees keys p - W + 1..p, HF's
``sliding_window``) in every backend: the split design (torch twin), the compiled CPU kernel and the
Triton kernels (under the interpreter, with 64-key splits so that short sequences cross several).

Each answer is checked against a dense float64 softmax over HF's masked scores (``kv > q - W`` and
``kv <= q``); a window at least as long as the sequence is bitwise the full attention; prefill rows
equal the decode of their position bit for bit, alone or in a batch; and the keys a kernel skips are
never read (they hold NaN).
"""

from __future__ import annotations

import importlib
import random
from typing import Any

import pytest
import torch
from kernels_ref import Pool, make_pool, tol

from radixd.kernels import cpu_attention, paged_decode, paged_prefill
from radixd.kernels.paged_decode import DECODE_CONFIG, decode_step_plan

paged_decode_mod = importlib.import_module("radixd.kernels.paged_decode")
paged_prefill_mod = importlib.import_module("radixd.kernels.paged_prefill")

HQ, HKV, D = 4, 2, 16
SCALE = D**-0.5
TRITON_SPLIT = 64  # the Triton kernels' keys per split in these tests (a multiple of block_n)
C_SPLIT = 256  # cpu_attention.c's SPLIT
IMPLS = ("split", "compiled", "triton")
# Ragged lengths: empty, shorter than every window, on and across block and split edges, and one
# crossing the compiled kernel's 256-key splits.
LENS = [0, 1, 2, 5, 16, 17, 70, 150, 300]
LONGER = 400  # a window longer than every sequence here
# (window, block size): blocks of 4 divide 16, of 4 and 7 neither 3 nor 16; a window of one key.
WINDOW_BLOCKS = [(1, 4), (3, 4), (16, 4), (16, 7), (LONGER, 7)]


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The `backend` argument that runs one implementation (the environment set for it)."""
    return _use(str(request.param), monkeypatch)


def _use(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("RADIXD_KERNEL_BACKEND", raising=False)
    if name == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setattr(paged_decode_mod, "SPLIT_TOKENS", TRITON_SPLIT)
        monkeypatch.setattr(paged_prefill_mod, "SPLIT_TOKENS", TRITON_SPLIT)
        return "triton"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv(cpu_attention.ENV_DESIGN, name)
    return "torch"


def dense_ref(q: torch.Tensor, pool: Pool, seq: list[int], pos: list[int], window: int) -> torch.Tensor:
    """float64 attention of rows q [R, Hq, D], row r at position pos[r] of sequence seq[r]: scores over
    every key 0..pos, masked as HF masks them, then one softmax."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    b, group = pool.block_size, HQ // HKV
    for r, (s, p) in enumerate(zip(seq, pos, strict=True)):
        if p < 0:
            continue
        kv = torch.arange(p + 1)
        blocks = torch.tensor(pool.tables[s])[kv // b]
        k = pool.k[blocks, kv % b].double().repeat_interleave(group, dim=1)  # [p + 1, Hq, D]
        v = pool.v[blocks, kv % b].double().repeat_interleave(group, dim=1)
        seen = kv <= p
        if window > 0:
            seen &= kv > p - window
        scores = torch.einsum("thd,hd->ht", k, q[r].double()) * SCALE
        w = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=1)
        out[r] = torch.einsum("ht,thd->hd", w, v)
    return out


def _decode(
    backend: str, q: torch.Tensor, pool: Pool, rows: list[int], lens: list[int], window: int
) -> torch.Tensor:
    tables = pool.block_tables[rows]
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    plan = decode_step_plan(tables, seq_lens, pool.k, backend=backend)  # one plan serves every window
    return paged_decode(q, pool.k, pool.v, tables, seq_lens, SCALE, backend=backend, plan=plan, window=window)


def _prefill(
    backend: str,
    q: torch.Tensor,
    pool: Pool,
    rows: list[int],
    q_lens: list[int],
    lens: list[int],
    window: int,
) -> torch.Tensor:
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return paged_prefill(
        q, pool.k, pool.v, pool.block_tables[rows], cu, seq_lens, SCALE, backend=backend, window=window
    )


@pytest.mark.parametrize(("window", "b"), WINDOW_BLOCKS)
def test_decode_matches_dense_reference(impl: str, window: int, b: int) -> None:
    """Decode rows of ragged lengths; a window longer than every sequence is the full attention, bit
    for bit."""
    pool = make_pool(LENS, b, HKV, D, seed=b)
    q = torch.randn(len(LENS), HQ, D, generator=torch.Generator().manual_seed(window))
    rows = list(range(len(LENS)))
    got = _decode(impl, q, pool, rows, LENS, window)
    want = dense_ref(q, pool, rows, [n - 1 for n in LENS], window)
    torch.testing.assert_close(got.double(), want, **tol(torch.float32))
    assert torch.equal(got[0], torch.zeros_like(got[0]))  # a length-0 sequence gives zeros
    if window >= max(LENS):
        assert torch.equal(got, _decode(impl, q, pool, rows, LENS, 0))


@pytest.mark.parametrize(("window", "b"), WINDOW_BLOCKS)
def test_prefill_matches_dense_reference(impl: str, window: int, b: int) -> None:
    """Prefill chunks over a cached prefix (starting mid-sequence, mid-block, mid-split), a whole
    prompt, and a sequence with no new tokens, against the dense reference."""
    lens = [5, 40, 150, 300, 9]
    q_lens = [5, 1, 70, 33, 0]  # new tokens at the end of each sequence
    pool = make_pool(lens, b, HKV, D, seed=10 + b)
    q = torch.randn(sum(q_lens), HQ, D, generator=torch.Generator().manual_seed(window))
    got = _prefill(impl, q, pool, list(range(len(lens))), q_lens, lens, window)
    seq = [s for s, n in enumerate(q_lens) for _ in range(n)]
    pos = [lens[s] - q_lens[s] + i for s, n in enumerate(q_lens) for i in range(n)]
    want = dense_ref(q, pool, seq, pos, window)
    torch.testing.assert_close(got.double(), want, **tol(torch.float32))
    if window >= max(lens):
        assert torch.equal(got, _prefill(impl, q, pool, list(range(len(lens))), q_lens, lens, 0))


def test_backends_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The three implementations give one answer (to rounding) for one windowed decode and prefill."""
    lens, q_lens, window = [150, 600, 33], [40, 9, 33], 20
    pool = make_pool(lens, 8, HKV, D, seed=21)
    g = torch.Generator().manual_seed(22)
    qd = torch.randn(len(lens), HQ, D, generator=g)
    qp = torch.randn(sum(q_lens), HQ, D, generator=g)
    rows = list(range(len(lens)))
    outs = {}
    for name in IMPLS:
        with monkeypatch.context() as m:
            backend = _use(name, m)
            outs[name] = (
                _decode(backend, qd, pool, rows, lens, window),
                _prefill(backend, qp, pool, rows, q_lens, lens, window),
            )
    for name in IMPLS[1:]:
        for got, want in zip(outs[name], outs[IMPLS[0]], strict=True):
            torch.testing.assert_close(got, want, **tol(torch.float32))


@pytest.mark.parametrize("window", [3, 100])
def test_prefill_rows_equal_decode_rows(impl: str, window: int) -> None:
    """Prompts prefilled in chunks (beside another prompt) equal, bit for bit, the decode of each
    position in a batch with a row of the other sequence."""
    rng = random.Random(window)
    lens = [300, 90]
    pool = make_pool(lens, 8, HKV, D, seed=3)
    g = torch.Generator().manual_seed(4)
    qs = [torch.randn(n, HQ, D, generator=g) for n in lens]
    chunks = [[70, 1, 130, 99], [3, 87]]
    outs = [torch.empty(n, HQ, D) for n in lens]
    done = [0, 0]
    for step in range(4):
        members = [i for i in range(2) if step < len(chunks[i])]
        q_lens = [chunks[i][step] for i in members]
        ends = [done[i] + n for i, n in zip(members, q_lens, strict=True)]
        q = torch.cat([qs[i][done[i] : e] for i, e in zip(members, ends, strict=True)])
        out = _prefill(impl, q, pool, members, q_lens, ends, window)
        a = 0
        for i, n, e in zip(members, q_lens, ends, strict=True):
            outs[i][done[i] : e] = out[a : a + n]
            done[i], a = e, a + n
    for i, n in enumerate(lens):
        edges = {0, window - 1, window, 64, 71, C_SPLIT - 1, C_SPLIT + 1, n - 1, *rng.sample(range(n), 2)}
        for p in sorted(edges & set(range(n))):
            other = 1 - i
            po = rng.randrange(lens[other])
            q = torch.stack([qs[other][po], qs[i][p]])
            got = _decode(impl, q, pool, [other, i], [po + 1, p + 1], window)
            assert torch.equal(got[1], outs[i][p]), f"seq {i} position {p}"


def test_compiled_row_independent_of_batch_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled kernel, windowed: a row alone on one thread equals the same row in batches of
    prefill and decode rows of mixed lengths (any slot), spread over several threads, bit for bit."""
    _use("compiled", monkeypatch)
    rng = random.Random(7)
    window = 2 * C_SPLIT - 50  # a window over three of the kernel's splits
    lens = [rng.randint(1, 4 * C_SPLIT) for _ in range(48)]
    lens[0] = 3 * C_SPLIT + 5
    pool = make_pool(lens, 16, HKV, D, seed=8)
    q_all = torch.randn(48, HQ, D, generator=torch.Generator().manual_seed(9))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = _decode("torch", q_all[:1], pool, [0], lens[:1], window)
        torch.set_num_threads(max(2, threads))
        for size in (2, 7, 48):
            idx = [0, *rng.sample(range(1, 48), size - 1)]
            rng.shuffle(idx)
            got = _decode("torch", q_all[idx], pool, idx, [lens[i] for i in idx], window)
            assert torch.equal(got[idx.index(0)], alone[0]), f"batch of {size}"
            # The same row as the last token of a prefill chunk beside the batch's others' last tokens.
            q_lens = [1 + (i % 5 if i != 0 else 0) for i in idx]
            q_lens = [min(n, lens[i]) for n, i in zip(q_lens, idx, strict=True)]
            parts = [q_all[i : i + 1].expand(n, HQ, D) for n, i in zip(q_lens, idx, strict=True)]
            got = _prefill("torch", torch.cat(parts), pool, idx, q_lens, [lens[i] for i in idx], window)
            at = sum(q_lens[: idx.index(0)])
            assert torch.equal(got[at], alone[0]), f"prefill batch of {size}"
    finally:
        torch.set_num_threads(threads)


def _poisoned(pool: Pool, seq: int, below: int) -> Pool:
    """``pool`` with NaN keys and values at positions < ``below`` of sequence ``seq`` (its own blocks)."""
    k, v = pool.k.clone(), pool.v.clone()
    for t in range(below):
        blk = pool.tables[seq][t // pool.block_size]
        k[blk, t % pool.block_size] = float("nan")
        v[blk, t % pool.block_size] = float("nan")
    return Pool(k, v, pool.tables, pool.block_tables)


@pytest.mark.parametrize("name", ["compiled", "triton"])
def test_keys_left_of_the_window_are_not_read(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled kernel reads no key before a row's window; the Triton kernels none before the key
    tile holding it (block_n keys) in decode, or holding its query tile's first row's first key in
    prefill: those positions hold NaN, which any read would spread into the answer."""
    backend = _use(name, monkeypatch)
    lens, window = [700, 20], 40
    pool = make_pool(lens, 8, HKV, D, seed=11)
    g = torch.Generator().manual_seed(12)
    qd = torch.randn(2, HQ, D, generator=g)
    first = lens[0] - window  # decode row's first key
    block_n = DECODE_CONFIG["block_n"]
    below = first if name == "compiled" else first // block_n * block_n
    got = _decode(backend, qd, _poisoned(pool, 0, below), [0, 1], lens, window)
    want = dense_ref(qd, pool, [0, 1], [n - 1 for n in lens], window)
    torch.testing.assert_close(got.double(), want, **tol(torch.float32))
    q_lens = [70, 20]
    qp = torch.randn(sum(q_lens), HQ, D, generator=g)
    first = lens[0] - q_lens[0] - window + 1  # the chunk's first row's first key
    below = first if name == "compiled" else first // block_n * block_n
    got = _prefill(backend, qp, _poisoned(pool, 0, below), [0, 1], q_lens, lens, window)
    seq = [s for s, n in enumerate(q_lens) for _ in range(n)]
    pos = [lens[s] - q_lens[s] + i for s, n in enumerate(q_lens) for i in range(n)]
    torch.testing.assert_close(got.double(), dense_ref(qp, pool, seq, pos, window), **tol(torch.float32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_compiled_16bit_pools(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled kernel's 16-bit pools and queries, windowed, against the dense reference."""
    backend = _use("compiled", monkeypatch)
    lens, window = [600, 17, 300], 270
    pool = make_pool(lens, 16, HKV, D, dtype, seed=13)
    q = torch.randn(3, HQ, D, generator=torch.Generator().manual_seed(14)).to(dtype)
    got = _decode(backend, q, pool, [0, 1, 2], lens, window)
    want = dense_ref(q, pool, [0, 1, 2], [n - 1 for n in lens], window)
    torch.testing.assert_close(got.double(), want, **tol(dtype))


@pytest.mark.parametrize("window", [-1, 2.5, True])
def test_bad_window_refused(window: Any) -> None:
    pool = make_pool([4], 4, HKV, D)
    q = torch.zeros(1, HQ, D)
    seq_lens = torch.tensor([4], dtype=torch.int32)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    k, v, bt = pool.k, pool.v, pool.block_tables
    with pytest.raises(ValueError, match="window"):
        paged_decode(q, k, v, bt, seq_lens, SCALE, backend="torch", window=window)
    with pytest.raises(ValueError, match="window"):
        paged_prefill(q, k, v, bt, cu, seq_lens, SCALE, backend="torch", window=window)
