"""The quality contract of the non-fp32 precisions: teacher-forced next-token distributions vs fp32.

On a fixed text, every position's next-token distribution of a mode is compared with the fp32
reference mode's: mean KL(fp32 || mode) in nats per token, the share of positions whose top-1 token
agrees, and the perplexity of the text under each. A mode meets the contract with mean KL <= 0.02,
top-1 agreement >= 95% and perplexity within 2% of fp32's (tests/daemon/test_quality_contract.py;
measured values in docs/bench-offline.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from radixd.daemon.runner import ModelRunner, StepSeq

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


def teacher_forced_quality(
    ref: ModelRunner, runner: ModelRunner, token_ids: list[int], chunk: int = 512
) -> QualityReport:
    """Feed `token_ids` through both runners in prefill chunks of `chunk` tokens (the engine's path)
    and compare the next-token distributions at every position but the last."""
    if len(token_ids) < 2:
        raise ValueError("need at least 2 tokens")
    for r in (ref, runner):
        if -(-len(token_ids) // r.block_size) >= r.num_blocks:
            raise ValueError(f"{len(token_ids)} tokens do not fit a pool of {r.num_blocks} blocks")
    kl_sum = nll_ref = nll = 0.0
    agree = 0
    for start in range(0, len(token_ids) - 1, chunk):
        piece = token_ids[start : start + chunk]
        targets = torch.tensor(token_ids[start + 1 : start + 1 + len(piece)])
        piece = piece[: len(targets)]
        lp = []
        for r in (ref, runner):
            table = list(range(1, -(-(start + len(piece)) // r.block_size) + 1))
            lp.append(r.step_logits([StepSeq(0, piece, start, table, None)]).log_softmax(-1))
        lp_ref, lp_mode = lp
        kl_sum += float((lp_ref.exp() * (lp_ref - lp_mode)).sum())
        agree += int((lp_ref.argmax(-1) == lp_mode.argmax(-1)).sum())
        nll_ref -= float(lp_ref.gather(1, targets[:, None]).sum())
        nll -= float(lp_mode.gather(1, targets[:, None]).sum())
    n = len(token_ids) - 1
    return QualityReport(n, kl_sum / n, agree / n, math.exp(nll_ref / n), math.exp(nll / n))
