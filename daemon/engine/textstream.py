"""Per-output incremental text: UTF-8-safe detokenization plus stop strings across token boundaries.

The engine feeds generated token ids one at a time and gets back text deltas. A delta never ends in
half a character (the decoder output ends in U+FFFD until the rest of the bytes arrive), never
contains a stop string (text from the stop string on is dropped) and holds back a tail that could
still grow into a stop string until it cannot, or until `finish()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


class TextStream:
    """Incremental text of one output. `skip_special_tokens` drops control tokens (eos, ...)."""

    def __init__(self, decoder: Decoder, stop: Sequence[str] = (), skip_special_tokens: bool = True) -> None:
        self._decoder = decoder
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # decode window start: a few tokens of context keep merges/spaces right
        self._read = 0  # ids whose text is already in `_text`
        self._text = ""
        self._emitted = 0
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.stopped = False

    @property
    def text(self) -> str:
        """All text decided so far (stop string and what follows excluded)."""
        return self._text

    def push(self, token_id: int) -> str:
        """Add one token; -> the text that can be released now. Sets `stopped` on a stop string."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        window = self._decoder.decode(self._ids[self._prefix :], skip_special_tokens=self._skip)
        if window.endswith("\ufffd"):
            return ""  # an incomplete UTF-8 sequence: wait for its remaining bytes
        before = self._decoder.decode(self._ids[self._prefix : self._read], skip_special_tokens=self._skip)
        start = len(self._text)
        self._text += window[len(before) :]
        self._prefix, self._read = max(self._read - 4, 0), len(self._ids)
        if self._stop:
            lo = max(0, start - self._hold)
            hits = [i for i in (self._text.find(s, lo) for s in self._stop) if i >= 0]
            if hits:
                self._text = self._text[: min(hits)]
                self.stopped = True
                return self._release(len(self._text))
        return self._release(len(self._text) - self._hold)

    def finish(self) -> str:
        """The held-back tail, at the end of generation."""
        return self._release(len(self._text))

    def _release(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        out = self._text[self._emitted : upto]
        self._emitted = upto
        return out
