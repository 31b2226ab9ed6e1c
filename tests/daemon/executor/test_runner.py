"""ModelRunner mechanics on a tiny random model: validation, CoW copies, mixed steps, pool sizing."""

from __future__ import annotations

import sys
from array import array

import pytest
import torch
from daemon_testkit import tiny_model

from radixd.daemon.executor.runner import (
    DecodeRows,
    ModelRunner,
    StepSeq,
    kv_bytes_per_block,
    num_blocks_for_budget,
)
from radixd.daemon.executor.sampling import SamplingParams, SamplingState
from radixd.daemon.process.host import HUGE_PAGE

BS = 4


@pytest.fixture
def runner() -> ModelRunner:
    return ModelRunner(tiny_model(), num_blocks=32, block_size=BS)


def greedy() -> SamplingState:
    return SamplingState(SamplingParams(temperature=0.0))


@pytest.mark.parametrize(
    ("seq", "message"),
    [
        (StepSeq(0, [], 0, [1], None), "empty"),
        (StepSeq(0, [1, 2], -1, [1], None), "start_pos"),
        (StepSeq(0, [1] * 9, 0, [1, 2], None), "blocks cannot hold"),
        (StepSeq(0, [1, 2], 0, [0], None), "outside"),
        (StepSeq(0, [1, 2], 0, [32], None), "outside"),
        (StepSeq(0, [1, 999], 0, [1], None), "token ids"),
        (StepSeq(0, [1, -1], 0, [1], None), "token ids"),
        (StepSeq(0, [1, 2**70], 0, [1], None), "token ids"),
        (StepSeq(0, [1, 2.0], 0, [1], None), "token ids"),  # type: ignore[list-item]
    ],
)
def test_invalid_step_raises(runner: ModelRunner, seq: StepSeq, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        runner.step([seq])


def test_a_bad_id_in_a_batch_names_its_sequence(runner: ModelRunner) -> None:
    good = [StepSeq(i, [5], 3, [1], None) for i in range(3)]
    with pytest.raises(ValueError, match="sequence 7: token id 999 at position 0"):
        runner.step([*good, StepSeq(7, [999], 3, [2], None)])


def test_invalid_copy_ops_raise(runner: ModelRunner) -> None:
    with pytest.raises(ValueError, match="outside"):
        runner.copy_blocks([(1, 40, 2)])
    with pytest.raises(ValueError, match="n_tokens"):
        runner.copy_blocks([(1, 2, BS + 1)])


def test_copy_on_write_partial_block_continues_identically(runner: ModelRunner) -> None:
    ids = [5, 9, 2, 33, 17, 8, 40, 41, 3, 11]  # 10 tokens: blocks 1, 2 full, block 3 holds 2
    ref = runner.step_logits([StepSeq(0, [*ids, 7, 7], 0, [1, 2, 3], None)])
    runner.step_logits([StepSeq(0, ids, 0, [4, 5, 6], None)])
    # A second sequence shares the two full blocks and copies the partial third block (2 tokens).
    runner.copy_blocks([(6, 9, 2)])
    got = runner.step_logits([StepSeq(1, [7, 7], 10, [4, 5, 9], None)])
    torch.testing.assert_close(got, ref[-2:], atol=1e-5, rtol=0)


def test_mixed_step_prefill_chunk_decode_and_compute_only(runner: ModelRunner) -> None:
    a, b = [1, 2, 3, 4, 5, 6], [9, 8, 7]
    # Reference: each alone.
    ref_a = runner.step_logits([StepSeq(0, a, 0, [1, 2], None)])[-1]
    ref_b = runner.step_logits([StepSeq(1, b, 0, [3], None)])[-1]
    # Same work as one mixed step: a one-token chunk with no sampling, a prefill and a decode.
    runner.step([StepSeq(2, a[:5], 0, [4, 5], None), StepSeq(3, b[:2], 0, [6], None)])
    res = runner.step(
        [
            StepSeq(3, b[2:], 2, [6], greedy()),
            StepSeq(2, a[5:], 5, [4, 5], greedy()),
            StepSeq(4, [1, 2], 0, [7], None),
        ]
    )
    assert res[2] is None
    assert res[0] is not None and res[0].token_id == int(ref_b.argmax())
    assert res[1] is not None and res[1].token_id == int(ref_a.argmax())


def test_decode_rows_run_like_their_step_seqs(runner: ModelRunner) -> None:
    a, b = [1, 2, 3, 4, 5, 6], [9, 8, 7]
    runner.step([StepSeq(0, a[:5], 0, [1, 2], None), StepSeq(1, b[:2], 0, [3], None)])
    runner.step([StepSeq(2, a[:5], 0, [4, 5], None), StepSeq(3, b[:2], 0, [6], None)])
    # The engine's form (a chunk, then decode rows as columns) against the same work as StepSeqs.
    chunk = StepSeq(9, [4, 4], 0, [7], greedy())
    rows = DecodeRows([0, 1], [a[5], b[2]], [5, 2], [[1, 2], [3]], [greedy(), None])
    got = runner.run([chunk], rows)
    want = runner.step([StepSeq(2, a[5:], 5, [4, 5], greedy()), StepSeq(3, b[2:], 2, [6], None), chunk])
    # run() answers the chunk first, then the rows in order; step() in its arguments' order.
    order = [want[2], want[0], want[1]]
    assert [r.token_id if r else None for r in got] == [r.token_id if r else None for r in order]
    assert got[0] is not None and got[1] is not None and got[2] is None


def test_packed_decode_tables_answer_like_lists(runner: ModelRunner) -> None:
    """The engine's tables are packed arrays, laid into the step's padded block table in one join;
    rows of unequal table lengths answer as the same tables given as lists, and a bad block id in a
    packed table is still refused by its sequence."""
    a, b = [1, 2, 3, 4, 5, 6, 7, 8, 9], [9, 8, 7]
    runner.step([StepSeq(0, a[:8], 0, [1, 2, 3], None), StepSeq(1, b[:2], 0, [4], None)])
    tables = [[1, 2, 3], [4]]

    def rows(packed: bool) -> DecodeRows:
        ts = [array("i", t) if packed else list(t) for t in tables]
        return DecodeRows([0, 1], [a[8], b[2]], [8, 2], ts, [greedy(), greedy()])

    got, want = runner.run([], rows(True)), runner.run([], rows(False))
    assert [r.token_id for r in got if r] == [r.token_id for r in want if r] and len(got) == 2
    with pytest.raises(ValueError, match="sequence 8: block table"):
        runner.run([], DecodeRows([7, 8], [5, 5], [3, 3], [array("i", [1]), array("i", [40])], [None, None]))


def test_bad_decode_rows_are_refused_by_name(runner: ModelRunner) -> None:
    with pytest.raises(ValueError, match="one entry per row"):
        runner.run([], DecodeRows([0, 1], [5], [3, 3], [[1], [2]], [None, None]))
    with pytest.raises(ValueError, match="sequence 8: 1 blocks cannot hold 6 tokens"):
        runner.run([], DecodeRows([7, 8], [5, 5], [3, 5], [[1], [2]], [None, None]))
    with pytest.raises(ValueError, match="sequence 8: start_pos"):
        runner.run([], DecodeRows([7, 8], [5, 5], [3, -1], [[1], [2]], [None, None]))
    with pytest.raises(ValueError, match="sequence 8: token id 999"):
        runner.run([], DecodeRows([7, 8], [5, 999], [3, 3], [[1], [2]], [None, None]))


def test_pool_sizing() -> None:
    cfg = tiny_model().config
    per_block = kv_bytes_per_block(cfg, 16, torch.float32)
    assert per_block == 2 * cfg.num_layers * 16 * cfg.num_kv_heads * cfg.head_dim * 4
    assert num_blocks_for_budget(cfg, 16, per_block * 10 + 5, torch.float32) == 10
    with pytest.raises(ValueError, match="budget"):
        num_blocks_for_budget(cfg, 16, per_block, torch.float32)
    r = ModelRunner(tiny_model(), num_blocks=3, block_size=16)
    assert r.kv_bytes_per_block == per_block
    with pytest.raises(ValueError, match="num_blocks"):
        ModelRunner(tiny_model(), num_blocks=1, block_size=16)


def test_cpu_pools_are_allocated_on_huge_pages() -> None:
    """Each layer's pool starts on a huge-page boundary (daemon/process/host.py), zeroed."""
    model = tiny_model()
    per_block = kv_bytes_per_block(model.config, BS, model.kv_dtype) // (2 * model.config.num_layers)
    runner = ModelRunner(model, num_blocks=-(-2 * HUGE_PAGE // per_block), block_size=BS)
    pools = (*runner.k_caches, *runner.v_caches)
    assert all(t.nbytes >= HUGE_PAGE and not t.any() for t in pools)
    if sys.platform == "linux":
        assert all(t.data_ptr() % HUGE_PAGE == 0 for t in pools)
