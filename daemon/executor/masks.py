"""The step's token masks: filled on a mask thread while the forward pass runs, applied to constrained rows.

NOTE: unconstrained rows are never read or written (they sample exactly as alone). The mask thread
reads a matcher only between `start` and `apply`; the engine consumes tokens only after `apply`. A
drafted row's matcher is walked over its draft (one mask per position) and rolled back."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import TYPE_CHECKING

import llguidance
import torch

from radixd.daemon.executor.sampling import MASKED_LOGIT

if TYPE_CHECKING:
    from radixd.daemon.executor.sampling import SamplingState


class PendingMasks:
    """One step's masks in the making (`StepMasks.start`)."""

    def __init__(
        self,
        fill: concurrent.futures.Future[None],
        rows: list[int],
        bitmask: torch.Tensor,
        shifts: torch.Tensor,
        draft_rows: list[int] | None = None,
    ) -> None:
        self._fill = fill
        self.rows = rows  # row of the sampled logits for each constrained state
        # Row of the verification logits for each constrained draft position; their masks follow the
        # sampled rows' in the bitmask.
        self.draft_rows = draft_rows or []
        self._bitmask = bitmask
        self._shifts = shifts

    def wait(self) -> None:
        """Join the fill (also when the step failed, so no fill outlives its step)."""
        self._fill.result()

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [R, V] (R = the states given to `start`) as float32, the constrained rows masked."""
        return self._masked(logits, self.rows, 0)

    def apply_drafts(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [D, V] (the drafted positions, in order) as float32, constrained positions masked."""
        return self._masked(logits, self.draft_rows, len(self.rows))

    def _masked(self, logits: torch.Tensor, rows: list[int], first: int) -> torch.Tensor:
        """`logits` as float32 with `rows` masked by the bitmask's rows from `first` on."""
        self.wait()
        logits = logits.float()
        n, vocab = len(rows), logits.shape[1]
        if n == 0:
            return logits
        bits = self._bitmask[first : first + n].to(logits.device, non_blocking=True)
        # Unpack 32 tokens per int32 word: [n, W] -> [n, W, 32] -> [n, 32 W], cut to the vocabulary.
        allowed = ((bits.unsqueeze(2) >> self._shifts.to(logits.device)) & 1).view(n, -1)[:, :vocab]
        forbidden = allowed == 0
        if n == logits.shape[0]:
            return logits.masked_fill_(forbidden, MASKED_LOGIT)
        idx = torch.tensor(rows, device=logits.device)
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

    def start(
        self,
        states: Sequence[SamplingState | None],
        drafts: Sequence[tuple[SamplingState, Sequence[int]]] = (),
    ) -> PendingMasks | None:
        """Start filling the masks of constrained `states` (None: not a row) and `drafts` (len + 1 rows
        each); None when no row is constrained."""
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
        draft_rows: list[int] = []
        drafted: list[tuple[llguidance.LLMatcher, int, list[int]]] = []
        r = 0
        for st, draft in drafts:
            g = st.grammar
            if g is not None:
                drafted.append((g.raw, len(rows) + len(draft_rows), list(draft)))
                draft_rows.extend(range(r, r + len(draft) + 1))
            r += len(draft) + 1
        need = len(rows) + len(draft_rows)
        if not need:
            return None
        if self._bitmask.shape[0] < need:
            size = max(need, 2 * self._bitmask.shape[0])
            self._bitmask = torch.zeros(
                (size, self.words), dtype=torch.int32, pin_memory=torch.cuda.is_available()
            )
        bitmask = self._bitmask
        fill = self._thread.submit(self._fill, matchers, drafted, bitmask)
        return PendingMasks(fill, rows, bitmask, self._shifts, draft_rows)

    def _fill(
        self,
        matchers: list[tuple[llguidance.LLMatcher, int]],
        drafted: list[tuple[llguidance.LLMatcher, int, list[int]]],
        bitmask: torch.Tensor,
    ) -> None:
        """The mask thread's work: one mask per sampled row, then one per drafted row's position."""
        # NOTE: imported here, not at start-up: it imports torch.compile's machinery (seconds of every
        # start); `StructuredCache.prepare` imports it in the background once the model is loaded.
        import llguidance.torch

        if matchers:
            llguidance.torch.fill_next_token_bitmask_par(self._executor, matchers, bitmask)
        if drafted:
            # Per matcher: its mask, then each draft token consumed and the mask after it; then
            # rolled back, so its state is as before.
            llguidance.torch.fill_next_token_bitmask_par_with_draft_tokens(self._executor, drafted, bitmask)
