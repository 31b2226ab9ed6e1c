"""llguidance's view of the model's tokenizer, built once per model.

Built from the daemon's own `tokenizers.Tokenizer` JSON, so control tokens are special. Building walks
the whole vocabulary: off the engine thread, once per (tokenizer, width, ends of turn).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import llguidance

from radixd.daemon.text.tokenizer import TextTokenizer

_Key = tuple[int, tuple[int, ...]]

_lock = threading.Lock()
# NOTE: keyed weakly by the tokenizer object: a model unloaded with its tokenizer drops its entry.
_built: weakref.WeakKeyDictionary[TextTokenizer, dict[_Key, tuple[threading.Lock, list[object]]]] = (
    weakref.WeakKeyDictionary()
)


def llg_tokenizer(
    tokenizer: TextTokenizer, n_vocab: int, eos_token_ids: Sequence[int]
) -> llguidance.LLTokenizer:
    """`tokenizer` as an `LLTokenizer` over `n_vocab` ids; memoized, one shared build; failures re-raise."""
    key = (n_vocab, tuple(eos_token_ids))
    with _lock:
        slot = _built.setdefault(tokenizer, {}).setdefault(key, (threading.Lock(), []))
    build_lock, result = slot
    with build_lock:
        if not result:
            try:
                result.append(
                    llguidance.LLTokenizer(
                        tokenizer.tokenizer.to_str(), n_vocab=n_vocab, eos_token=list(key[1])
                    )
                )
            except Exception as exc:  # kept: every later call reports the same failure
                result.append(
                    RuntimeError(
                        f"this model's tokenizer cannot drive structured outputs (llguidance: {exc})"
                    )
                )
    built = result[0]
    if isinstance(built, BaseException):
        raise built
    assert isinstance(built, llguidance.LLTokenizer)
    return built
