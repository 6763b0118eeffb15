"""Device work against CUDA graph capture: a readers-writer gate owned by one engine (one device).

A CUDA graph capture is invalidated when another thread runs device work, or calls an API a capture
forbids, while it records (``cudaErrorStreamCaptureInvalidated``), and a failed capture can leave the
capturing stream unusable. So every stage that launches device work from its own thread (a decode step,
an acoustic round, reference preparation, BERT features) runs inside :meth:`DeviceGate.work`, and a
capture runs inside :meth:`DeviceGate.capture`, which waits until no work is in flight and holds new work
back until it ends. Captures prefer to happen during warm-up, before a server says it is ready
(:meth:`engine.serving.Scheduler.capture_graphs`); the gate makes a later one (a model set loaded while
serving, a rebuilt decoder) safe too.

Work sections are cheap (a lock and a counter) and may nest on one thread; a thread inside a work
section must not ask for a capture (it would wait for itself), which :meth:`capture` refuses.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class DeviceGate:
    """Shared sections for device work, exclusive ones for graph capture (writers first)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._working = 0  # work sections in flight
        self._capturing = False
        self._waiting_captures = 0
        self._local = threading.local()
        self.captures = 0  # captures run through this gate (for tests and metrics)

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    @contextmanager
    def work(self) -> Iterator[None]:
        """A section of device work; waits while a capture runs or is waiting for its turn."""
        depth = self._depth()
        if depth:  # nested on this thread: already counted
            self._local.depth = depth + 1
            try:
                yield
            finally:
                self._local.depth = depth
            return
        with self._cv:
            while self._capturing or self._waiting_captures:
                self._cv.wait()
            self._working += 1
        self._local.depth = 1
        try:
            yield
        finally:
            self._local.depth = 0
            with self._cv:
                self._working -= 1
                if not self._working:
                    self._cv.notify_all()

    @contextmanager
    def capture(self) -> Iterator[None]:
        """An exclusive section: no other work runs on the device while it is held."""
        if self._depth():
            raise RuntimeError("a graph capture was asked for inside a device work section of the same thread")
        with self._cv:
            self._waiting_captures += 1
            try:
                while self._capturing or self._working:
                    self._cv.wait()
            finally:
                self._waiting_captures -= 1
            self._capturing = True
        try:
            yield
        finally:
            with self._cv:
                self._capturing = False
                self.captures += 1
                self._cv.notify_all()

    @property
    def busy(self) -> bool:
        """Whether any work section or capture is in flight now."""
        with self._cv:
            return bool(self._working or self._capturing)
