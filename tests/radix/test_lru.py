"""LruIndex: eviction order over both tiers (fresh ticks in insertion order, older ticks sorted)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixd.radix.blockids import BlockIds
from radixd.radix.lru import LruIndex
from radixd.radix.node import Node


def leaf(tick: int) -> Node:
    return Node(b"", BlockIds(), None, b"", tick)


def test_lru_index_keeps_last_use_order() -> None:
    lru = LruIndex()
    nodes = [leaf(t) for t in range(1, 301)]
    for x in nodes:
        lru.add(x)
    for x in nodes[:250]:  # leased: out of the index
        lru.discard(x)
    assert len(lru) == 50 and lru.in_order()
    for x in reversed(nodes[:10]):  # released again with their old ticks
        lru.add(x)
    assert lru.oldest_first() == [*nodes[:10], *nodes[250:]]
    assert [lru.pop_oldest() for _ in range(12)] == [*nodes[:10], *nodes[250:252]]
    assert not any(x.in_lru for x in nodes[:10]) and len(lru) == 48
    assert nodes[260] in lru and nodes[0] not in lru and lru.in_order()


def test_an_old_tick_is_evicted_before_newer_ones_whichever_tier_holds_it() -> None:
    lru = LruIndex()
    a, b, c = leaf(1), leaf(2), leaf(3)
    lru.add(b)
    lru.add(c)
    lru.add(a)  # re-enters with the oldest tick
    assert [lru.pop_oldest() for _ in range(4)] == [a, b, c, None] and not lru
    lru.add(leaf(4))
    lru.clear()
    assert not lru and len(lru) == 0


# Each step: ("touch", i) gives node i the next clock tick and (re-)adds it, as a touched or new leaf;
# ("lease", i) takes it out; ("release", i) puts it back with the tick it had; ("evict",) pops the oldest.
_steps = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["touch", "lease", "release"]), st.integers(0, 11)),
        st.just(("evict",)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(_steps)
def test_lru_index_matches_a_sorted_reference(steps: list[tuple[str, int] | tuple[str]]) -> None:
    lru = LruIndex()
    nodes = [leaf(0) for _ in range(12)]
    clock = 0
    for step in steps:
        if step[0] == "evict":
            if lru:
                want = min((x for x in nodes if x.in_lru), key=lambda x: x.tick)
                assert lru.pop_oldest() is want and not want.in_lru
            continue
        x = nodes[step[1]]
        if step[0] == "touch":
            lru.discard(x)
            clock += 1
            x.tick = clock
            lru.add(x)
        elif step[0] == "lease":
            lru.discard(x)
        elif not x.in_lru and x.tick:  # release: back with its old tick
            lru.add(x)
        assert lru.in_order()
        assert lru.oldest_first() == sorted((x for x in nodes if x.in_lru), key=lambda x: x.tick)
        assert len(lru) == sum(x.in_lru for x in nodes)
