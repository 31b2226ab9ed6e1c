"""Tokenizer and chat template, from a GGUF's vocabulary or an HF directory's tokenizer.json.

A GGUF's byte-level BPE vocabulary is rebuilt as a `tokenizers` model the way transformers does, so
token ids match.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property, lru_cache
from typing import Any

import jinja2
import jinja2.sandbox
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

_CONTROL = 3
_USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Split regexes by `tokenizer.ggml.pre`; anything else uses GPT-2's byte-level regex (as transformers does).
_PRE_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}

# Names that end a turn in common chat formats; they count as end-of-sequence alongside the file's eos.
END_OF_TURN_NAMES = (
    "<|im_end|>",  # Qwen, SmolLM (ChatML)
    "<|endoftext|>",
    "<|eot_id|>",  # Llama 3: end of turn
    "<|eom_id|>",  # Llama 3.1+: end of a message that called a tool
    "<|end_of_text|>",
    "</s>",  # Llama 2, Mistral
    "<end_of_turn>",  # Gemma
)


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def build_bpe_tokenizer(
    tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int], pre: str | None
) -> Tokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` from GGUF vocabulary arrays."""
    alphabet = set(_byte_alphabet().values())
    spell = _byte_alphabet()
    vocab: dict[str, int] = {}
    for i, piece in enumerate(tokens):
        key = piece if set(piece) <= alphabet else "".join(spell[b] for b in piece.encode("utf-8"))
        vocab.setdefault(key, i)
    pairs: list[tuple[str, str]] = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise ValueError(f"malformed BPE merge {m!r} (expected two tokens separated by a space)")
        pairs.append((a, b))
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    split = _PRE_SPLITS.get(pre or "")
    if split is None:
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        bpe.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    bpe.decoder = decoders.ByteLevel()
    types = list(token_types) or [1] * len(tokens)
    control = [
        AddedToken(t, normalized=False, special=True)
        for t, ty in zip(tokens, types, strict=False)
        if ty == _CONTROL and set(t) <= alphabet
    ]
    if control:
        bpe.add_special_tokens(control)
    user = [
        AddedToken(t, normalized=False, special=False)
        for t, ty in zip(tokens, types, strict=False)
        if ty == _USER_DEFINED and t in vocab
    ]
    if user:
        bpe.add_tokens(user)
    return bpe


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


class TextTokenizer:
    """Encode / decode text and render the chat template; `eos_token_ids` include end-of-turn tokens."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None = None,
        bos_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        add_bos: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.add_bos = add_bos
        self._template: jinja2.Template | None = None
        self._pieces: dict[bool, tuple[bytes, ...] | None] = {}

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @cached_property
    def longest_token_chars(self) -> int:
        """The most characters (UTF-8 bytes, an upper bound) one token can stand for."""
        longest = 0
        for i in range(self.vocab_size):
            longest = max(longest, len(self.decode([i]).encode()), len(self.id_to_token(i) or ""))
        return longest

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # The batch entry point releases the GIL (the single-text one does not).
        ids: list[int] = self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def byte_pieces(self, skip_special_tokens: bool) -> tuple[bytes, ...] | None:
        """The bytes each token id stands for when decoding is byte-level (else None); built once per
        flag and checked against the tokenizer's decode of every token (any mismatch: None)."""
        if skip_special_tokens not in self._pieces:
            self._pieces[skip_special_tokens] = self._build_pieces(skip_special_tokens)
        return self._pieces[skip_special_tokens]

    def _build_pieces(self, skip_special_tokens: bool) -> tuple[bytes, ...] | None:
        # Only the ByteLevel decoder joins all bytes and decodes them once, so only it has exact pieces.
        if not isinstance(self.tokenizer.decoder, decoders.ByteLevel):
            return None
        byte_of = {c: b for b, c in _byte_alphabet().items()}
        special = {i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}
        pieces: list[bytes] = []
        for i in range(self.vocab_size):
            token = self.tokenizer.id_to_token(i)
            if token is None or (skip_special_tokens and i in special):
                pieces.append(b"")
            elif all(c in byte_of for c in token):
                pieces.append(bytes(byte_of[c] for c in token))
            else:
                pieces.append(token.encode())
        singles = self.tokenizer.decode_batch([[i] for i in range(len(pieces))], skip_special_tokens)
        if any(text != piece.decode("utf-8", "replace") for text, piece in zip(singles, pieces, strict=True)):
            return None
        return tuple(pieces)

    def id_to_token(self, token_id: int) -> str | None:
        tok: str | None = self.tokenizer.id_to_token(token_id)
        return tok

    def token_to_id(self, token: str) -> int | None:
        tid: int | None = self.tokenizer.token_to_id(token)
        return tid

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """Render `messages` ([{"role", "content"}]) with the model's chat template."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; send a plain prompt instead of --chat")
        if self._template is None:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_exception
            self._template = env.from_string(self.chat_template)
        bos = self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else None
        eos = self.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else None
        return self._template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=bos or "",
            eos_token=eos or "",
            **extra,
        )

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the rendered chat (the template writes its own special tokens)."""
        text = self.apply_chat_template(messages, add_generation_prompt)
        return self.encode(text, add_special_tokens=False)


def end_of_turn_ids(tok: Tokenizer, eos: int | None, turn_ends: Sequence[int | None] = ()) -> tuple[int, ...]:
    """The file's eos id, its end-of-turn / end-of-message ids, then the known end-of-turn names that are
    special tokens of this vocabulary (Gemma's "</s>" is a plain HTML tag there, not an end)."""
    ids: list[int] = [] if eos is None else [eos]
    ids += [int(t) for t in turn_ends if t is not None and int(t) not in ids]
    special = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    for name in END_OF_TURN_NAMES:
        tid = special.get(name)
        if tid is not None and tid not in ids:
            ids.append(tid)
    return tuple(ids)
