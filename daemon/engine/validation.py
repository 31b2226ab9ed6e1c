"""Request validation against the engine's fixed limits (context length, pool size, vocabulary).

NOTE: reads only values fixed at construction, so `Engine.submit` may call it on the caller's thread.
"""

from __future__ import annotations

from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.types import GenerateRequest, InvalidRequest, RequestTooLarge


class Validator:
    """`validate` / `check_fits` against `max_model_len`, `vocab_size` and the KV pool's size."""

    def __init__(self, kv: KVManager, max_model_len: int, vocab_size: int) -> None:
        self.kv = kv
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    def check_fits(self, prompt_len: int, req: GenerateRequest) -> None:
        """Raise RequestTooLarge when the request could never run, even alone in an empty pool."""
        p = req.sampling
        total = prompt_len + p.max_tokens
        if total > self.max_model_len:
            raise RequestTooLarge(
                f"prompt ({prompt_len} tokens) + max_tokens ({p.max_tokens}) = {total} exceeds the context"
                f" limit of {self.max_model_len} tokens; shorten the prompt or lower max_tokens"
            )
        kv = self.kv
        width = max(p.n, req.beam_width, 1)
        # The shared prompt once, then per output its generated tokens plus one copied partial block.
        need = kv.blocks_for(prompt_len) + (width if width > 1 else 0) * (kv.blocks_for(p.max_tokens) + 1)
        if width == 1:
            need = kv.blocks_for(total)
        if need > kv.usable_blocks():
            raise RequestTooLarge(
                f"the request needs up to {need} KV blocks of {kv.block_size} tokens but the pool has"
                f" {kv.usable_blocks()}; lower max_tokens / n or start the daemon with more KV memory"
            )

    def validate(self, req: GenerateRequest) -> None:
        """Checks that need no engine state; raise InvalidRequest / RequestTooLarge."""
        if not req.request_id:
            raise InvalidRequest("request_id must be a non-empty string")
        ids = req.prompt_token_ids
        if not ids and req.session_id is None:
            raise InvalidRequest("the prompt is empty; send at least one token")
        bad = [
            t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size
        ]
        if bad:
            raise InvalidRequest(
                f"prompt token ids must be integers in [0, {self.vocab_size}); got {bad[:5]}"
            )
        if req.beam_width < 0 or req.beam_width > 10:
            raise InvalidRequest(f"beam_width must be in [0, 10], got {req.beam_width}")
        if req.beam_width and req.sampling.n > req.beam_width:
            raise InvalidRequest(f"n ({req.sampling.n}) must not exceed beam_width ({req.beam_width})")
        self.check_fits(len(ids), req)
