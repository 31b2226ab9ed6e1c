"""Requests waiting for their constraint to compile (engine thread only), holding no KV, turn or
sequence while others step; each step takes the compiled ones back in arrival order.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass

from radixd.daemon.engine.types import GenerateRequest, Sink
from radixd.daemon.structured.cache import GrammarCache
from radixd.daemon.structured.matcher import CompiledGrammar

Compiled = concurrent.futures.Future[CompiledGrammar]


@dataclass(eq=False, slots=True)
class Parked:
    """A request whose grammar is compiling."""

    req: GenerateRequest
    sink: Sink
    compiled: Compiled


class GrammarWait:
    """The requests waiting for a grammar, by request id, in arrival order."""

    def __init__(self, cache: GrammarCache) -> None:
        self.cache = cache
        self._parked: dict[str, Parked] = {}

    def __len__(self) -> int:
        return len(self._parked)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._parked

    def ids(self) -> list[str]:
        return list(self._parked)

    def compile(self, req: GenerateRequest) -> Compiled:
        """`req`'s grammar: a done future on a cache hit, else the compile in flight. Never blocks."""
        constraint = req.sampling.constraint
        assert constraint is not None
        return self.cache.get(constraint)

    def park(self, req: GenerateRequest, sink: Sink, compiled: Compiled) -> None:
        self._parked[req.request_id] = Parked(req, sink, compiled)

    def take(self, request_id: str) -> Parked | None:
        """Remove and return a waiting request (aborted, or its engine stopping)."""
        return self._parked.pop(request_id, None)

    def ready(self) -> list[Parked]:
        """Remove and return the requests whose compile finished (or failed), in arrival order."""
        done = [p for p in self._parked.values() if p.compiled.done()]
        for p in done:
            del self._parked[p.req.request_id]
        return done

    def wait(self, timeout_s: float) -> None:
        """Block until one compile finishes or `timeout_s` passed (offline and tests only)."""
        concurrent.futures.wait(
            [p.compiled for p in self._parked.values()], timeout_s, concurrent.futures.FIRST_COMPLETED
        )
