"""The quality contract of the non-fp32 precisions: teacher-forced next-token distributions vs fp32.

Contract: mean KL(fp32 || mode) <= 0.02 nats/token, top-1 agreement >= 95%, perplexity within 2%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from radixd.daemon.executor.runner import ModelRunner, StepSeq

MAX_MEAN_KL = 0.02
MIN_TOP1_AGREEMENT = 0.95
MAX_PPL_CHANGE = 0.02


@dataclass(frozen=True)
class QualityReport:
    """A mode against the fp32 reference over `tokens` predicted positions."""

    tokens: int
    mean_kl: float
    top1_agreement: float
    ppl_ref: float
    ppl: float

    @property
    def ppl_change(self) -> float:
        """Relative perplexity change vs fp32 (+0.01 = 1% higher)."""
        return self.ppl / self.ppl_ref - 1.0

    def meets_contract(self) -> bool:
        return (
            self.mean_kl <= MAX_MEAN_KL
            and self.top1_agreement >= MIN_TOP1_AGREEMENT
            and abs(self.ppl_change) <= MAX_PPL_CHANGE
        )


def _check_fits(runner: ModelRunner, token_ids: list[int]) -> None:
    if -(-len(token_ids) // runner.block_size) >= runner.num_blocks:
        raise ValueError(f"{len(token_ids)} tokens do not fit a pool of {runner.num_blocks} blocks")


def _chunk_log_probs(runner: ModelRunner, token_ids: list[int], start: int, n: int) -> torch.Tensor:
    """Next-token log-probabilities [n, V] of positions start .. start + n - 1, one prefill step."""
    table = list(range(1, -(-(start + n) // runner.block_size) + 1))
    return runner.step_logits([StepSeq(0, token_ids[start : start + n], start, table, None)]).log_softmax(-1)


def reference_log_probs(ref: ModelRunner, token_ids: list[int], chunk: int = 512) -> torch.Tensor:
    """The reference's next-token log-probabilities [len - 1, V], computed once for every mode."""
    if len(token_ids) < 2:
        raise ValueError("need at least 2 tokens")
    _check_fits(ref, token_ids)
    n = len(token_ids) - 1
    return torch.cat([_chunk_log_probs(ref, token_ids, s, min(chunk, n - s)) for s in range(0, n, chunk)])


def teacher_forced_quality(
    ref: ModelRunner | torch.Tensor, runner: ModelRunner, token_ids: list[int], chunk: int = 512
) -> QualityReport:
    """Compare `runner`'s next-token distributions over `token_ids` (prefill chunks) with the reference's."""
    if len(token_ids) < 2:
        raise ValueError("need at least 2 tokens")
    n = len(token_ids) - 1
    if isinstance(ref, torch.Tensor) and tuple(ref.shape[:1]) != (n,):
        raise ValueError(f"reference log-probs cover {ref.shape[0]} positions, the ids {n}")
    for r in (runner,) if isinstance(ref, torch.Tensor) else (ref, runner):
        _check_fits(r, token_ids)
    kl_sum = nll_ref = nll = 0.0
    agree = 0
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        targets = torch.tensor(token_ids[start + 1 : start + 1 + k])
        lp_ref = (
            ref[start : start + k]
            if isinstance(ref, torch.Tensor)
            else _chunk_log_probs(ref, token_ids, start, k)
        )
        lp_mode = _chunk_log_probs(runner, token_ids, start, k)
        kl_sum += float((lp_ref.exp() * (lp_ref - lp_mode)).sum())
        agree += int((lp_ref.argmax(-1) == lp_mode.argmax(-1)).sum())
        nll_ref -= float(lp_ref.gather(1, targets[:, None]).sum())
        nll -= float(lp_mode.gather(1, targets[:, None]).sum())
    return QualityReport(n, kl_sum / n, agree / n, math.exp(nll_ref / n), math.exp(nll / n))
