"""Bounds on every size-like and float field of the API, checked before anything is built from them.

NOTE: each check is O(1) in its field's size, so huge requests are refused before any allocation; only
a JSON schema (<= 64 KiB) is parsed, once, for its nesting depth. The proto comments state the same
bounds; `Limits` (state.py) holds the model-dependent ones."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence, Sized

from radixd.daemon.server.common.errors import bad_request

# Completions per request (`SamplingParams.n`): each is a copy-on-write child with its own state.
MAX_N = 64
# Children per ForkSession call.
MAX_FORK = 64
# Stop strings per request, and characters per stop string (each is matched against every new token).
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
# Stop token ids per request.
MAX_STOP_TOKEN_IDS = 64
# `logit_bias` entries per request: OpenAI's bound, which keeps the sampler's per-step cost small.
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
# Structured outputs: the text of a json_schema, regex, grammar or structural_tag constraint (UTF-8
# bytes); a choice's entries and the bytes of each; how deep a JSON schema's objects and arrays nest.
MAX_CONSTRAINT_BYTES = 64 * 1024
MAX_CHOICES = 256
MAX_CHOICE_BYTES = 1024
MAX_SCHEMA_DEPTH = 32
_JSON_NAMES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
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
    """A duration field: finite, >= 0 and <= high (NaN and inf refused explicitly)."""
    if not math.isfinite(value) or value < 0 or value > high:
        default = f" (0 = {zero_means})" if zero_means else ""
        raise bad_request(f"{name} must be a finite number of seconds in [0, {high:g}]{default}, got {value}")
    return value


def prompt_char_bound(longest_token_chars: int, context_length: int) -> int:
    """Characters beyond which a text can never fit the context (no token is longer than the longest)."""
    return max(1, longest_token_chars) * context_length


def utf8_bytes_over(text: str, bound: int) -> int:
    """The UTF-8 size of `text` when it exceeds `bound`, else 0 (encodes only when length can't decide)."""
    if len(text) > bound:
        return len(text.encode("utf-8", "surrogatepass"))
    if 4 * len(text) <= bound:
        return 0
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > bound else 0


def check_bytes(name: str, text: str, bound: int, what: str) -> None:
    """INVALID_ARGUMENT when `text` is over `bound` UTF-8 bytes (`what` says what the bound is)."""
    size = utf8_bytes_over(text, bound)
    if size:
        raise bad_request(f"{name} is {size} bytes; at most {bound} {what}: shorten it")


def check_constraint_text(name: str, text: str) -> str:
    """The text of a json_schema / regex / grammar / structural_tag constraint: 1 byte to 64 KiB."""
    if not text:
        raise bad_request(f"{name} is empty; send its text or leave the constraint unset")
    check_bytes(name, text, MAX_CONSTRAINT_BYTES, "(64 KiB) are allowed")
    return text


def check_choices(name: str, choices: Sequence[str]) -> tuple[str, ...]:
    """A choice constraint: 1 to MAX_CHOICES strings of 1 to MAX_CHOICE_BYTES bytes each."""
    if not choices:
        raise bad_request(f"{name} is empty; send at least one string to choose from")
    check_count(name, choices, MAX_CHOICES)
    for i, c in enumerate(choices):
        if not c:
            raise bad_request(f"{name}[{i}] is empty; every choice needs at least one character")
        check_bytes(f"{name}[{i}]", c, MAX_CHOICE_BYTES, "are allowed per choice")
    return tuple(choices)


def check_json_schema(name: str, text: str) -> str:
    """A JSON schema constraint: within the text bound, a JSON object, nested <= MAX_SCHEMA_DEPTH."""
    check_constraint_text(name, text)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(
            f"{name} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
            " (send a JSON Schema document)"
        ) from exc
    except RecursionError as exc:  # the parser's own nesting limit, far beyond ours
        raise bad_request(f"{name} nests deeper than {MAX_SCHEMA_DEPTH} levels; flatten the schema") from exc
    if not isinstance(doc, dict):
        raise bad_request(
            f'{name} must be a JSON object (a JSON Schema document such as {{"type": "object"}}),'
            f" got a JSON {_JSON_NAMES.get(type(doc), 'null')}"
        )
    if _json_depth(doc) > MAX_SCHEMA_DEPTH:
        raise bad_request(
            f"{name} nests objects and arrays deeper than {MAX_SCHEMA_DEPTH} levels; flatten the schema"
            " (for example with $defs and $ref)"
        )
    return text


def _json_depth(doc: object) -> int:
    """How deep objects and arrays nest (a scalar is 0); iterative, stops past MAX_SCHEMA_DEPTH."""
    deepest = 0
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_SCHEMA_DEPTH:
            return depth
        stack.extend((child, depth + 1) for child in children)
    return deepest
