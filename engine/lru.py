"""A thread-safe LRU map bounded in entries and in bytes, whose values are built once per key.

Used by the reference cache (prepared references) and the model pool (loaded networks): both keep
values that are expensive to build, evict the least recently used ones past a budget, and must not
build the same key twice when requests arrive together.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    """LRU of ``key -> value`` bounded by ``max_entries`` (None: no limit) and ``max_bytes``.

    ``size_of(value)`` gives each value's bytes. ``get_or_build`` runs ``build()`` at most once per
    key at a time: concurrent callers with the same key wait for the first one's result. Keys in a
    ``keep`` collection are never evicted by that call; a value that can never fit the bounds is
    not stored unless its key is kept. Counters: ``hits``, ``misses`` (builds started), ``builds``
    (builds that returned), ``evictions``.
    """

    def __init__(self, max_entries: int | None = None, max_bytes: int | None = None,
                 size_of: Callable[[V], int] = lambda value: 0, name: str = "cache",
                 log_level: int = logging.DEBUG) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._name = name
        self._log_level = log_level
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._building: dict[K, threading.Lock] = {}
        self.hits = self.misses = self.builds = self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: K) -> bool:
        with self._lock:
            return key in self._items

    @property
    def nbytes(self) -> int:
        return self._bytes

    def keys(self) -> list[K]:
        """Keys from least to most recently used."""
        with self._lock:
            return list(self._items)

    def get(self, key: K) -> V | None:
        """The value (marked as recently used), or None; counts nothing."""
        with self._lock:
            return self._touch_locked(key)

    def put(self, key: K, value: V, keep: Collection[K] = ()) -> bool:
        """Store ``value`` (replacing an older one) and evict past the bounds; False if not stored."""
        size = self._size_of(value)
        with self._lock:
            if key in self._items:
                self._bytes -= self._items.pop(key)[1]
            if key not in keep and (self.max_entries == 0 or size > self._limit(self.max_bytes)):
                return False  # can never fit: the caller keeps its value, the cache keeps the others
            self._items[key] = (value, size)
            self._bytes += size
            self._evict_locked(self.max_entries, self.max_bytes, keep)
            return True

    def get_or_build(self, key: K, build: Callable[[], V], keep: Collection[K] = ()) -> tuple[V, bool]:
        """The cached value, or ``build()`` stored under ``key``; returns ``(value, was_hit)``.

        A failing build stores nothing and raises to its caller; waiting callers then build again.
        """
        with self._lock:
            value = self._touch_locked(key)
            if value is not None:
                self.hits += 1
                return value, True
            gate = self._building.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                value = self._touch_locked(key)
                if value is not None:
                    self.hits += 1
                    return value, True
                self.misses += 1
            try:
                value = build()
                with self._lock:
                    self.builds += 1
                self.put(key, value, keep)
            finally:
                with self._lock:
                    self._building.pop(key, None)
        return value, False

    def evict(self, max_bytes: int, keep: Collection[K] = ()) -> int:
        """Drop least recently used values (except ``keep``) until at most ``max_bytes`` remain; bytes freed."""
        with self._lock:
            before = self._bytes
            self._evict_locked(self.max_entries, max_bytes, keep)
            return before - self._bytes

    def shrink(self, fraction: float = 0.5) -> int:
        """Drop least recently used values until at most ``fraction`` of the bytes remain; bytes freed."""
        return self.evict(int(self._bytes * fraction))

    def evict_where(self, drop: Callable[[K, V], bool]) -> int:
        """Drop every value for which ``drop(key, value)`` is true; bytes freed."""
        with self._lock:
            before = self._bytes
            for key, (value, size) in list(self._items.items()):
                if drop(key, value):
                    del self._items[key]
                    self._bytes -= size
                    self.evictions += 1
            return before - self._bytes

    def clear(self) -> int:
        """Drop everything; bytes freed."""
        with self._lock:
            freed = self._bytes
            self.evictions += len(self._items)
            self._items.clear()
            self._bytes = 0
            return freed

    # ---- internals (call with the lock held) -------------------------------------------------
    @staticmethod
    def _limit(bound: int | None) -> float:
        return math.inf if bound is None else bound

    def _touch_locked(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def _evict_locked(self, max_entries: int | None, max_bytes: int | None, keep: Collection[K]) -> None:
        entries, nbytes = self._limit(max_entries), self._limit(max_bytes)
        for key in list(self._items):
            if len(self._items) <= entries and self._bytes <= nbytes:
                break
            if key in keep:
                continue
            _, size = self._items.pop(key)
            self._bytes -= size
            self.evictions += 1
            log.log(self._log_level, "%s: evicted %s (%d bytes)", self._name, key, size)
