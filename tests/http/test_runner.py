"""The worker pool behind the server: bounded admission, errors before the first byte, backpressure and
cancellation of streams (the pipeline's iterator is closed so its per-request state is freed)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from engine.errors import TextError
from studio.http.runner import ServerBusyError, SynthesisRunner


def test_admission_is_bounded_and_slots_come_back() -> None:
    runner = SynthesisRunner(workers=1, max_queue=1)
    gate = threading.Event()
    first = runner.submit(gate.wait)
    second = runner.submit(lambda: gate.wait() and "queued")
    time.sleep(0.05)
    assert runner.running == 2 and runner.queue_length == 0  # all admitted jobs wait on the engine at once
    with pytest.raises(ServerBusyError, match="busy") as busy:
        runner.submit(lambda: None)
    assert busy.value.retry_after > 0
    gate.set()
    assert first.result(5) is True and second.result(5) == "queued"
    assert runner.submit(lambda: 42).result(5) == 42  # the slots were released
    assert runner.running == 0 and runner.queue_length == 0
    runner.shutdown()


def test_a_failing_job_frees_its_slot() -> None:
    runner = SynthesisRunner(workers=1, max_queue=0)

    def fail():
        raise TextError("text is empty")

    with pytest.raises(TextError):
        runner.submit(fail).result(5)
    assert runner.submit(lambda: "ok").result(5) == "ok"
    runner.shutdown()


def test_stream_errors_before_the_first_item_reach_the_caller() -> None:
    runner = SynthesisRunner(workers=1, max_queue=32)

    def start():
        raise TextError("text is empty")

    async def main():
        with pytest.raises(TextError, match="empty"):
            await runner.stream(start)

    asyncio.run(main())
    runner.shutdown()


def test_stream_delivers_in_order_with_backpressure() -> None:
    runner = SynthesisRunner(workers=1, max_queue=32)
    made: list[int] = []

    def items():
        for i in range(20):
            made.append(i)
            yield i

    async def main():
        stream = await runner.stream(lambda: items(), max_pending=2)
        await asyncio.sleep(0.2)
        assert len(made) <= 4  # the producer waits for the consumer
        return [x async for x in stream]

    assert asyncio.run(main()) == list(range(20))
    runner.shutdown()


def test_cancelled_stream_closes_the_pipeline_iterator() -> None:
    runner = SynthesisRunner(workers=1, max_queue=0)
    closed = threading.Event()

    def items():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    async def main():
        stream = await runner.stream(lambda: items(), max_pending=1)
        async for x in stream:
            if x == 3:
                break  # the client went away

    asyncio.run(main())
    assert closed.wait(5)
    time.sleep(0.05)
    assert runner.submit(lambda: "free").result(5) == "free"  # the worker is free again
    runner.shutdown()


def test_error_in_the_middle_of_a_stream_is_raised_to_the_consumer() -> None:
    runner = SynthesisRunner(workers=1, max_queue=32)

    def items():
        yield 1
        raise RuntimeError("boom")

    async def main():
        stream = await runner.stream(lambda: items())
        got = []
        with pytest.raises(RuntimeError, match="boom"):
            async for x in stream:
                got.append(x)
        return got

    assert asyncio.run(main()) == [1]
    runner.shutdown()
