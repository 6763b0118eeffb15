"""Whether a running engine is ready: ``starting`` while its warm-up runs (:mod:`engine.warmup`), then
``ready``, or ``degraded`` when the warm-up failed (``error`` says why: a model set that did not load, a slot
pool that could not be allocated). The HTTP ``/health`` reports it, with the reason."""

from __future__ import annotations

import threading
import time


class Readiness:
    """``starting`` until :meth:`finish`, then ``ready`` (``degraded`` when it finished with an error).
    Thread-safe; one per server."""

    def __init__(self, ready: bool = False) -> None:
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.seconds: float | None = 0.0 if ready else None  # how long the warm-up took
        self.error = ""  # why the warm-up failed ("" when it did not)
        if ready:
            self._done.set()

    @property
    def status(self) -> str:
        if not self._done.is_set():
            return "starting"
        return "degraded" if self.error else "ready"

    @property
    def done(self) -> bool:
        """The warm-up has ended (whether or not it failed)."""
        return self._done.is_set()

    def finish(self, error: str = "") -> None:
        with self._lock:
            self.error = error
            self.seconds = round(time.monotonic() - self.started, 3)
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)
