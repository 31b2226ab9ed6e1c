"""SentencePiece vocabularies as GGUF files carry them (`tokenizer.ggml.model == "llama"`), rebuilt as a
`tokenizers` BPE model that encodes as llama.cpp does for that file.

llama.cpp tokenizes such a vocabulary by merging the adjacent pair whose concatenation is the
best-scored token, again and again, then spells what never became a token as <0xXX> byte tokens.
That is BPE whose merges are every split of every token into two tokens, ranked by the whole token's
score; so the merges are derived here from the scores (the file lists none).

NOTE: control, unknown and user-defined tokens are cut out of the raw text first (the first two as
special tokens; llama.cpp matches all three whole); each piece left between them gets the "▁" prefix
when the file asks for `add_space_prefix`, and its spaces become "▁".
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

# llama.cpp's token types (gguf.TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's visible space


def score_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Every (left, right) split of a token into two tokens, best-scored whole token first.

    Ties (equal scores) go to the lower token id, then to the longer left part, so the order is total.
    """
    index = {t: i for i, t in enumerate(tokens)}  # the last duplicate wins, as in llama.cpp
    ranked: list[tuple[float, int, int, str, str]] = []
    for token, i in index.items():
        score = float(scores[i])
        for cut in range(len(token) - 1, 0, -1):
            left, right = token[:cut], token[cut:]
            if left in index and right in index:
                ranked.append((-score, i, -cut, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def build_spm_tokenizer(
    tokens: Sequence[str],
    scores: Sequence[float],
    token_types: Sequence[int],
    add_space_prefix: bool,
) -> Tokenizer:
    """A `tokenizers.Tokenizer` for a GGUF SentencePiece vocabulary (tokens, scores, token types)."""
    if len(scores) != len(tokens):
        raise ValueError(f"{len(tokens)} tokens but {len(scores)} scores")
    types = list(token_types) or [NORMAL] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    unk = next((t for t, ty in zip(tokens, types, strict=False) if ty == UNKNOWN), None)
    bpe = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=score_merges(tokens, scores),
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    spaces: list[normalizers.Normalizer] = [normalizers.Replace(" ", SPACE)]
    if add_space_prefix:
        # Prepended to each piece between cut-out tokens, as llama.cpp does after every special token.
        spaces.insert(0, normalizers.Prepend(" "))
    bpe.normalizer = normalizers.Sequence(spaces)
    steps: list[decoders.Decoder] = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    bpe.decoder = decoders.Sequence(steps)
    named = list(zip(tokens, types, strict=False))
    cut = (CONTROL, UNKNOWN)  # llama.cpp cuts the unknown token out of the text like a control one
    control = [AddedToken(t, normalized=False, special=True) for t, ty in named if ty in cut and t]
    if control:
        bpe.add_special_tokens(control)
    user = [AddedToken(t, normalized=False, special=False) for t, ty in named if ty == USER_DEFINED and t]
    if user:
        bpe.add_tokens(user)
    return bpe
