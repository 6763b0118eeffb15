"""engine.lru.LRUCache: the parts its two users (reference cache, model pool) rely on beyond plain LRU:
kept keys survive eviction and may exceed the byte bound; no entry limit when max_entries is None."""

from __future__ import annotations

from engine.lru import LRUCache


def sized() -> LRUCache[str, int]:
    return LRUCache(max_bytes=100, size_of=lambda v: v)  # a value is its own size in bytes


def test_kept_keys_survive_eviction_and_may_exceed_the_budget():
    cache = sized()
    assert cache.put("a", 60) and cache.put("b", 30)
    assert cache.put("big", 150, keep={"big", "a"})  # over budget alone, but kept
    assert cache.keys() == ["a", "big"] and cache.nbytes == 210 and cache.evictions == 1
    assert cache.evict(150) == 60 and cache.keys() == ["big"]  # nothing kept now: LRU order again
    assert not cache.put("huge", 500)  # not kept and can never fit: refused, the others stay
    assert cache.keys() == ["big"]


def test_no_entry_limit_by_default_and_counters():
    cache = sized()
    for i in range(50):
        cache.put(str(i), 1)
    assert len(cache) == 50
    built = []
    assert cache.get_or_build("x", lambda: built.append(1) or 5) == (5, False)
    assert cache.get_or_build("x", lambda: built.append(1) or 5) == (5, True)
    assert (cache.hits, cache.misses, cache.builds, len(built)) == (1, 1, 1, 1)
    assert cache.clear() == 55 and len(cache) == 0


def test_evict_where_drops_exactly_the_chosen_values():
    cache = sized()
    for key, size in (("a", 10), ("b", 20), ("c", 30)):
        cache.put(key, size)
    assert cache.evict_where(lambda key, value: key != "b") == 40
    assert cache.keys() == ["b"] and cache.nbytes == 20 and cache.evictions == 2
