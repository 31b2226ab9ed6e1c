"""Bounds on every size-like and float field of the API, checked before anything is built from them.

NOTE: each check here is O(1) in the size of the field it guards (`len()` of an already parsed
repeated field, a comparison), so a request asking for 2**31 samples or a 10 MB prompt is refused
before the daemon allocates, tokenizes or queues anything for it. The proto comments state the same
bounds; `Limits` (state.py) carries the ones that depend on the model and the pool.
"""

from __future__ import annotations

import math
from collections.abc import Sized

from radixd.daemon.server.errors import bad_request

# Completions per request (`SamplingParams.n`): each is a copy-on-write child with its own state.
MAX_N = 64
# Children per ForkSession call.
MAX_FORK = 64
# Stop strings per request, and characters per stop string (each is matched against every new token).
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
# Stop token ids per request.
MAX_STOP_TOKEN_IDS = 64
# `logit_bias` entries per request. NOTE: vLLM sets no bound (only ids in the vocabulary and, in its
# OpenAI layer, values clamped to [-100, 100]); OpenAI's API refuses more than 300, and so does radixd:
# enough to ban or force any word list a client biases, and the sampler's per-step cost stays small.
MAX_LOGIT_BIAS = 300
# Client-chosen ids (request, session, tenant namespace, page token): logged and kept as map keys.
MAX_ID_CHARS = 256
# Chat messages per prompt (the characters of all of them together are bounded like a text prompt).
MAX_CHAT_MESSAGES = 1024
# Seconds a session lease may be asked to live, and a WAIT_FOR_IDLE flush to wait.
MAX_SESSION_TTL_S = 7 * 24 * 3600.0
MAX_FLUSH_TIMEOUT_S = 3600.0
# Sessions open at once per daemon (each holds a lease on its cached context).
DEFAULT_MAX_SESSIONS = 10_000
# Texts at most this long are tokenized on the event loop (microseconds); longer ones on a worker.
INLINE_TOKENIZE_CHARS = 4096


def check_count(name: str, value: int | Sized, bound: int) -> int:
    """`value` (a count, or a sized field) must be <= bound; -> the count."""
    n = value if isinstance(value, int) else len(value)
    if n > bound:
        raise bad_request(f"{name} has {n} entries; at most {bound} are allowed")
    return n


def check_range(name: str, value: int, low: int, high: int, hint: str = "") -> int:
    """An integer field in [low, high]."""
    if not low <= value <= high:
        raise bad_request(f"{name} must be in [{low}, {high}], got {value}{hint}")
    return value


def check_id(name: str, value: str) -> str:
    """A client-chosen id: at most MAX_ID_CHARS characters."""
    if len(value) > MAX_ID_CHARS:
        raise bad_request(f"{name} is {len(value)} characters long; at most {MAX_ID_CHARS} are allowed")
    return value


def check_seconds(name: str, value: float, high: float, zero_means: str = "") -> float:
    """A duration field: finite, >= 0 and <= high (NaN and infinity fail every comparison, so they
    are refused explicitly instead of slipping through a `< 0` test)."""
    if not math.isfinite(value) or value < 0 or value > high:
        default = f" (0 = {zero_means})" if zero_means else ""
        raise bad_request(f"{name} must be a finite number of seconds in [0, {high:g}]{default}, got {value}")
    return value


def prompt_char_bound(longest_token_chars: int, context_length: int) -> int:
    """Characters beyond which a text can never fit the context: no token covers more than
    `longest_token_chars` characters, so a longer text has more than `context_length` tokens."""
    return max(1, longest_token_chars) * context_length
