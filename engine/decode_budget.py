"""One memory budget for decoding audio in a process, shared by every request and every door (the API, the
page, saved voices).

Each read checks its own clip before decoding (:mod:`engine.audio`: at most 2^25 samples, 128 MiB of
float32), but eight parallel uploads of a maximal clip each passed that check and grew a server by 1.5 GB.
:func:`engine.audio.read_audio` therefore reserves the bytes of the array it is about to fill here, before
allocating it, and gives them back when the read returns. A read that does not fit beside the ones under
way is refused at once with :class:`DecodeBudgetError` (a :class:`~engine.errors.BusyError`: HTTP 503 with
``Retry-After``), never queued in memory; one that would not fit even alone is a ReferenceAudioError (400).

The budget must be one per process, whatever builds the engine or the server, so :func:`process_decode_budget`
makes it on first use (never at import) and returns the same object after; a server sets its size from its
limits (``ServerLimits.decode_budget_bytes``, ``--decode-budget-mb``) with :meth:`DecodeBudget.resize`.
Tests and embedders may pass their own :class:`DecodeBudget` to ``read_audio``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from engine.errors import BusyError, ReferenceAudioError

MIB = 1 << 20
DEFAULT_DECODE_BUDGET_BYTES = 256 * MIB  # two maximal clips (128 MiB each) decoding at once, or hundreds of
# ordinary references (a 10 s stereo 48 kHz clip is 3.7 MiB)


class DecodeBudgetError(BusyError):
    """Decoding this clip now would take the process over its decoding budget; retry in a moment."""


class DecodeBudget:
    """Bytes of decoded audio the process holds in reads under way, at most ``max_bytes``. Thread-safe."""

    def __init__(self, max_bytes: int = DEFAULT_DECODE_BUDGET_BYTES, retry_after: float = 1.0) -> None:
        self.retry_after = retry_after
        self._lock = threading.Lock()
        self._in_use = 0
        self.max_bytes = self._checked(max_bytes)
        self.refused = 0  # reads refused so far
        self.peak = 0  # the most bytes held at once

    @staticmethod
    def _checked(max_bytes: int) -> int:
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
            raise ValueError(f"a decoding budget must be a positive number of bytes, got {max_bytes!r}")
        return max_bytes

    @property
    def in_use(self) -> int:
        return self._in_use

    def resize(self, max_bytes: int) -> None:
        """A new bound; reads under way keep what they hold (new ones wait for room under the new bound)."""
        with self._lock:
            self.max_bytes = self._checked(max_bytes)

    @contextmanager
    def reserve(self, nbytes: int, what: str = "the clip") -> Iterator[None]:
        """Hold ``nbytes`` for the ``with`` block, or raise DecodeBudgetError at once when they do not fit."""
        nbytes = max(0, int(nbytes))
        with self._lock:
            if self._in_use + nbytes > self.max_bytes:
                self.refused += 1
                held = self._in_use
                alone = nbytes > self.max_bytes
            else:
                self._in_use += nbytes
                self.peak = max(self.peak, self._in_use)
                held = -1
        if held >= 0:
            if alone:  # it never fits: a retry cannot help (400, not 503)
                raise ReferenceAudioError(f"{what} would decode to {nbytes / MIB:.0f} MiB, more than this "
                                          f"server's whole decoding budget of {self.max_bytes / MIB:.0f} MiB "
                                          "(decode_budget_bytes); send a shorter clip with fewer channels")
            raise DecodeBudgetError(f"the server is decoding other clips ({held / MIB:.1f} of "
                                    f"{self.max_bytes / MIB:.0f} MiB, decode_budget_bytes); {what} needs "
                                    f"{nbytes / MIB:.1f} MiB: retry in a moment", retry_after=self.retry_after)
        try:
            yield
        finally:
            with self._lock:
                self._in_use -= nbytes


@lru_cache(maxsize=1)
def process_decode_budget() -> DecodeBudget:
    """The budget every read in this process shares (made on first use)."""
    return DecodeBudget()
