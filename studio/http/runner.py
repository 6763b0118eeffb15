"""Blocking calls off the event loop: each admitted request gets a thread that waits on the engine.

The model work itself is not done here: every synthesis goes through the engine's scheduler
(``engine.serving``), which batches all requests of a model set; these threads only wait for its
results. Responsibilities: (1) admit at most ``workers + max_queue`` requests at once (the rest get
:class:`ServerBusyError`, i.e. ``engine.errors.BusyError``, at once; the scheduler has its own bound
too), all of them in flight together; (2) hand each job's outcome, or its results one by one for
streaming, back to the asyncio side with backpressure and cancellation.
A cancelled stream (client gone) stops its producer at the next result and closes its iterator, so
the pipeline's ``finally`` blocks free what the request took.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from engine.errors import BusyError
from studio.http.exchange import Saturation

T = TypeVar("T")
_END = object()


ServerBusyError = BusyError  # the name the HTTP layer knows (503 with Retry-After)
MAX_THREADS = 8192  # most worker threads of an engine-sized runner (each only waits on the scheduler)


class SynthesisRunner:
    """Threads for at most ``workers + max_queue`` admitted jobs, all running at once (they wait on the
    engine's scheduler, which does the batching). ``queue_length`` is the number of admitted jobs not
    yet started; ``running`` the number in flight."""

    def __init__(self, workers: int, max_queue: int,
                 on_start: Callable[[], None] | None = None, on_end: Callable[[], None] | None = None,
                 capacity: Callable[[], int] | None = None) -> None:
        if workers < 1 or max_queue < 0:
            raise ValueError("workers must be >= 1 and max_queue >= 0")
        self.workers, self.max_queue = workers, max_queue
        # ``capacity()``: the admitted jobs allowed now (e.g. sized from the engine's slots after warm-up);
        # default workers + max_queue
        self._capacity = capacity if capacity is not None else (lambda: workers + max_queue)
        # every admitted request runs at once: its thread only waits on the scheduler (threads start on demand)
        threads = MAX_THREADS if capacity is not None else workers + max_queue
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="synthesis")
        self._lock = threading.Lock()
        self._admitted = 0
        self._waiting = 0
        self._running = 0
        self._on_start, self._on_end = on_start, on_end
        self._full = Saturation()

    @property
    def queue_length(self) -> int:
        return self._waiting

    @property
    def running(self) -> int:
        return self._running

    @property
    def capacity(self) -> int:
        return min(self._capacity(), self._executor._max_workers)

    def _release(self) -> None:
        capacity = self.capacity
        with self._lock:
            self._admitted -= 1
            self._full.update(self._admitted, capacity)

    def full_for(self) -> float:
        """Seconds every worker place has been taken without a break (0 when one is free): a worker still
        inside one step of a request that has ended holds its place."""
        capacity = self.capacity
        with self._lock:
            return self._full.seconds(self._admitted, capacity)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future:
        """Queue ``fn(*args)`` or raise ServerBusyError when ``capacity`` jobs are admitted."""
        capacity = self.capacity
        with self._lock:
            self._full.update(self._admitted, capacity)
            if self._admitted >= capacity:
                raise ServerBusyError(
                    f"the server is busy ({self._running} running, {self._waiting} queued); retry in a moment")
            self._admitted += 1
            self._waiting += 1
            self._full.update(self._admitted, capacity)

        def job() -> T:
            with self._lock:
                self._waiting -= 1
                self._running += 1
            if self._on_start:
                self._on_start()
            try:
                return fn(*args)
            finally:
                with self._lock:
                    self._running -= 1
                if self._on_end:
                    self._on_end()
                self._release()

        try:
            return self._executor.submit(job)
        except RuntimeError:  # shut down
            with self._lock:
                self._waiting -= 1
            self._release()
            raise ServerBusyError("the server is shutting down") from None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking call on a worker and await its result (exceptions propagate)."""
        return await asyncio.wrap_future(self.submit(fn, *args))

    async def stream(self, start: Callable[[], Iterator[T]], max_pending: int = 8,
                     stopped: Callable[[], bool] | None = None) -> ResultStream[T]:
        """Start ``start()`` on a worker. Returns once it has either raised (the error propagates here,
        before any response is sent) or produced its iterator; then iterate the stream. ``stopped()``: the
        request behind it is over (its producer then stops even if nobody cancels the stream)."""
        stream: ResultStream[T] = ResultStream(asyncio.get_running_loop(), max_pending, stopped)
        self.submit(stream.produce, start)
        await stream.wait_started()
        return stream

    def shutdown(self, wait: bool = False) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=True)


class ResultStream(Generic[T]):
    """Items made on a worker thread, consumed on the event loop. At most ``max_pending`` items wait
    unconsumed (the producer blocks beyond that); :meth:`cancel` stops the producer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_pending: int = 8,
                 stopped: Callable[[], bool] | None = None) -> None:
        self._loop = loop
        self._stopped = stopped if stopped is not None else (lambda: False)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._room = threading.Semaphore(max_pending)
        self._cancelled = threading.Event()
        self._started: asyncio.Future = loop.create_future()

    # ---- worker side -----------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody listens any more
            self._cancelled.set()

    def _settle(self, error: BaseException | None) -> None:
        def settle() -> None:
            if self._started.done():
                return
            if error is None:
                self._started.set_result(None)
            else:
                self._started.set_exception(error)

        self._call(settle)

    def produce(self, start: Callable[[], Iterator[T]]) -> None:
        try:
            items = start()
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting request
            self._settle(e)
            return
        self._settle(None)
        try:
            for item in items:
                while not self._room.acquire(timeout=0.1):
                    if self._cancelled.is_set() or self._stopped():  # nobody will take it: the slot goes back
                        return
                if self._cancelled.is_set() or self._stopped():
                    return
                self._call(self._queue.put_nowait, item)
            self._call(self._queue.put_nowait, _END)
        except BaseException as e:  # noqa: BLE001 - raised again on the consumer side
            self._call(self._queue.put_nowait, e)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # runs the pipeline's finally blocks (per-request state freed)

    # ---- event-loop side -------------------------------------------------------------------
    async def wait_started(self) -> None:
        try:
            await self._started
        except asyncio.CancelledError:
            self.cancel()
            raise

    def cancel(self) -> None:
        self._cancelled.set()

    async def __aiter__(self) -> AsyncIterator[T]:
        try:
            while True:
                item = await self._queue.get()
                if item is _END:
                    return
                self._room.release()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel()
