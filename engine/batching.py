"""Group commit for model calls made from many threads: concurrent calls become one batched call.

Each caller queues its item and then waits for the run lock; whoever holds it runs every queued item (up
to ``max_batch``) as one batch and hands each caller its own result. A lone call runs at once, alone (no
waiting window, so one user pays nothing); under load the items that arrived while a batch ran form the
next one. Batches run on the leading caller's thread, or on a given executor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any, Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


class GroupRunner(Generic[In, Out]):
    """``runner(item)`` from any thread == ``run_batch([item])[0]``, batched with concurrent calls.

    ``run_batch(items) -> results`` (same order and length). An exception from a batch goes to every
    caller of that batch. ``batches`` and ``items`` count what ran (for benchmarks)."""

    def __init__(self, run_batch: Callable[[Sequence[In]], Sequence[Out]], max_batch: int = 64,
                 executor: Executor | None = None) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self._run_batch, self.max_batch = run_batch, max_batch
        # where batches run (None: on the calling thread). A device model gets a thread of its own, so that
        # however many request threads call, one thread holds its cuBLAS/cuDNN handles and workspaces.
        self._executor = executor
        self._queue: list[tuple[In, Future]] = []
        self._queue_lock = threading.Lock()
        self._run_lock = threading.Lock()
        self.batches = 0
        self.items = 0

    def __call__(self, item: In) -> Out:
        future: Future = Future()
        with self._queue_lock:
            self._queue.append((item, future))
        while not future.done():
            with self._run_lock:
                if future.done():
                    break
                with self._queue_lock:
                    batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch:]
                if batch:
                    self._run(batch)
        return future.result()

    def _run(self, batch: list[tuple[In, Future]]) -> None:
        self.batches += 1
        self.items += len(batch)
        try:
            items = [item for item, _ in batch]
            results = (self._run_batch(items) if self._executor is None
                       else self._executor.submit(self._run_batch, items).result())
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} items gave {len(results)} results")
        except BaseException as e:  # noqa: BLE001 - every caller of the batch gets it
            for _, future in batch:
                future.set_exception(e)
            return
        for (_, future), result in zip(batch, results):
            future.set_result(result)


def per_model(run: Callable[[Any, list], Sequence[Out]]) -> Callable[[Sequence[tuple[Any, Any]]], list[Out]]:
    """A batch function over ``(model, item)`` pairs that calls ``run(model, items)`` once per distinct model
    (requests of different model sets may share one runner), each result back in its pair's place."""

    def batch(pairs: Sequence[tuple[Any, Any]]) -> list[Out]:
        out: list[Any] = [None] * len(pairs)
        groups: dict[int, tuple[Any, list[int]]] = {}
        for i, (model, _) in enumerate(pairs):
            groups.setdefault(id(model), (model, []))[1].append(i)
        for model, rows in groups.values():
            for i, result in zip(rows, run(model, [pairs[i][1] for i in rows])):
                out[i] = result
        return out

    return batch
