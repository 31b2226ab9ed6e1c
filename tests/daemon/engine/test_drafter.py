"""The speculative drafter (engine/drafter.py): prompt lookup in a sequence's own tokens, the radix
tree's continuation within a namespace, and the adaptive draft length. No model needed."""

from __future__ import annotations

import argparse
from array import array

import pytest

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.drafter import AdaptiveK, Drafter, ngram_draft
from radixd.daemon.server import main as server_main
from radixd.daemon.server.app import engine_config
from radixd.radix import BlockPool, BlockTable, RadixTree, encode_tokens


def _packed(tokens: list[int]) -> bytes:
    return array("i", tokens).tobytes()


def test_ngram_draft_follows_the_latest_longest_match() -> None:
    seq = [5, 6, 7, 8, 1, 2, 9, 9, 5, 6, 7, 8, 3, 4, 0, 0, 5, 6, 7]
    # The last 3 tokens (5 6 7) occurred twice before: the most recent occurrence wins.
    assert ngram_draft(_packed(seq), 4) == [8, 3, 4, 0]
    assert ngram_draft(_packed(seq), 1) == [8]
    assert ngram_draft(_packed(seq), 0) == []
    # A longer suffix is preferred over a more recent shorter one.
    seq = [1, 2, 3, 4, 10, 11, 9, 3, 4, 20, 1, 2, 3, 4]
    assert ngram_draft(_packed(seq), 2) == [10, 11]
    assert ngram_draft(_packed([1, 2, 3, 4, 5, 6]), 4) == []  # nothing recurs
    assert ngram_draft(_packed([7, 7]), 4) == []  # too short to hold a 3-gram and its repeat


def test_ngram_draft_continues_a_repeating_pattern_and_ignores_misaligned_bytes() -> None:
    # The longest recurring suffix (1 2 1 2 1) last occurred two tokens back: its continuation runs
    # into the suffix itself, up to the end of the sequence.
    assert ngram_draft(_packed([1, 2, 1, 2, 1, 2, 1]), 5) == [2, 1]
    # A byte-level match across token boundaries is no token match: (0xFF, 2, 3, 4) packed holds the
    # bytes of (a, b, c) one byte in.
    a, b, c = 0x02000000, 0x03000000, 0x04000000
    assert _packed([0xFF, 2, 3, 4])[1:13] == _packed([a, b, c])
    assert ngram_draft(_packed([0xFF, 2, 3, 4, 9, a, b, c]), 2) == []
    assert ngram_draft(_packed([a, b, c, 77, a, b, c]), 2) == [77, a]


def test_the_tree_drafts_first_and_only_within_the_namespace() -> None:
    tree = RadixTree(BlockPool(32, 4))
    cached = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    table = BlockTable(tree.pool)
    table.append(len(cached))
    lease = tree.match((), "a").lease
    tree.insert_table(cached, table, table.num_blocks, "a", lease, final=True)
    table.release()
    lease.release()
    drafter = Drafter(tree.following)
    assert drafter.propose(encode_tokens([1, 2, 3, 4, 5]), "a", 3) == [6, 7, 8]
    assert (drafter.from_tree, drafter.from_context) == (1, 0)
    assert drafter.propose(encode_tokens([1, 2, 3, 4, 5]), "b", 3) == []  # another tenant's cache
    # Not in the tree: the sequence's own tokens.
    assert drafter.propose(encode_tokens([4, 4, 5, 6, 1, 4, 5, 6]), "a", 3) == [1, 4, 5]
    assert (drafter.from_tree, drafter.from_context) == (1, 1)
    assert drafter.propose(encode_tokens([1, 2, 3]), "a", 0) == []


def test_adaptive_k_grows_on_accepted_drafts_and_shrinks_on_rejections() -> None:
    k = AdaptiveK(8)
    assert k.get(1) == 8
    k.update(1, 8, 2)  # 2 of 8 accepted: draft 3 next
    assert k.get(1) == 3
    k.update(1, 3, 0)  # rejected from the first token: wait 2 steps, then draft 1
    assert [k.get(1) for _ in range(3)] == [0, 0, 1]
    k.update(1, 1, 1)  # accepted whole: double
    assert k.get(1) == 2
    k.update(1, 2, 2)
    k.update(1, 4, 4)
    k.update(1, 8, 8)
    assert k.get(1) == 8  # capped at the limit
    k.update(2, 5, 1)
    k.keep_only({2})
    assert len(k) == 1 and k.get(1) == 8 and k.get(2) == 2


def test_drafts_rejected_in_a_row_back_off_until_one_token_is_accepted() -> None:
    k = AdaptiveK(8)
    waits = []
    for _ in range(7):
        k.update(1, k.get(1) or 1, 0)
        waited = 0
        while k.get(1) == 0:
            waited += 1
        waits.append(waited)
    assert waits == [2, 4, 8, 16, 32, 32, 32]  # doubling, capped at MAX_WAIT
    k.update(1, 1, 1)  # the streak ends: the next miss waits 2 steps again
    k.update(1, k.get(1), 0)
    assert [k.get(1) for _ in range(3)] == [0, 0, 1]
    k.update(3, 4, 0)
    k.keep_only({1})
    assert k.get(3) == 8  # a forgotten sequence starts afresh


def test_speculative_tokens_is_a_serve_flag() -> None:
    parser = argparse.ArgumentParser()
    server_main.add_arguments(parser)
    default = EngineConfig().speculative_tokens
    assert engine_config(parser.parse_args([])).speculative_tokens == default
    assert engine_config(parser.parse_args(["--speculative-tokens", "5"])).speculative_tokens == 5
    assert engine_config(parser.parse_args(["--speculative-tokens", "0"])).speculative_tokens == 0
    with pytest.raises(ValueError, match="speculative_tokens must be in"):
        engine_config(parser.parse_args(["--speculative-tokens", "-1"]))
