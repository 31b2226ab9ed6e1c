"""The quality contract of every non-fp32 precision on the embedded model: a fixed ~2k-token text of
prose and code (tests/daemon/data/quality_text.md), teacher-forced, against the fp32 reference mode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixd.daemon.executor.runner import ModelRunner
from radixd.daemon.loaders import LoadedModel, load_model
from radixd.daemon.model.precision import PRECISIONS
from radixd.daemon.quality import (
    MAX_MEAN_KL,
    MAX_PPL_CHANGE,
    MIN_TOP1_AGREEMENT,
    reference_log_probs,
    teacher_forced_quality,
)

TEXT = Path(__file__).parent / "data" / "quality_text.md"
NON_FP32 = [name for name in PRECISIONS if name != "float32"]
BLOCK = 16


@pytest.fixture(scope="module")
def text_ids(smollm: LoadedModel) -> list[int]:
    ids = smollm.tokenizer.encode(TEXT.read_text())
    assert 2000 <= len(ids) <= 2300, len(ids)
    return ids


def pool_for(lm: LoadedModel, n_tokens: int) -> ModelRunner:
    return ModelRunner(lm.model, num_blocks=n_tokens // BLOCK + 2, block_size=BLOCK)


@pytest.fixture(scope="module")
def fp32_log_probs(smollm: LoadedModel, text_ids: list[int]) -> torch.Tensor:
    """The fp32 reference over the text, computed once for every mode's test (~10 s each here)."""
    return reference_log_probs(pool_for(smollm, len(text_ids)), text_ids)


@pytest.mark.parametrize("mode", NON_FP32)
def test_mode_meets_quality_contract(
    smollm: LoadedModel, text_ids: list[int], fp32_log_probs: torch.Tensor, mode: str
) -> None:
    assert smollm.model.precision.name == "float32"
    lm = load_model(dtype=mode)
    assert lm.model.precision.name == mode
    report = teacher_forced_quality(fp32_log_probs, pool_for(lm, len(text_ids)), text_ids)
    assert report.tokens == len(text_ids) - 1
    assert report.mean_kl <= MAX_MEAN_KL, report
    assert report.top1_agreement >= MIN_TOP1_AGREEMENT, report
    assert abs(report.ppl_change) <= MAX_PPL_CHANGE, report
    assert report.meets_contract()


def test_fp32_against_itself_is_exact(smollm: LoadedModel, text_ids: list[int]) -> None:
    """The measure itself: the reference against a second fp32 pool gives KL 0 and full agreement,
    whether the reference is a runner or its precomputed log-probs."""
    ids = text_ids[:160]
    runner_ref = teacher_forced_quality(pool_for(smollm, 160), pool_for(smollm, 160), ids, chunk=64)
    tensor_ref = teacher_forced_quality(
        reference_log_probs(pool_for(smollm, 160), ids, 64), pool_for(smollm, 160), ids, 64
    )
    for report in (runner_ref, tensor_ref):
        assert report.mean_kl == pytest.approx(0.0, abs=1e-9)
        assert report.top1_agreement == 1.0
        assert report.ppl == report.ppl_ref
    with pytest.raises(ValueError, match="do not fit"):
        teacher_forced_quality(pool_for(smollm, 160), pool_for(smollm, 50), ids)  # before any forward
    with pytest.raises(ValueError, match="positions"):
        teacher_forced_quality(
            reference_log_probs(pool_for(smollm, 160), ids[:100]), pool_for(smollm, 160), ids
        )
