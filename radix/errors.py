"""Exceptions raised by the radix memory core; each says what was wrong and what the caller can do."""

from __future__ import annotations


class RadixError(Exception):
    """Base class of every error raised by ``radixd.radix``."""


class InvalidRequest(RadixError, ValueError):
    """An argument is malformed (wrong length, bad block id, negative count, ...)."""


class OutOfBlocks(RadixError):
    """The pool has fewer free blocks than requested; evict cached blocks or wait for requests to end."""

    def __init__(self, requested: int, free: int, evictable: int | None = None) -> None:
        self.requested = requested
        self.free = free
        self.evictable = evictable
        hint = "" if evictable is None else f", {evictable} more could be freed by evicting cached blocks"
        super().__init__(f"out of KV blocks: requested {requested}, only {free} free{hint}")


class DoubleFree(RadixError):
    """A block's reference count would drop below zero: some holder released it twice."""


class PinBudgetExceeded(RadixError):
    """Pinning would exceed the pin budget (a fraction of the pool)."""


class UnknownLease(RadixError):
    """A lease was handed to a tree that did not issue it."""


class NotPinned(RadixError):
    """``unpin`` was called for a prefix that is not pinned."""
