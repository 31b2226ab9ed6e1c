"""Draft tokens for speculative decoding: first what the radix tree cached after the sequence's key (its
namespace only), then what followed the last n-gram's latest earlier occurrence in its own tokens
(byte searches over the packed key, whatever the context length).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

from radixd.radix import TOKEN_BYTES, TokenKey

MAX_NGRAM = 6  # the longest suffix looked up in the sequence's own tokens
MIN_NGRAM = 3  # shorter suffixes match by chance in ordinary text (their drafts are mostly rejected)

Following = Callable[[TokenKey, str, int], list[int]]
"""`(key, namespace, k) -> tokens`: up to k tokens the tree holds after the whole of key."""


def ngram_draft(packed: bytes, k: int, max_n: int = MAX_NGRAM, min_n: int = MIN_NGRAM) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of `packed`'s last n tokens, longest
    n in [min_n, max_n] first; [] when none recurs. The continuation may run into the suffix itself."""
    total = len(packed) // TOKEN_BYTES
    if k <= 0 or total <= min_n:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = packed[(total - n) * TOKEN_BYTES :]
        end = len(packed) - TOKEN_BYTES  # an occurrence that ends before the last token
        while end >= len(suffix):
            at = packed.rfind(suffix, 0, end)
            if at < 0:
                break
            if at % TOKEN_BYTES == 0:  # a match on token boundaries
                start = at + len(suffix)
                return array("i", packed[start : start + k * TOKEN_BYTES]).tolist()
            end = at + len(suffix) - 1  # a misaligned byte match: look further back
    return []


class Drafter:
    """Proposes draft tokens for one sequence at a time (engine thread only)."""

    def __init__(self, following: Following) -> None:
        self._following = following
        self.from_tree = 0  # drafts the tree supplied
        self.from_context = 0  # drafts the sequence's own tokens supplied

    def propose(self, key: TokenKey, namespace: str, k: int) -> list[int]:
        """Up to `k` tokens likely to follow `key`: the tree first, then the sequence's own tokens."""
        if k <= 0:
            return []
        draft = self._following(key, namespace, k)
        if draft:
            self.from_tree += 1
            return draft
        draft = ngram_draft(key.packed, k)
        if draft:
            self.from_context += 1
        return draft


class AdaptiveK:
    """How many tokens to draft for each sequence: doubled after a whole acceptance, accepted + 1 after a
    partial one; a draft rejected outright backs off 2, 4, 8... steps (up to `MAX_WAIT`)."""

    MAX_WAIT = 32

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._k: dict[int, int] = {}
        self._misses: dict[int, int] = {}  # drafts in a row rejected from their first token
        self._wait: dict[int, int] = {}  # steps left before the sequence drafts again

    def get(self, seq_id: int) -> int:
        """The draft length for this step of `seq_id` (0 while it waits; each call counts a step)."""
        wait = self._wait.get(seq_id, 0)
        if wait:
            self._wait[seq_id] = wait - 1
            return 0
        return self._k.get(seq_id, self.limit)

    def update(self, seq_id: int, drafted: int, accepted: int) -> None:
        """Record a verification: `accepted` of `drafted` tokens matched."""
        k = self._k.get(seq_id, self.limit)
        self._k[seq_id] = min(self.limit, 2 * max(k, drafted)) if accepted == drafted else accepted + 1
        if accepted:
            self._misses.pop(seq_id, None)
            return
        misses = self._misses.get(seq_id, 0) + 1
        self._misses[seq_id] = misses
        self._wait[seq_id] = min(2**misses, self.MAX_WAIT)

    def keep_only(self, live: set[int]) -> None:
        """Forget sequences no longer running (called now and then: the maps stay small)."""
        self._k = {s: k for s, k in self._k.items() if s in live}
        self._misses = {s: n for s, n in self._misses.items() if s in live}
        self._wait = {s: n for s, n in self._wait.items() if s in live}

    def __len__(self) -> int:
        return len(self._k)
