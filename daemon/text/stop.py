"""Stop strings matched on generated text across token boundaries, excluded from the output.

Text that could start a stop string is held back until a later delta decides it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class StopResult:
    text: str  # text safe to emit now
    stopped: bool = False  # a stop string matched; `text` ends right before it
    stop_string: str | None = None


class StopStringMatcher:
    """Feed text deltas in order; `push` returns what may be emitted and whether a stop string hit."""

    def __init__(self, stop: Sequence[str]) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self.stop = tuple(stop)
        self.max_len = max((len(s) for s in self.stop), default=0)
        self.text = ""  # everything pushed so far (up to the stop point once stopped)
        self.emitted = 0
        self.stopped = False
        self.matched: str | None = None  # the stop string that matched, once stopped

    def _holdback(self) -> int:
        """Length of the longest suffix of self.text that is a proper prefix of a stop string."""
        best = 0
        tail = self.text[-(self.max_len - 1) :] if self.max_len > 1 else ""
        for s in self.stop:
            for n in range(min(len(s) - 1, len(tail)), best, -1):
                if tail.endswith(s[:n]):
                    best = n
                    break
        return best

    def push(self, delta: str) -> StopResult:
        if self.stopped:
            return StopResult("", True)
        if not self.stop:
            self.text += delta
            self.emitted = len(self.text)
            return StopResult(delta)
        # A match can start up to max_len - 1 characters before the new delta.
        start = max(0, len(self.text) - self.max_len + 1)
        self.text += delta
        hit, which = -1, None
        for s in self.stop:
            i = self.text.find(s, start)
            if i != -1 and (hit == -1 or i < hit):
                hit, which = i, s
        if hit != -1:
            out = self.text[self.emitted : hit]
            self.text = self.text[:hit]
            self.emitted = hit
            self.stopped = True
            self.matched = which
            return StopResult(out, True, which)
        safe = len(self.text) - self._holdback()
        out = self.text[self.emitted : safe] if safe > self.emitted else ""
        self.emitted = max(self.emitted, safe)
        return StopResult(out)

    def finish(self) -> str:
        """Generation ended without a stop string: release the held-back text."""
        if self.stopped:
            return ""
        out = self.text[self.emitted :]
        self.emitted = len(self.text)
        return out
