"""llguidance's view of the model's tokenizer, built once per model.

`LLTokenizer` takes the JSON of the very `tokenizers.Tokenizer` the daemon built (from the GGUF or the HF
directory), so control tokens are known as special (never produced inside text) and the engine's ends
of turn are what a finished grammar allows. Building it walks the whole vocabulary (0.3-1.5 s for
49,152 tokens): it runs off the engine thread, once per (tokenizer, vocabulary width, ends of turn),
and every engine over the same loaded model shares it.
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
    """`tokenizer` as llguidance's `LLTokenizer` over `n_vocab` ids (the logits' width) ending at
    `eos_token_ids`. Blocking on first use, then memoized; concurrent first callers share one build.
    Raises what the build raised (a tokenizer llguidance cannot read), every time it is asked."""
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
