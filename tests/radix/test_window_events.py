"""The window store's events: every window kept and dropped is reported once, with why it went, and a
replay into a late listener reports exactly the windows kept now."""

from __future__ import annotations

from array import array

import pytest

from radixd.radix import (
    BlockPool,
    CacheListener,
    FanOut,
    InvalidRequest,
    WindowStore,
    encode_tokens,
    token_ids,
    window_start,
)

BS, WINDOW, GROUPS = 4, 6, 2


class Recorder:
    """Both kinds of cache listener: the tree's node events and the store's window events."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        self.events.append(("stored", namespace, tuple(tokens), start, num_blocks))

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        self.events.append(("removed", namespace, tuple(tokens), start, num_blocks, reason))

    def kept(self, namespace: str, tokens: list[int], start: int, num_pages: int) -> None:
        self.events.append(("kept", namespace, tuple(tokens), start, num_pages))

    def dropped(self, namespace: str, tokens: list[int], start: int, num_pages: int, reason: str) -> None:
        self.events.append(("dropped", namespace, tuple(tokens), start, num_pages, reason))


class NodesOnly:
    """A tree listener that does not hear windows."""

    def __init__(self) -> None:
        self.calls = 0

    def stored(self, namespace: str, tokens: list[int], start: int, num_blocks: int) -> None:
        self.calls += 1

    def removed(self, namespace: str, tokens: list[int], start: int, num_blocks: int, reason: str) -> None:
        self.calls += 1


def keep(store: WindowStore, tokens: list[int], ns: str = "", kind: str = "leaf") -> tuple[int, ...]:
    """Keep the window ending after `tokens` on fresh pages (the caller's references released after, as
    a finished sequence's are); -> the event it should report."""
    n = len(tokens)
    lo = window_start(n, WINDOW, BS)
    pages = tuple(array("i", store.pool.allocate(-(-n // BS) - lo)) for _ in range(GROUPS))
    store.keep(ns, encode_tokens(tokens).packed, lo, pages, kind)
    for ids in pages:
        store.pool.decref_all(ids)
    return lo * BS, GROUPS * len(pages[0])


def test_every_window_is_reported_kept_and_dropped_with_its_reason() -> None:
    pool = BlockPool(64, BS)
    store = WindowStore(pool, WINDOW, GROUPS)
    rec = Recorder()
    store.listener = rec
    turn1, turn2 = list(range(10)), [*range(10), 50, 51, 52, 53, 54, 55, 56]
    start1, pages1 = keep(store, turn1)
    start2, pages2 = keep(store, turn2)
    assert rec.events == [
        ("kept", "", tuple(turn1), start1, pages1),
        ("kept", "", tuple(turn2), start2, pages2),
    ]
    assert (start1, pages1) == (4, 2 * GROUPS)  # keys 4..9 of turn 1: positions 1 and 2
    keep(store, turn1)  # already kept: refreshed, not reported again
    assert len(rec.events) == 2

    rec.events.clear()
    store.supersede("", encode_tokens(turn1).packed)  # the conversation went on past turn 1
    assert rec.events == [("dropped", "", tuple(turn1), start1, pages1, "superseded")]
    keep(store, [7] * 9, "t:a", kind="branch")
    keep(store, [8] * 9)
    store.evict(1)  # least recently used first: turn 2's
    store.drop_where(lambda ns, _key, _w: ns == "t:a")
    store.flush()
    assert [(e[1], e[2][-1], e[-1]) for e in rec.events[1:] if e[0] == "dropped"] == [
        ("", 56, "lru"),
        ("t:a", 7, "dead"),
        ("", 8, "flush"),
    ]
    assert len(store) == 0 and pool.num_free == pool.num_blocks - 1
    with pytest.raises(InvalidRequest):
        store.drop(("", b""), "tired")


def test_a_replay_reports_the_kept_windows_and_a_fan_out_reaches_only_window_listeners() -> None:
    pool = BlockPool(64, BS)
    store = WindowStore(pool, WINDOW, GROUPS)
    live = Recorder()
    nodes = NodesOnly()
    listeners: tuple[CacheListener, ...] = (live, nodes)
    store.listener = FanOut(*listeners)
    for t in range(5):
        keep(store, [t] * (7 + t))
    store.supersede("", encode_tokens([2] * 9).packed)
    store.evict(1)
    late = Recorder()
    assert store.replay(late) == len(store) == 3
    kept = {e[2]: e for e in live.events if e[0] == "kept"}
    for e in live.events:
        if e[0] == "dropped":
            del kept[e[2]]
    assert sorted(late.events) == sorted(kept.values())
    assert [token_ids(key[1]) for key, _w in store] == [list(e[2]) for e in late.events]
    assert nodes.calls == 0
