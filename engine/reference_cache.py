"""A content-keyed LRU cache of prepared references, bounded in entries and in bytes.

The key is what the features depend on (spec §4, STYLE.md rule 9): the sha256 of the reference
audio bytes (and of each auxiliary clip), the prompt text and language, and the identity of the
model set. A path never is part of the key, so an edited file is a new entry and two users' clips
never collide. The cache is owned by whoever builds it (a :class:`~engine.pipeline.Studio` or a
single :class:`~engine.pipeline.VoiceCloner`); it is thread-safe, and concurrent requests for the
same key compute the value once.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

log = logging.getLogger(__name__)

V = TypeVar("V")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_bytes(obj: Any) -> int:
    """Bytes held by the tensors / numpy arrays inside ``obj`` (dataclasses, tuples, lists, dicts)."""
    seen: set[int] = set()

    def walk(o: Any) -> int:
        if isinstance(o, torch.Tensor):
            if id(o) in seen:
                return 0
            seen.add(id(o))
            return o.numel() * o.element_size()
        if hasattr(o, "nbytes") and hasattr(o, "dtype"):  # numpy array
            return int(o.nbytes)
        if isinstance(o, (list, tuple)):
            return sum(walk(x) for x in o)
        if isinstance(o, dict):
            return sum(walk(x) for x in o.values())
        if hasattr(o, "__dataclass_fields__"):
            return sum(walk(getattr(o, f)) for f in o.__dataclass_fields__)
        return 0

    return walk(obj)


@dataclass(frozen=True)
class ReferenceKey:
    """What a prepared reference depends on."""

    audio_sha256: str  # main clip bytes
    prompt_text: str  # transcript as given ("" = reference-free)
    prompt_lang: str
    model_id: str  # the SoVITS/BERT/HuBERT set (and device) the features were computed with
    aux_sha256: tuple[str, ...] = ()  # auxiliary clips, in order


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int


class ReferenceCache(Generic[V]):
    """LRU of prepared references; ``max_entries`` and ``max_bytes`` bound it (0 disables caching)."""

    def __init__(self, max_entries: int = 64, max_bytes: int = 512 << 20,
                 size_of: Callable[[Any], int] = tensor_bytes) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._building: dict[Hashable, threading.Lock] = {}
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    @property
    def nbytes(self) -> int:
        return self._bytes

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self.hits, self.misses, self.evictions, len(self._items), self._bytes)

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, value: V) -> None:
        size = self._size_of(value)
        with self._lock:
            if key in self._items:
                self._bytes -= self._items.pop(key)[1]
            if self.max_entries == 0 or size > self.max_bytes:
                return  # too big to keep: the caller still has its value
            self._items[key] = (value, size)
            self._bytes += size
            self._evict_locked(self.max_entries, self.max_bytes)

    def get_or_create(self, key: Hashable, build: Callable[[], V]) -> tuple[V, bool]:
        """The cached value, or ``build()`` stored under ``key``; returns ``(value, was_hit)``.

        Concurrent callers with the same key wait for one build. A failing build stores nothing.
        """
        value = self.get(key)
        if value is not None:
            with self._lock:
                self.hits += 1
            return value, True
        with self._lock:
            gate = self._building.setdefault(key, threading.Lock())
        with gate:
            value = self.get(key)
            if value is not None:
                with self._lock:
                    self.hits += 1
                return value, True
            with self._lock:
                self.misses += 1
            try:
                value = build()
                self.put(key, value)
            finally:
                with self._lock:
                    self._building.pop(key, None)
        return value, False

    def shrink(self, fraction: float = 0.5) -> int:
        """Drop the least recently used entries until at most ``fraction`` of the bytes remain."""
        with self._lock:
            before = self._bytes
            self._evict_locked(self.max_entries, int(self._bytes * fraction))
            return before - self._bytes

    def clear(self) -> int:
        with self._lock:
            freed = self._bytes
            self.evictions += len(self._items)
            self._items.clear()
            self._bytes = 0
            return freed

    def _evict_locked(self, max_entries: int, max_bytes: int) -> None:
        while self._items and (len(self._items) > max_entries or self._bytes > max_bytes):
            key, (_, size) = self._items.popitem(last=False)
            self._bytes -= size
            self.evictions += 1
            log.debug("reference cache: evicted %s (%d bytes)", key, size)
