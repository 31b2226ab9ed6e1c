"""Per-output incremental text: a `Detokenizer` (never half a character) glued to a
`StopStringMatcher` (stop strings across token boundaries, excluded from the text).
"""

from __future__ import annotations

from collections.abc import Sequence

from radixd.daemon.text.detokenizer import new_detokenizer
from radixd.daemon.text.stop import StopStringMatcher
from radixd.daemon.text.tokenizer import TextTokenizer


class TextStream:
    """Incremental text of one output; `stopped` turns True when a stop string matched."""

    def __init__(self, tokenizer: TextTokenizer, prompt: Sequence[int], stop: Sequence[str] = ()) -> None:
        self._detok = new_detokenizer(tokenizer, prompt, skip_special_tokens=True)
        # Most requests have no stop strings: their text goes straight out, with no matcher per token.
        self._stop = StopStringMatcher(stop) if stop else None
        self.stopped = False  # a stop string matched (a plain attribute: read once per token)

    @property
    def matched(self) -> str | None:
        """The stop string that matched (None until one did)."""
        return None if self._stop is None else self._stop.matched

    @staticmethod
    def prepare(tokenizer: TextTokenizer) -> None:
        """Build the tokenizer's tables the streams use now, not on the first request."""
        tokenizer.byte_pieces(skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """Add one generated token; -> the text that can be released now."""
        if self._stop is None:
            return self._detok.add(token_id)
        if self.stopped:
            return ""
        text = self._stop.push(self._detok.add(token_id)).text
        self.stopped = self._stop.stopped
        return text

    def finish(self) -> str:
        """At the end of generation: the held-back text (none after a stop string)."""
        if self._stop is None:
            return self._detok.flush()
        if self._stop.stopped:
            return ""
        tail = self._stop.push(self._detok.flush()).text
        self.stopped = self._stop.stopped
        return tail + self._stop.finish()
