"""The step's token masks: computed while the forward pass runs, applied to the constrained rows only.

`StepMasks.start(states)` hands the constrained rows' matchers to a mask thread, which fills one bit
per token into a preallocated int32 bitmask with llguidance's batch call (it drops the GIL and spreads
the rows over its own pool), while the engine thread runs the forward pass (whose torch calls drop the
GIL too; on a GPU the forward is queued asynchronously). `PendingMasks.apply(logits)` joins it and sets
every forbidden logit of those rows to `MASKED_LOGIT`; the sampler then runs as for any row.

NOTE: cost only where there is a constraint. A step without constrained rows starts nothing and
`start` returns None (one scan of the rows' states); unconstrained rows of a mixed batch are never read
or written, so they sample exactly what they sample alone (the sampler's batch-invariance NOTE).

NOTE: a matcher is only read by the mask thread between `start` and `apply`; the engine thread consumes
tokens (`Matcher.consume`) after `apply`, so the two never touch one matcher at once.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import TYPE_CHECKING

import llguidance
import llguidance.torch
import torch

from radixd.daemon.sampling import MASKED_LOGIT

if TYPE_CHECKING:
    from radixd.daemon.sampling import SamplingState


class PendingMasks:
    """One step's masks in the making (`StepMasks.start`)."""

    def __init__(
        self,
        fill: concurrent.futures.Future[None],
        rows: list[int],
        bitmask: torch.Tensor,
        shifts: torch.Tensor,
    ) -> None:
        self._fill = fill
        self.rows = rows  # row of the sampled logits for each constrained state
        self._bitmask = bitmask
        self._shifts = shifts

    def wait(self) -> None:
        """Join the fill (also when the step failed, so no fill outlives its step)."""
        self._fill.result()

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [R, V] (R = the states given to `start`) as float32, the constrained rows masked."""
        self.wait()
        logits = logits.float()
        n, vocab = len(self.rows), logits.shape[1]
        bits = self._bitmask[:n].to(logits.device, non_blocking=True)
        # Unpack 32 tokens per int32 word: [n, W] -> [n, W, 32] -> [n, 32 W], cut to the vocabulary.
        allowed = ((bits.unsqueeze(2) >> self._shifts.to(logits.device)) & 1).view(n, -1)[:, :vocab]
        forbidden = allowed == 0
        if n == logits.shape[0]:
            return logits.masked_fill_(forbidden, MASKED_LOGIT)
        idx = torch.tensor(self.rows, device=logits.device)
        return logits.index_copy_(0, idx, logits.index_select(0, idx).masked_fill_(forbidden, MASKED_LOGIT))


class StepMasks:
    """The runner's mask machinery for a `vocab_size`-wide model, built on the first constrained step."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._executor = llguidance.LLExecutor()
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="radixd-masks")
        self._bitmask = torch.zeros((0, self.words), dtype=torch.int32)
        self._shifts = torch.arange(32, dtype=torch.int32)

    def start(self, states: Sequence[SamplingState | None]) -> PendingMasks | None:
        """Start filling the masks of the constrained rows among `states` (None entries: rows that do
        not sample; they do not count as rows); None when no row is constrained."""
        rows: list[int] = []
        matchers: list[tuple[llguidance.LLMatcher, int]] = []
        r = 0
        for st in states:
            if st is None:
                continue
            g = st.grammar
            if g is not None:
                matchers.append((g.raw, len(rows)))
                rows.append(r)
            r += 1
        if not rows:
            return None
        if self._bitmask.shape[0] < len(rows):
            size = max(len(rows), 2 * self._bitmask.shape[0])
            self._bitmask = torch.zeros(
                (size, self.words), dtype=torch.int32, pin_memory=torch.cuda.is_available()
            )
        bitmask = self._bitmask
        fill = self._thread.submit(
            llguidance.torch.fill_next_token_bitmask_par, self._executor, matchers, bitmask
        )
        return PendingMasks(fill, rows, bitmask, self._shifts)
