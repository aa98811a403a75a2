"""Prefix cache and KV block accounting: LRU eviction, pinning, matching, usage."""

from __future__ import annotations

import pytest

from controller.sim.cache import PrefixCache


def _cache(total: int = 100) -> PrefixCache:
    return PrefixCache(total, block_size=16, unit_tokens=64)  # 4 blocks per unit


def test_unit_is_whole_kv_blocks():
    assert PrefixCache(10, 16, 512).unit_blocks == 32
    assert PrefixCache(10, 16, 100).unit_blocks == 7  # ceil: a partial KV block still takes a block


def test_match_is_a_leading_run():
    c = _cache()
    assert c.allocate(12)
    c.insert_owned([1, 2, 3])
    assert c.match([1, 2, 3, 4], 10) == 3
    assert c.match([1, 9, 3], 10) == 1  # a miss ends the match even if later units are cached
    assert c.match([9, 1, 2], 10) == 0
    assert c.match([1, 2, 3], 2) == 2


def test_eviction_is_lru_and_tail_first():
    c = _cache(total=24)  # room for 6 units
    c.allocate(12)
    c.insert_owned([1, 2, 3])  # request A's prompt
    c.allocate(12)
    c.insert_owned([7, 8, 9])  # request B's prompt
    c.unpin([1, 2, 3])  # A finishes first: its units become evictable, last unit first
    c.unpin([7, 8, 9])
    assert c.lru_order() == [3, 2, 1, 9, 8, 7]
    c.pin([1])  # a new request reuses A's first unit: it leaves the LRU list
    c.unpin([1])  # ...and comes back as most recently used
    assert c.lru_order() == [3, 2, 9, 8, 7, 1]
    assert c.allocate(8)  # needs two units' worth: evicts 3 then 2
    assert 3 not in c and 2 not in c and 1 in c and 9 in c
    assert c.evictions == 2
    c.check()


def test_pinned_units_are_never_evicted_and_failed_allocation_changes_nothing():
    c = _cache(total=16)
    c.allocate(8)
    c.insert_owned([1, 2])  # pinned
    c.allocate(8)
    c.insert_owned([3, 4])
    c.unpin([3, 4])  # evictable
    assert c.available_blocks == 8
    before = (c.free_blocks, c.cached_blocks, c.pinned_blocks, c.lru_order())
    assert not c.allocate(9)  # more than free + evictable
    assert (c.free_blocks, c.cached_blocks, c.pinned_blocks, c.lru_order()) == before
    assert c.allocate(8)
    assert 1 in c and 2 in c and 3 not in c and 4 not in c
    c.check()


def test_duplicate_insert_frees_the_copy():
    c = _cache(total=20)
    c.allocate(4)
    c.insert_owned([5])
    c.allocate(4)  # a second request computed the same unit meanwhile
    assert c.insert_owned([5]) == 4
    assert c.cached_blocks == 4 and c.free_blocks == 16
    c.unpin([5])
    assert c.lru_order() == []  # still referenced once
    c.unpin([5])
    assert c.lru_order() == [5]
    c.check()


@pytest.mark.parametrize("owned,pinned_units,cached_units,want", [
    (0, 0, 0, 0.0),
    (10, 0, 0, 0.10),
    (10, 2, 0, 0.18),  # pinned unit blocks count as used
    (10, 0, 2, 0.10),  # unreferenced cached blocks count as free (vLLM's free queue)
])
def test_usage_counts_referenced_blocks_only(owned, pinned_units, cached_units, want):
    c = _cache(total=100)
    c.allocate(owned)
    for u in range(pinned_units):
        c.allocate(4)
        c.insert_owned([100 + u])
    for u in range(cached_units):
        c.allocate(4)
        c.insert_owned([200 + u])
        c.unpin([200 + u])
    assert c.usage_frac == pytest.approx(want)


def test_disabled_cache_never_matches():
    c = PrefixCache(100, 16, 64, enabled=False)
    c.allocate(4)
    c.insert_owned([1])
    assert c.match([1], 5) == 0


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="total_blocks"):
        PrefixCache(0, 16, 64)
    with pytest.raises(ValueError, match="block_size"):
        PrefixCache(10, 0, 64)
