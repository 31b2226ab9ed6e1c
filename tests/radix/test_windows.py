"""WindowStore.find: the deepest kept window inside a prefix, among windows whose last tokens collide."""

from __future__ import annotations

from array import array

from radixd.radix import BlockPool, WindowStore, encode_tokens


def _keep(store: WindowStore, pool: BlockPool, tokens: list[int]) -> None:
    pages = tuple(array("i", pool.allocate(1)) for _ in range(store.groups))
    assert store.keep("", encode_tokens(tokens).packed, 0, pages, "leaf")
    for ids in pages:
        pool.decref_all(ids)  # the store's reference keeps them


def test_find_tells_windows_apart_that_end_in_the_same_tokens() -> None:
    pool = BlockPool(64, 4)
    store = WindowStore(pool, 8, 2)
    tail = list(range(100, 120))  # longer than the index's tail
    a, b = [1, 2, 3, *tail], [4, 5, 6, *tail]
    _keep(store, pool, a)
    _keep(store, pool, b)
    _keep(store, pool, a[:10])
    w = store.find("", encode_tokens([*b, 7, 8]).packed, 100)
    assert w is not None and w.num_tokens == len(b) and w is store.get("", encode_tokens(b).packed)
    w = store.find("", encode_tokens([*a, 9]).packed, len(a) - 1)  # the deepest within the limit
    assert w is not None and w.num_tokens == 10
    assert store.find("", encode_tokens([9, *tail]).packed, 100) is None
    assert store.find("other", encode_tokens(a).packed, 100) is None
    store.drop(("", encode_tokens(a[:10]).packed))
    assert store.find("", encode_tokens(a).packed, len(a) - 1) is None
    assert store.flush() == 2 * 2 and pool.num_free == pool.num_usable


def test_a_held_window_is_not_evicted_until_each_hold_is_released() -> None:
    pool = BlockPool(16, 4)
    store = WindowStore(pool, 8, 2)
    _keep(store, pool, [1, 2, 3])
    w = store.get("", encode_tokens([1, 2, 3]).packed)
    assert w is not None and store.evictable_pages() == 2
    store.hold_window(w)  # a prefix hit
    assert store.hold("", encode_tokens([1, 2, 3]).packed)  # a pin
    assert store.evictable_pages() == 0 and store.evict(2) == 0
    store.release_window(w)
    assert store.evict(2) == 0  # the pin still holds it
    store.unhold("", encode_tokens([1, 2, 3]).packed)
    store.release_window(w)  # one release too many changes nothing
    assert w.holds == 0 and store.evict(2) == 2 and pool.num_free == pool.num_usable
