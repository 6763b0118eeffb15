"""One request's life on the server: its id and outcome (:class:`Exchange`), the cancellation and time
limit its work obeys on a worker thread (:class:`JobControl`), and the admission that bounds how many
synthesis requests the server holds at once and drains them at shutdown (:class:`Admission`).

The guard (:mod:`studio.http.guard`) makes an Exchange per HTTP request and settles it when the request
ends, however it ends; the routes admit synthesis requests and run their work through :func:`await_work`,
which gives up on the work at once when the client leaves, the time limit passes, or the server drains
before the work started. Giving up cancels the JobControl: the worker stops at its next check and closes
the engine's iterator (the serving scheduler frees the slot within one decode step).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine.errors import BusyError, EngineError

SHUTTING_DOWN = "the server is shutting down; retry on another instance or later"

T = TypeVar("T")

# outcomes, a label of sovits_request_outcomes_total
COMPLETED = "completed"
CANCELLED = "cancelled_by_client"
FAILED_MID_STREAM = "failed_mid_stream"
REJECTED_BUSY = "rejected_busy"
UNAUTHORISED = "unauthorised"
INVALID = "invalid"  # any other 4xx: the request was wrong
TIMED_OUT = "timed_out"
FAILED = "failed"  # a 5xx answered before any audio
OUTCOMES = (COMPLETED, CANCELLED, FAILED_MID_STREAM, REJECTED_BUSY, UNAUTHORISED, INVALID, TIMED_OUT, FAILED)


class ClientGone(Exception):
    """The client closed the connection; nobody reads an answer any more."""


class DrainingError(BusyError):
    """The server is shutting down and takes no new work (503 + Retry-After: another instance may)."""


class RequestTimeoutError(EngineError, TimeoutError):
    """The request ran past the server's time limit; its work was stopped."""


class AudioLimitError(EngineError, ValueError):
    """A whole-file response would hold more audio than the server allows; its work was stopped."""


class JobCancelled(Exception):
    """Raised on the worker thread when the request behind the work is gone; never reaches a client."""


class JobControl:
    """What a worker thread checks between results: cancelled (client gone, drained, timed out) or past
    the deadline. Thread-safe; ``begin`` and ``withdraw`` decide atomically whether work ever starts."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline  # time.monotonic() value
        self._lock = threading.Lock()
        self._started = False
        self._cancelled = False
        self._cancel_work: Callable[[], None] | None = None

    def attach(self, results: Any) -> None:
        """The engine's iterator for this work: if it can be cancelled from another thread (a ``cancel()``
        method, as a scheduler's request handle has), a cancel reaches it at once, not at the next result."""
        cancel = getattr(results, "cancel", None)
        if callable(cancel):
            with self._lock:
                self._cancel_work = cancel
                now = self._cancelled
            if now:
                cancel()

    @property
    def started(self) -> bool:
        return self._started

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def begin(self) -> None:
        """Called by the worker before any work: raises JobCancelled if the request is already gone."""
        with self._lock:
            if self._cancelled:
                raise JobCancelled()
            self._started = True

    def withdraw(self) -> bool:
        """Cancel the work only if it has not started; True when withdrawn (it will never run)."""
        with self._lock:
            if self._started:
                return False
            self._cancelled = True
            return True

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            cancel_work = self._cancel_work
        if cancel_work is not None:
            cancel_work()

    def check(self) -> None:
        """Called by the worker between results."""
        if self._cancelled:
            raise JobCancelled()
        if time.monotonic() > self.deadline:
            self.cancel()
            raise RequestTimeoutError("the request took longer than the server's limit (request_timeout_s)")

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


