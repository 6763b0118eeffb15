"""A content-keyed LRU cache of prepared references, bounded in entries and in bytes.

The key is what the features depend on, never where they came from: the sha256 of the reference
audio bytes (and of each auxiliary clip), the prompt text and language, and the identity of the
model set. A path never is part of the key, so an edited file is a new entry and two users' clips
never collide. The cache is owned by whoever builds it (a :class:`~engine.studio.Studio` or a
single :class:`~engine.cloner.VoiceCloner`); it is thread-safe, and concurrent requests for the
same key compute the value once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from engine.lru import LRUCache

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


class ReferenceCache(LRUCache[Hashable, V]):
    """LRU of prepared references; ``max_entries`` and ``max_bytes`` bound it (0 disables caching).

    A reference too large for the byte bound is returned to its caller but not kept.
    """

    def __init__(self, max_entries: int = 64, max_bytes: int = 512 << 20,
                 size_of: Callable[[Any], int] = tensor_bytes) -> None:
        super().__init__(max_entries=max_entries, max_bytes=max_bytes, size_of=size_of, name="reference cache")

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self.hits, self.misses, self.evictions, len(self._items), self._bytes)

    def get_or_create(self, key: Hashable, build: Callable[[], V]) -> tuple[V, bool]:
        """The cached value, or ``build()`` stored under ``key``; returns ``(value, was_hit)``.

        Concurrent callers with the same key wait for one build. A failing build stores nothing.
        """
        return self.get_or_build(key, build)
