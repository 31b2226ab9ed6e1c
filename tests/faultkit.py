"""Helpers shared by the engine's and the daemon's fault tests: planted faults, captured JSON logs."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

from radixd.daemon.process.log import configure


class Injected(RuntimeError):
    """The fault the tests plant."""


def fail_once(monkeypatch: pytest.MonkeyPatch, obj: Any, name: str) -> list[int]:
    """Make `obj.name` raise `Injected` on its first call; -> a list that counts the faults raised."""
    real = getattr(obj, name)
    raised: list[int] = []

    def faulty(*args: Any, **kwargs: Any) -> Any:
        if not raised:
            raised.append(1)
            raise Injected(f"injected fault in {name}")
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, faulty)
    return raised


@contextlib.contextmanager
def json_logs() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """Inside the block the daemon logs JSON lines into memory (any thread); yields a function that
    returns the lines logged so far. The logging configuration is restored afterwards."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    buf = io.StringIO()
    configure("info", "json", stream=buf)
    # No logger may keep this configuration past the block.
    structlog.configure(cache_logger_on_first_use=False)
    try:
        yield lambda: [json.loads(x) for x in buf.getvalue().splitlines() if x.startswith("{")]
    finally:
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(level)
