"""BlockPool and the KV memory model."""

from __future__ import annotations

import pytest

from radixd.radix import (
    LLAMA2_70B,
    LLAMA3_8B,
    LLAMA3_70B,
    NULL_BLOCK,
    BlockPool,
    DoubleFree,
    InvalidRequest,
    KVSpec,
    OutOfBlocks,
)


def test_allocate_hands_out_distinct_blocks_never_the_null_block() -> None:
    pool = BlockPool(9, 4)
    got = pool.allocate(8)
    assert sorted(got) == list(range(1, 9)) and NULL_BLOCK not in got
    assert all(pool.refcount(b) == 1 for b in got)
    assert pool.num_free == 0 and pool.num_in_use == 8


def test_free_at_zero_and_lifo_reuse() -> None:
    pool = BlockPool(8, 4)
    a, b = pool.allocate(2)
    pool.incref(a)
    assert pool.decref(a) is False and pool.refcount(a) == 1
    assert pool.decref(a) is True and pool.refcount(a) == 0
    assert pool.allocate(1) == [a]  # most recently freed first
    assert pool.decref_all([a, b]) == 2 and pool.num_free == pool.num_usable


def test_out_of_blocks_changes_nothing_and_says_why() -> None:
    pool = BlockPool(4, 16)
    pool.allocate(1)
    with pytest.raises(OutOfBlocks, match="requested 5, only 2 free"):
        pool.allocate(5)
    assert pool.num_free == 2


def test_double_free_and_bad_ids_are_errors() -> None:
    pool = BlockPool(4, 16)
    (b,) = pool.allocate(1)
    pool.decref(b)
    with pytest.raises(DoubleFree, match=f"block {b} is already free"):
        pool.decref(b)
    with pytest.raises(InvalidRequest, match="null block"):
        pool.incref(NULL_BLOCK)
    with pytest.raises(InvalidRequest, match="out of range"):
        pool.decref(99)
    with pytest.raises(InvalidRequest, match="is free"):
        pool.incref(b)
    with pytest.raises(InvalidRequest, match="negative"):
        pool.allocate(-1)
    assert pool.allocate(0) == []


def test_pool_arguments_are_validated() -> None:
    with pytest.raises(InvalidRequest, match="num_blocks must be >= 2"):
        BlockPool(1)
    with pytest.raises(InvalidRequest, match="block_size"):
        BlockPool(8, 0)


def test_seed_kv_numbers() -> None:
    assert LLAMA3_8B.bytes_per_token == 131_072
    assert LLAMA3_70B.bytes_per_token == 327_680
    assert LLAMA2_70B.bytes_per_token == 2_621_440
    assert KVSpec(num_layers=1, num_kv_heads=8, head_dim=128).bytes_per_block_per_layer == 65_536
    assert LLAMA3_70B.bytes_per_block == 80 * 65_536  # 5.12 MiB-ish per block across 80 layers
    assert LLAMA3_8B.bytes_for_tokens(8192) == 1_073_741_824  # ~1.07 GB per 8k-token stream


def test_budget_to_blocks() -> None:
    spec = KVSpec(num_layers=32, num_kv_heads=8, head_dim=128, block_size=16)
    assert spec.bytes_per_block == 2 * 1024 * 1024
    assert spec.blocks_for_budget(8 * 2**30) == 4096
    assert spec.tokens_for_budget(8 * 2**30) == 4095 * 16  # the null block holds no tokens
    assert spec.bytes_for_tokens(17) == 2 * spec.bytes_per_block
    with pytest.raises(InvalidRequest, match="head_dim must be a positive integer"):
        KVSpec(num_layers=1, num_kv_heads=1, head_dim=0)


def test_token_keys_pack_and_validate() -> None:
    from radixd.radix import TOKEN_BYTES, TokenKey, encode_tokens, token_ids
    from radixd.radix.node import as_tokens

    key = encode_tokens([1, 2, 70000])
    assert len(key) == 3 and len(bytes(key)) == len(key.packed) == 3 * TOKEN_BYTES
    assert token_ids(key) == [1, 2, 70000]
    assert as_tokens(key) == as_tokens((1, 2, 70000)) == as_tokens([1, 2, 70000])
    assert key[-1] == 70000 and key[0] == 1 and list(key) == [1, 2, 70000]
    assert isinstance(key[:-1], type(key)) and list(key[:-1]) == [1, 2] and len(key[1:]) == 2
    assert list(key[::-1]) == [70000, 2, 1] and len(key[5:]) == 0
    with pytest.raises(IndexError):
        key[3]
    assert key == encode_tokens([1, 2, 70000]) and hash(key) == hash(key.packed) and key != key.packed
    assert repr(key[:2]) == "TokenKey([1, 2])" and token_ids(key[1:]) == [2, 70000]
    with pytest.raises(InvalidRequest, match="multiple of 4 bytes"):
        TokenKey(b"abcdef")
    with pytest.raises(InvalidRequest, match="token ids must be integers"):
        as_tokens([2**40])
    with pytest.raises(InvalidRequest, match="multiple of 4 bytes"):
        as_tokens(b"abc")
