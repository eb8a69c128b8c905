"""The block keys of recent prompts, kept by the ids' identity: the same array is not hashed again, a
new array (even at a reused address) is, and the bound drops the least recently used first."""

from __future__ import annotations

import gc
from array import array

import pytest

from gateway.fleet.kvevents.chains import ChainCache
from gateway.policy.blockkeys import chain_keys

pytestmark = pytest.mark.unit


def test_the_keys_are_the_prompts_block_keys_without_its_last_token() -> None:
    cache = ChainCache()
    ids = array("I", range(9))
    assert cache.keys(ids, 4) == chain_keys(list(range(8)), 4)
    assert len(cache.keys(ids, 4)) == 2
    assert cache.keys(ids, 2) == chain_keys(list(range(8)), 2)  # each block size its own
    assert cache.keys(array("I", range(8)), 4) == chain_keys(list(range(7)), 4)  # 7 ids: one block


def test_the_same_array_is_not_hashed_again_and_a_new_one_is() -> None:
    cache = ChainCache()
    ids = array("I", range(100))
    first = cache.keys(ids, 4)
    assert cache.keys(ids, 4) is first and len(cache) == 1
    other = array("I", [7, *range(1, 100)])
    assert cache.keys(other, 4)[0] != first[0]
    # An array freed and a new one made in its place (CPython reuses the address): not the old keys.
    addresses = {id(ids)}
    del ids
    gc.collect()
    for _ in range(50):
        fresh = array("I", [9] * 100)
        if id(fresh) in addresses:
            break
    assert cache.keys(fresh, 4) == chain_keys([9] * 99, 4)


def test_a_list_is_hashed_every_time_and_not_kept() -> None:
    cache = ChainCache()
    ids = list(range(9))
    assert cache.keys(ids, 4) == chain_keys(ids[:-1], 4)
    assert len(cache) == 0 and cache.held == 0


def test_the_bound_drops_the_least_recently_used_first() -> None:
    cache = ChainCache(max_keys=5)
    a, b, c = (array("I", [n] * 9) for n in (1, 2, 3))
    ka = cache.keys(a, 4)
    kb = cache.keys(b, 4)
    assert cache.held == 4
    assert cache.keys(a, 4) is ka  # a is now the more recent
    cache.keys(c, 4)  # 6 keys: b goes
    assert cache.held == 4 and len(cache) == 2
    assert cache.keys(a, 4) is ka
    assert cache.keys(b, 4) is not kb and cache.keys(b, 4) == kb
