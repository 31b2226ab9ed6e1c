"""Greedy token ids equal transformers' generate on the same GGUF: alone, batched (with mixed
prefill/decode steps and chunked prefill), and when a prompt's prefix is already in the KV pool."""

from __future__ import annotations

import pytest
from daemon_testkit import BlockAlloc, Req, run

from radixd.daemon.executor.runner import ModelRunner, StepSeq
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow

N_NEW = 32


def _runner(lm: LoadedModel, block_size: int = 16, num_blocks: int = 160) -> tuple[ModelRunner, BlockAlloc]:
    return ModelRunner(lm.model, num_blocks=num_blocks, block_size=block_size), BlockAlloc(num_blocks)


def test_each_prompt_alone(
    smollm: LoadedModel, prompt_ids: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    runner, alloc = _runner(smollm)
    for prompt, want in zip(prompt_ids, hf_greedy, strict=True):
        (got,) = run(runner, alloc, [Req(prompt, N_NEW)])
        assert got == want, f"prompt {prompt[:8]}..."


def test_all_in_one_batch(
    smollm: LoadedModel, prompt_ids: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    runner, alloc = _runner(smollm)
    got = run(runner, alloc, [Req(p, N_NEW) for p in prompt_ids])
    assert got == hf_greedy


def test_staggered_chunked_batch(
    smollm: LoadedModel, prompt_ids: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    """Requests join at different steps and prefill in chunks, so steps mix prefill chunks and decodes."""
    runner, alloc = _runner(smollm, block_size=8)
    reqs = [Req(p, N_NEW, admit_step=i * 3, chunk=5 if i % 2 else None) for i, p in enumerate(prompt_ids)]
    assert run(runner, alloc, reqs) == hf_greedy


def test_prefix_already_in_pool(
    smollm: LoadedModel, prompt_ids: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    """A sibling prompt sharing each prompt's first tokens is computed first; the prompt then reuses its
    full blocks (start_pos = shared full blocks x block size) and computes only the rest."""
    bs = 4
    runner, alloc = _runner(smollm, block_size=bs, num_blocks=400)
    reqs = []
    for i, p in enumerate(prompt_ids):
        keep = max(len(p) * 2 // 3, bs + 1)
        sibling = [*p[:keep], 28, 29, 30, 31, 32]
        blocks = alloc.alloc(-(-len(sibling) // bs))
        runner.step([StepSeq(100 + i, sibling, 0, blocks, None)])
        shared = keep // bs
        assert shared >= 1
        reqs.append(Req(p, N_NEW, start_pos=shared * bs, blocks=blocks[:shared]))
    # All prompts resume from their cached prefixes in one batch.
    assert run(runner, alloc, reqs) == hf_greedy
