"""A request inside the scheduler: its sentences (featurised ahead, off the decode loop), the pieces
of audio made for it, and the iterator of results its caller reads.

Responsibilities: (1) hand the scheduler the request's next readable sentence, (2) turn the pieces
the acoustic stage produces into :class:`engine.results.Result` objects in order, for one consumer
thread, and (3) cancel: closing the results iterator tells the scheduler, which frees the slot at
its next step.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Piece:
    """One piece of a request's audio, in order."""

    audio: np.ndarray  # float32 (n,)
    sentence: Any  # engine.cloner._Sentence
    tokens: tuple[int, ...]
    kind: str  # "speech" or "silence"
    ends_sentence: bool


class Request:
    """One synthesis request: sentence texts featurised on ``executor``, results for one reader."""

    def __init__(self, texts: list[str], featurise: Callable[[int, str], Any], first: Any, executor: Executor,
                 context: Any, on_progress: Callable[[int, int], None] | None = None) -> None:
        self.texts, self.context, self.on_progress = texts, context, on_progress
        self._featurise, self._executor = featurise, executor
        self._features: dict[int, Future] = {}
        done: Future = Future()
        done.set_result(first)
        self._features[first.index] = done
        self._lock = threading.Condition()
        self._pieces: deque[Piece] = deque()
        self._finished = False
        self._error: BaseException | None = None
        self.cancelled = False
        self.on_cancel: Callable[[Request], None] | None = None
        self.on_first_voiced: Callable[[Request], None] | None = None
        self.first = first
        self.started = time.monotonic()
        self.first_due: float | None = None  # when the first token chunk went to the acoustic stage
        self.first_voiced: float | None = None  # when the first piece of audio was ready

    # ---- sentences (scheduler side) -----------------------------------------------------------
    def feature(self, index: int) -> Future:
        """The features of sentence ``index`` (None when it has no phones), computed once, ahead."""
        with self._lock:
            f = self._features.get(index)
            if f is None:
                f = self._executor.submit(self._featurise, index, self.texts[index])
                self._features[index] = f
            return f

    def next_sentence(self, after: int, callback: Callable[[Any, BaseException | None], None]) -> None:
        """Call ``callback(sentence or None, error)`` with the first readable sentence after ``after``."""
        j = after + 1
        if j >= len(self.texts) or self.cancelled:
            callback(None, None)
            return

        def done(f: Future) -> None:
            try:
                s = f.result()
            except BaseException as e:  # noqa: BLE001 - handed to the request's reader
                callback(None, e)
                return
            if s is None:
                self.next_sentence(j, callback)
            else:
                callback(s, None)

        self.feature(j).add_done_callback(done)

    def has_more_after(self, index: int) -> bool:
        """Whether a readable sentence follows ``index`` (waits for its features)."""
        for j in range(index + 1, len(self.texts)):
            if self.feature(j).result() is not None:
                return True
        return False

    # ---- output (acoustic side) ---------------------------------------------------------------
    def put(self, piece: Piece) -> None:
        if self.first_voiced is None:
            self.first_voiced = time.monotonic()
            if self.on_first_voiced is not None:
                self.on_first_voiced(self)
        with self._lock:
            self._pieces.append(piece)
            self._lock.notify_all()

    def finish(self, error: BaseException | None = None) -> None:
        with self._lock:
            if not self._finished:
                self._finished, self._error = True, error
            self._lock.notify_all()

    def cancel(self) -> None:
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            self._pieces.clear()
            self._lock.notify_all()
        if self.on_cancel is not None:
            self.on_cancel(self)

    @property
    def finished(self) -> bool:
        return self._finished

    def pieces(self) -> Iterator[Piece]:
        """The pieces in order as they come (blocks); raises the request's error; cancels when closed."""
        try:
            while True:
                with self._lock:
                    while not self._pieces and not self._finished:
                        self._lock.wait()
                    if self._pieces:
                        piece = self._pieces.popleft()
                    elif self._error is not None:
                        raise self._error
                    else:
                        return
                yield piece
        finally:
            if not self._finished:
                self.cancel()
