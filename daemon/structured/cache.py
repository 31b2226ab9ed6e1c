"""The compile cache: constraints compiled off the engine thread, each once, kept in a bounded LRU.

`get` never blocks: a future, done on a hit; concurrent misses share one compile; failures are kept
`error_ttl_s`. NOTE: one cache serves one model's tokenizer; the key is `grammar.canonical`.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import llguidance

from radixd.daemon.structured.grammar import canonical
from radixd.daemon.structured.matcher import CompiledGrammar, compile_constraint
from radixd.daemon.structured.spec import Constraint

CompileFn = Callable[[Constraint, llguidance.LLTokenizer], CompiledGrammar]

MAX_ENTRIES = 512
MAX_KEY_BYTES = 64 << 20  # the cached constraints' text, a proxy for what their matchers hold
ERROR_TTL_S = 10.0


@dataclass
class CacheCounts:
    """Lookups since start: `hits` found an entry (done or still compiling), `misses` started a compile."""

    hits: int = 0
    misses: int = 0


@dataclass(slots=True)
class _Entry:
    future: concurrent.futures.Future[CompiledGrammar]
    size: int
    expires: float | None = None  # failures only


class GrammarCache:
    """Compiled constraints by canonical form, for one tokenizer. Thread-safe."""

    def __init__(
        self,
        tokenizer: Callable[[], llguidance.LLTokenizer],
        compile: CompileFn = compile_constraint,
        max_entries: int = MAX_ENTRIES,
        max_key_bytes: int = MAX_KEY_BYTES,
        error_ttl_s: float = ERROR_TTL_S,
        workers: int = 2,
    ) -> None:
        self._tokenizer = tokenizer
        self._compile = compile
        self.max_entries = max_entries
        self.max_key_bytes = max_key_bytes
        self.error_ttl_s = error_ttl_s
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="radixd-grammar")
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self.counts = CacheCounts()

    def prepare(self) -> None:
        """Build the tokenizer (and import the mask filler) in the background now, so the first
        constraint does not wait for them."""
        self._pool.submit(self._tokenizer)
        self._pool.submit(importlib.import_module, "llguidance.torch")

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, c: Constraint) -> concurrent.futures.Future[CompiledGrammar]:
        """`c` compiled: a done future on a hit, else the compile in flight. Never blocks."""
        key = canonical(c)
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and (entry.expires is None or entry.expires > now):
                self._entries.move_to_end(key)
                self.counts.hits += 1
                return entry.future
            if entry is not None:
                self._drop(key)
            self.counts.misses += 1
            fut: concurrent.futures.Future[CompiledGrammar] = concurrent.futures.Future()
            self._entries[key] = _Entry(fut, len(key))
            self._bytes += len(key)
            self._trim()
        self._pool.submit(self._run, c, key, fut)
        return fut

    def _run(self, c: Constraint, key: str, fut: concurrent.futures.Future[CompiledGrammar]) -> None:
        try:
            compiled = self._compile(c, self._tokenizer())
        except Exception as exc:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and entry.future is fut:
                    entry.expires = time.monotonic() + self.error_ttl_s
            fut.set_exception(exc)
            return
        fut.set_result(compiled)

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.size

    def _trim(self) -> None:
        """Evict least recently used entries over the bounds (a compile in flight keeps running)."""
        while len(self._entries) > 1 and (
            len(self._entries) > self.max_entries or self._bytes > self.max_key_bytes
        ):
            self._drop(next(iter(self._entries)))

    def shutdown(self) -> None:
        """Stop the pool once the compiles in flight finish (their futures still resolve)."""
        self._pool.shutdown(wait=False)