@dataclass(eq=False)  # compared and hashed by identity (kept in sets)
class Exchange:
    """One HTTP request as the server sees it (made by the guard, found in ``request.state.exchange``)."""

    endpoint: str
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    started: float = field(default_factory=time.perf_counter)
    names: Mapping[str, str] = field(default_factory=dict)  # engine field -> this route's parameter name
    outcome: str | None = None  # set by a route when it knows better than the status code
    audio_seconds: float = 0.0  # audio in the answer, counted once it is delivered
    client_gone: bool = False
    completed: bool = False  # the last byte of the answer was handed to the server
    job: JobControl | None = None
    client: str = ""  # the client's address ("" when the server does not know it)
    body_done: bool = False  # the whole request body has arrived (or the request has none)
    _release: Callable[[], None] | None = None
    _drained: asyncio.Event | None = None
    _on_body: Callable[[], None] | None = None

    def body_complete(self) -> None:
        """The guard saw the last piece of the body: the request no longer counts as an upload under way."""
        self.body_done = True
        on_body, self._on_body = self._on_body, None
        if on_body is not None:
            on_body()

    def check_drained(self, retry_after: float = 1.0) -> None:
        """DrainingError when shutdown withdrew this request before its work began (SIGTERM came while its
        body was still arriving): the answer is 503 + Retry-After, whatever the body holds."""
        if self._drained is not None and self._drained.is_set() and self.job is not None and self.job.cancelled:
            raise DrainingError(SHUTTING_DOWN, retry_after=retry_after)

    def finish(self) -> None:
        """The request is over (answered, failed or abandoned): stop its work, free its admission."""
        if self.job is not None:
            self.job.cancel()
        release, self._release = self._release, None
        if release is not None:
            release()


class Saturation:
    """Since when every place of a bounded pool has been taken, for ``/health`` (a pool full for longer than a
    request may take is stuck, not busy). Thread-safe through its owner's lock."""

    def __init__(self) -> None:
        self._since: float | None = None

    def update(self, used: int, capacity: int) -> None:
        if used < capacity:
            self._since = None
        elif self._since is None:
            self._since = time.monotonic()

    def seconds(self, used: int, capacity: int) -> float:
        """How long the pool has been full without a break (0 when a place is free now)."""
        self.update(used, capacity)
        return 0.0 if self._since is None else time.monotonic() - self._since


