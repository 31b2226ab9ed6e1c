"""Incremental detokenization that never emits half a UTF-8 character: `ByteDetokenizer` (byte-level
BPE) looks up each token's bytes and decodes UTF-8 incrementally; `WindowDetokenizer` (any other)
decodes a short window of recent tokens, holding back a trailing U+FFFD. Either way the concatenated
deltas equal the full decode."""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Protocol

from radixd.daemon.text.tokenizer import TextTokenizer

_REPLACEMENT = "\ufffd"
# Tokens of context decoded before the unread tokens; enough for any leading-space rule.
_CONTEXT = 5


class Detokenizer(Protocol):
    """Feed generated token ids one or more at a time; get back the newly complete text."""

    def add(self, token_ids: int | Sequence[int]) -> str:
        """Append generated token(s); return the text they complete ("" while a character is partial)."""
        ...

    def flush(self) -> str:
        """At the end of generation: emit any held-back text (an incomplete character decodes as U+FFFD)."""
        ...


def new_detokenizer(
    tokenizer: TextTokenizer, prompt_token_ids: Sequence[int] = (), skip_special_tokens: bool = False
) -> Detokenizer:
    """The fastest exact detokenizer for `tokenizer`: by byte pieces when its decoding is byte-level."""
    pieces = tokenizer.byte_pieces(skip_special_tokens)
    if pieces is not None:
        return ByteDetokenizer(pieces)
    return WindowDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens)


class ByteDetokenizer:
    """Byte-level vocabularies: text = UTF-8 decode of the tokens' joined pieces (needs no prompt)."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self._pieces = pieces
        # The start of a character that the next pieces complete: what codecs' incremental UTF-8
        # decoder buffers, kept here so a token costs one C call and no Python frame of codecs'.
        self._held = b""

    def _piece(self, token_id: int) -> bytes:
        # Ids past the vocabulary (a model's padded embedding rows) decode to nothing, as in the tokenizer.
        return self._pieces[token_id] if token_id < len(self._pieces) else b""

    def add(self, token_ids: int | Sequence[int]) -> str:
        if isinstance(token_ids, int):
            pieces = self._pieces  # `_piece` inlined: one call per generated token
            data = pieces[token_ids] if token_ids < len(pieces) else b""
        else:
            data = b"".join(self._piece(t) for t in token_ids)
        if self._held:
            data = self._held + data
        text, used = codecs.utf_8_decode(data, "replace", False)
        self._held = data[used:]
        return text

    def flush(self) -> str:
        data, self._held = self._held, b""
        return codecs.utf_8_decode(data, "replace", True)[0]


class WindowDetokenizer:
    """Any tokenizer: decodes a short window of recent tokens per step (see the module docstring)."""

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
        # Bound the context so per-token work stays constant on long generations.
        if self.prefix_offset > 4 * _CONTEXT:
            cut = self.prefix_offset - _CONTEXT
            self.ids = self.ids[cut:]
            self.prefix_offset -= cut
            self.read_offset -= cut
        return delta

    def add(self, token_ids: int | Sequence[int]) -> str:
        if isinstance(token_ids, int):
            self.ids.append(token_ids)
        else:
            self.ids.extend(token_ids)
        return self._emit(final=False)

    def flush(self) -> str:
        if self.read_offset >= len(self.ids):
            return ""
        return self._emit(final=True)
