"""ReferenceCache (LRU by entries and bytes, content keys, one build per key) and the memory watermark
(with faked memory readings)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from engine.memory import MemoryGuard, MemoryPressureError, MemoryReading
from engine.options import EngineSettings
from engine.reference_cache import ReferenceCache, ReferenceKey, tensor_bytes


def key(i: int) -> ReferenceKey:
    return ReferenceKey(f"{i:064x}", "text.", "en", "model")


def value(n_floats: int) -> torch.Tensor:
    return torch.zeros(n_floats)  # 4 bytes each


def test_key_is_content_not_identity():
    assert ReferenceKey("a" * 64, "t", "en", "m") == ReferenceKey("a" * 64, "t", "en", "m")
    assert ReferenceKey("a" * 64, "t", "en", "m") != ReferenceKey("a" * 64, "t", "zh", "m")
    assert ReferenceKey("a" * 64, "t", "en", "m") != ReferenceKey("a" * 64, "t", "en", "m2")
    assert ReferenceKey("a" * 64, "t", "en", "m", ("b" * 64,)) != ReferenceKey("a" * 64, "t", "en", "m")


def test_lru_bounded_in_entries():
    cache = ReferenceCache(max_entries=2, max_bytes=1 << 30)
    cache.put(key(1), value(1))
    cache.put(key(2), value(1))
    assert cache.get(key(1)) is not None  # 1 becomes most recent
    cache.put(key(3), value(1))
    assert key(2) not in cache and key(1) in cache and key(3) in cache
    assert cache.stats().evictions == 1 and len(cache) == 2


def test_lru_bounded_in_bytes():
    cache = ReferenceCache(max_entries=100, max_bytes=100)
    cache.put(key(1), value(10))  # 40 bytes
    cache.put(key(2), value(10))
    assert cache.nbytes == 80
    cache.put(key(3), value(10))  # 120 > 100: the oldest goes
    assert key(1) not in cache and cache.nbytes == 80
    cache.put(key(4), value(1000))  # larger than the whole budget: not kept, nothing else lost
    assert key(4) not in cache and len(cache) == 2


def test_tensor_bytes_counts_nested_tensors_once():
    t = torch.zeros(10)
    assert tensor_bytes({"a": t, "b": [t, torch.zeros(5, dtype=torch.float16)]}) == 40 + 10


def test_get_or_create_hits_misses_and_single_build():
    cache = ReferenceCache(max_entries=4, max_bytes=1 << 20)
    calls = []
    gate = threading.Event()

    def build():
        calls.append(1)
        gate.wait(5)
        return value(4)

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get_or_create(key(1), build))) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    gate.set()
    for t in threads:
        t.join()
    assert len(calls) == 1  # concurrent requests for one reference prepare it once
    assert sorted(hit for _, hit in results) == [False, True, True, True]
    s = cache.stats()
    assert (s.hits, s.misses, s.entries) == (3, 1, 1)


def test_failed_build_stores_nothing():
    cache = ReferenceCache()

    def boom():
        raise ValueError("bad clip")

    with pytest.raises(ValueError):
        cache.get_or_create(key(1), boom)
    assert len(cache) == 0 and cache.nbytes == 0
    v, hit = cache.get_or_create(key(1), lambda: value(2))
    assert not hit and v.numel() == 2


def test_shrink_and_disabled_cache():
    cache = ReferenceCache(max_entries=10, max_bytes=1 << 20)
    for i in range(4):
        cache.put(key(i), value(25))  # 100 bytes each
    assert cache.shrink(0.5) == 200 and len(cache) == 2 and key(3) in cache
    off = ReferenceCache(max_entries=0)
    off.put(key(1), value(1))
    assert len(off) == 0


# ---- memory watermark ------------------------------------------------------------------------


class FakeMemory:
    """Readings that fall as caches shrink (or as time passes)."""

    def __init__(self, used: list[int], total: int = 100):
        self.used, self.total, self.calls = list(used), total, 0

    def __call__(self, device: str) -> MemoryReading:
        self.calls += 1
        value = self.used[0] if len(self.used) == 1 else self.used.pop(0)
        return MemoryReading(value, self.total)


def test_below_watermark_admits_without_shrinking():
    guard = MemoryGuard(EngineSettings(memory_watermark=0.8), FakeMemory([50]))
    shrunk = []
    guard.add_shrinker("cache", lambda: shrunk.append(1) or 0)
    a = guard.admit("cuda:0")
    assert (a.device, a.action) == ("cuda:0", "ok") and not shrunk


def test_caches_shrink_first_in_order(caplog):
    reader = FakeMemory([95, 90, 70])  # over; still over after the first shrink; fine after the second
    guard = MemoryGuard(EngineSettings(memory_watermark=0.8), reader)
    order = []
    guard.add_shrinker("reference cache", lambda: order.append("refs") or 10)
    guard.add_shrinker("model pool", lambda: order.append("models") or 20)
    with caplog.at_level(logging.WARNING, logger="engine.memory"):
        a = guard.admit("cuda:0")
    assert (a.device, a.action) == ("cuda:0", "shrunk") and order == ["refs", "models"]
    assert guard.decisions["shrunk"] == 1
    assert "reference cache" in caplog.text and "model pool" in caplog.text


def test_then_degrades_to_cpu_and_logs(caplog):
    guard = MemoryGuard(EngineSettings(memory_watermark=0.8, on_memory_pressure="cpu"), FakeMemory([99]))
    guard.add_shrinker("cache", lambda: 0)
    with caplog.at_level(logging.WARNING, logger="engine.memory"):
        a = guard.admit("cuda:0")
    assert (a.device, a.action) == ("cpu", "cpu") and guard.decisions["cpu"] == 1
    assert "running this request on the CPU" in caplog.text


def test_wait_policy_waits_for_memory():
    sleeps = []
    reader = FakeMemory([99, 99, 99, 99, 50])
    guard = MemoryGuard(EngineSettings(memory_watermark=0.8, on_memory_pressure="wait", memory_wait_seconds=10),
                        reader, sleep=sleeps.append, poll_seconds=1.0)
    a = guard.admit("cuda:0")
    assert a.action == "waited" and a.device == "cuda:0" and len(sleeps) == 4  # one reading before, four while waiting


def test_wait_policy_gives_up_and_refuse_policy_refuses():
    guard = MemoryGuard(EngineSettings(memory_watermark=0.8, on_memory_pressure="wait", memory_wait_seconds=3),
                        FakeMemory([99]), sleep=lambda s: None, poll_seconds=1.0)
    with pytest.raises(MemoryPressureError, match="retry"):
        guard.admit("cuda:0")
    refuse = MemoryGuard(EngineSettings(memory_watermark=0.8, on_memory_pressure="refuse"), FakeMemory([99]))
    with pytest.raises(MemoryPressureError):
        refuse.admit("mps")
    cpu = MemoryGuard(EngineSettings(memory_watermark=0.8, on_memory_pressure="cpu"), FakeMemory([99]))
    with pytest.raises(MemoryPressureError):  # already on the CPU: nowhere to degrade to
        cpu.admit("cpu")
    assert cpu.decisions["refused"] == 1


def test_unknown_memory_never_blocks():
    guard = MemoryGuard(EngineSettings(memory_watermark=0.1), lambda d: MemoryReading(0, 0))
    assert guard.admit("cpu").action == "ok"