class Admission:
    """At most ``capacity`` synthesis requests at once (reading their body, queued, computing or
    streaming): the next one gets BusyError before its body is read. Of those, one client address may
    have at most ``per_client_uploads`` whose body is still arriving: slow senders that reconnect cannot
    take every place. :meth:`drain` (SIGTERM) refuses new ones and answers those whose work has not
    started with DrainingError; running ones continue."""

    def __init__(self, capacity: int | Callable[[], int], retry_after: float, per_client_uploads: int | None = None
                 ) -> None:
        self._capacity = capacity if callable(capacity) else (lambda: capacity)
        self.retry_after = retry_after
        self.per_client_uploads = per_client_uploads  # None: no bound per client address
        self.draining = False
        self._lock = threading.Lock()
        self._active: set[Exchange] = set()
        self._uploading: dict[str, set[Exchange]] = {}  # client address -> its admitted requests still sending
        self._loop: asyncio.AbstractEventLoop | None = None
        self._full = Saturation()

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def capacity(self) -> int:
        """Synthesis requests admitted at once now (fixed, or sized from the engine after its warm-up)."""
        return self._capacity()

    def enter(self, ex: Exchange, timeout_s: float) -> JobControl:
        """Admit ``ex`` (raises BusyError/DrainingError at once when it cannot be) and give it a JobControl."""
        with self._lock:
            if self.draining:
                raise DrainingError(SHUTTING_DOWN,
                                    retry_after=self.retry_after)
            capacity = self._capacity()
            self._full.update(len(self._active), capacity)
            if len(self._active) >= capacity:
                raise BusyError(f"the server is busy ({capacity} synthesis requests in progress); "
                                f"retry in a moment", retry_after=self.retry_after)
            uploading = self._uploading.get(ex.client, set()) if not ex.body_done else None
            if uploading is not None and self.per_client_uploads is not None \
                    and len(uploading) >= self.per_client_uploads:
                raise BusyError(f"this client address is already sending {len(uploading)} request bodies "
                                f"(max_uploads_per_client); finish those first", retry_after=self.retry_after)
            self._active.add(ex)
            self._full.update(len(self._active), capacity)
            if uploading is not None:
                self._uploading.setdefault(ex.client, uploading).add(ex)
                ex._on_body = lambda: self._uploaded(ex)
            self._loop = asyncio.get_running_loop()
        ex.job = JobControl(time.monotonic() + timeout_s)
        ex._drained = asyncio.Event()
        ex._release = lambda: self._leave(ex)
        return ex.job

    def uploading(self, client: str) -> int:
        """Admitted requests from ``client`` whose body is still arriving."""
        with self._lock:
            return len(self._uploading.get(client, ()))

    def _uploaded(self, ex: Exchange) -> None:
        with self._lock:
            sending = self._uploading.get(ex.client)
            if sending is not None:
                sending.discard(ex)
                if not sending:
                    del self._uploading[ex.client]

    def _leave(self, ex: Exchange) -> None:
        self._uploaded(ex)
        with self._lock:
            self._active.discard(ex)
            self._full.update(len(self._active), self._capacity())

    def full_for(self) -> float:
        """Seconds every place has been taken without a break (0 when one is free)."""
        with self._lock:
            return self._full.seconds(len(self._active), self._capacity())

    def drain(self) -> None:
        """Stop admitting; withdraw every admitted request whose work has not started (DrainingError; the
        engine answers those queued for a decoding slot itself). Thread-safe (a signal handler may call it)."""
        with self._lock:
            self.draining = True
            active = list(self._active)
        self._answer_draining([ex for ex in active if ex.job is not None and ex.job.withdraw()])

    def cut(self) -> None:
        """The shutdown grace is over: every request still waiting for its answer gets DrainingError (a 503
        with Retry-After, not the 500 of a task cancelled by the server); streams already sent end."""
        with self._lock:
            active = list(self._active)
        for ex in active:
            if ex.job is not None:
                ex.job.cancel()
        self._answer_draining(active)

    def _answer_draining(self, exchanges: list[Exchange]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        for ex in exchanges:
            if ex._drained is not None:
                loop.call_soon_threadsafe(ex._drained.set)


async def await_work(ex: Exchange, work: Awaitable[T], disconnected: Callable[[], Awaitable[Any]],
                     retry_after: float = 1.0) -> T:
    """``await work`` unless, first, the client leaves (ClientGone), the time limit passes
    (RequestTimeoutError) or the server drains before the work started (DrainingError). Giving up
    cancels ``ex.job``, so the worker stops at its next check; the work's own result is then dropped."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected())
    watchers = [gone]
    if ex._drained is not None:
        watchers.append(asyncio.ensure_future(ex._drained.wait()))
    timeout = ex.job.remaining() if ex.job is not None else None
    try:
        done, _ = await asyncio.wait({task, *watchers}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in watchers:
            w.cancel()
    if task in done:
        if not task.cancelled() and isinstance(task.exception(), JobCancelled):
            ex.check_drained(retry_after)  # withdrawn by the drain as it started: 503, not a 500
        return task.result()
    if ex.job is not None:
        ex.job.cancel()
    task.add_done_callback(_drop_result)
    if gone in done:
        ex.client_gone = True
        raise ClientGone()
    if done:
        raise DrainingError(SHUTTING_DOWN,
                            retry_after=retry_after)
    raise RequestTimeoutError("the request took longer than the server's limit (request_timeout_s)")


def _drop_result(task: asyncio.Future) -> None:
    """Abandoned work: its error is retrieved (no warning), a stream it made is cancelled."""
    if task.cancelled() or task.exception() is not None:
        return
    cancel = getattr(task.result(), "cancel", None)
    if callable(cancel):
        cancel()

