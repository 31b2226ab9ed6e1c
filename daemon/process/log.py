"""Logging for the daemon: structlog over the stdlib `logging` module.

`configure()` renders JSON lines when stdout is not a terminal (collectors, CI, systemd) and readable
key=value lines on a terminal. Per-request context (the request id, tenant, rpc) is bound with
`bind_request()` into structlog's contextvars, so every line logged while handling a request carries
it, including lines from libraries that log through the stdlib.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import structlog

LogFormat = Literal["auto", "json", "console"]


def configure(level: str = "info", fmt: LogFormat = "auto", stream: Any = None) -> None:
    """Configure structlog and the stdlib root logger once for the process.

    fmt "auto" picks JSON unless `stream` (default stdout) is a terminal.
    """
    out = stream if stream is not None else sys.stdout
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    use_json = fmt == "json" or (fmt == "auto" and not _isatty(out))
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: Any
    if use_json:
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextmanager
def bind_request(**fields: Any) -> Iterator[None]:
    """Bind `fields` (request_id=..., tenant=..., rpc=...) to every log line inside the block.

    NOTE: contextvars are per asyncio task, so concurrent handlers never see each other's fields.
    """
    tokens = structlog.contextvars.bind_contextvars(**fields)
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)


def get_logger(name: str) -> Any:
    """A structlog logger named `name`."""
    return structlog.get_logger(name)
