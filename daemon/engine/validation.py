"""Request validation against the engine's fixed limits (context length, pool size, vocabulary).

NOTE: reads only values fixed at construction, so `Engine.submit` may call it on the caller's thread.
"""

from __future__ import annotations

from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.errors import InvalidRequest, RequestTooLarge
from radixd.daemon.executor.limits import check_context, check_token_ids


class Validator:
    """`validate` / `check_fits` against `max_model_len`, `vocab_size` and the KV pool's size."""

    def __init__(self, kv: KVManager, max_model_len: int, vocab_size: int) -> None:
        self.kv = kv
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    def check_fits(self, prompt_len: int, req: GenerateRequest) -> None:
        """Raise RequestTooLarge when the request could never run, even alone in an empty pool."""
        p = req.sampling
        check_context(prompt_len, p.max_tokens, self.max_model_len)
        kv = self.kv
        need = kv.peak_blocks(prompt_len, req)
        if need > kv.usable_blocks():
            raise RequestTooLarge(self.too_large(prompt_len, req, need, f"the pool has {kv.usable_blocks()}"))

    def too_large(self, prompt_len: int, req: GenerateRequest, need: int, have: str) -> str:
        """What a request that can not fit needs, what there is (`have`), what to change."""
        p, kv = req.sampling, self.kv
        layout = " (its window's pages included)" if kv.sliding is not None else ""
        return (
            f"the request ({prompt_len} prompt tokens + max_tokens {p.max_tokens}, n {max(p.n, 1)}) needs"
            f" up to {need} KV blocks of {kv.block_size} tokens{layout} but {have}; lower"
            " max_tokens / n, shorten the prompt, or start the daemon with more KV memory"
        )

    def validate(self, req: GenerateRequest) -> None:
        """Checks that need no engine state; raise InvalidRequest / RequestTooLarge."""
        if not req.request_id:
            raise InvalidRequest("request_id must be a non-empty string")
        ids = req.prompt_token_ids
        if not ids and req.session_id is None:
            raise InvalidRequest("the prompt is empty; send at least one token")
        check_token_ids(ids, self.vocab_size)
        if req.sampling.logit_bias:
            check_token_ids([t for t, _ in req.sampling.logit_bias], self.vocab_size, what="logit_bias")
        if req.beam_width < 0 or req.beam_width > 10:
            raise InvalidRequest(f"beam_width must be in [0, 10], got {req.beam_width}")
        if req.beam_width and req.sampling.n > req.beam_width:
            raise InvalidRequest(f"n ({req.sampling.n}) must not exceed beam_width ({req.beam_width})")
        c = req.sampling.constraint
        if c is not None and req.sampling.ignore_eos:
            raise InvalidRequest(
                f"ignore_eos cannot be combined with a {c.kind} constraint: the output ends where the"
                " constraint is complete; drop ignore_eos"
            )
        if c is not None and req.sampling.min_tokens:
            raise InvalidRequest(
                f"min_tokens cannot be combined with a {c.kind} constraint: the output ends where the"
                " constraint is complete; drop min_tokens"
            )
        self.check_fits(len(ids), req)
