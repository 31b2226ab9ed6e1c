"""Incremental detokenization that never emits half a UTF-8 character.

Each new token decodes a short window that starts a few tokens back (so tokenizers that drop or add a
leading space at a window start behave the same as in a full decode) and emits only the text after the
window's already-emitted part. When the window ends in U+FFFD (an incomplete multi-byte character) the
text is held back until the next token completes it; `flush()` emits whatever is left at the end, so
the concatenated deltas always equal the full decode of the generated tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixd.daemon.tokenizer import TextTokenizer

_REPLACEMENT = "\ufffd"
# Tokens of context decoded before the unread tokens; enough for any leading-space rule.
_CONTEXT = 5


class IncrementalDetokenizer:
    """Feed generated token ids one or more at a time; get back the newly complete text."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_token_ids[-_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _emit(self, final: bool) -> str:
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) <= len(prefix) or (full.endswith(_REPLACEMENT) and not final):
            return ""
        delta = full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        # NOTE: bound the context so per-token work stays constant on long generations.
        if self.prefix_offset > 4 * _CONTEXT:
            cut = self.prefix_offset - _CONTEXT
            self.ids = self.ids[cut:]
            self.prefix_offset -= cut
            self.read_offset -= cut
        self.text += delta
        return delta

    def add(self, token_ids: int | Sequence[int]) -> str:
        """Append generated token(s); return the text they complete ("" while a character is partial)."""
        if isinstance(token_ids, int):
            self.ids.append(token_ids)
        else:
            self.ids.extend(token_ids)
        return self._emit(final=False)

    def flush(self) -> str:
        """At the end of generation: emit any held-back text (an incomplete character decodes as U+FFFD)."""
        if self.read_offset >= len(self.ids):
            return ""
        return self._emit(final=True)
