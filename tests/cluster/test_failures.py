"""Failures answered one way: the proxy middleware turns a request whose gateway stopped (no response
started) into 503 + Retry-After in the path's error shape, and a replica's health check names a dead
scheduler. No Ray needed."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

from studio.cluster.health import engine_problem, scheduler_problem
from studio.cluster.proxy import AnswerLostRequests


def run_through(app, path: str = "/tts", disconnect: bool = False) -> list[dict]:
    sent: list[dict] = []

    async def receive():
        if disconnect:
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    async def main():
        await AnswerLostRequests(app)({"type": "http", "method": "GET", "path": path}, receive, send)

    asyncio.run(main())
    return sent


async def silent_app(scope, receive, send):  # what Serve's proxy does when its ingress actor died
    return None


def test_a_request_left_unanswered_gets_503_with_retry_after_in_the_paths_error_shape():
    start, body = run_through(silent_app, "/tts")
    assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]
    assert "send the request again" in json.loads(body["body"])["message"]
    start, body = run_through(silent_app, "/v1/audio/speech")
    error = json.loads(body["body"])["error"]
    assert start["status"] == 503 and error["type"] == "server_error" and "send the request again" in error["message"]


def test_answered_requests_and_gone_clients_are_left_alone():
    async def answering(scope, receive, send):
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"app error"})

    assert [m.get("status") for m in run_through(answering)] == [500, None]  # the app's own answer, unchanged

    async def reads_then_leaves(scope, receive, send):
        await receive()

    assert run_through(reads_then_leaves, disconnect=True) == []  # nobody to answer


def finished_thread(name: str) -> threading.Thread:
    t = threading.Thread(target=lambda: None, name=name)
    t.start()
    t.join()
    return t


def test_a_scheduler_with_a_stopped_thread_is_dead_unless_it_was_closed():
    alive = threading.Event()
    running = threading.Thread(target=alive.wait, name="acoustic", daemon=True)
    running.start()
    try:
        healthy = SimpleNamespace(_closed=False, _threads=[running])
        dead = SimpleNamespace(_closed=False, _threads=[finished_thread("t2s-loop"), running])
        closed = SimpleNamespace(_closed=True, _threads=[finished_thread("t2s-loop")])
        assert scheduler_problem(healthy) == "" and scheduler_problem(closed) == ""
        assert "t2s-loop" in scheduler_problem(dead)
        assert engine_problem(SimpleNamespace(_schedulers={"a": healthy, "b": closed})) == ""
        assert "t2s-loop" in engine_problem(SimpleNamespace(_schedulers={"a": healthy, "b": dead}))
    finally:
        alive.set()


def test_a_real_scheduler_reads_as_alive_then_dead_when_its_loop_ends(tmp_path):
    """On the engine's own Scheduler: running, it is healthy; its decode thread ended while it is still open
    (as an uncaught error would leave it) reads as dead."""
    from engine.pipeline import Studio
    from engine.testweights import make_test_weights

    studio = Studio.from_config(make_test_weights(tmp_path, "v2"))
    sched = studio.scheduler(studio.pool.models(studio.default_weights, studio.runtime))
    sched._start()
    assert engine_problem(studio) == ""
    sched.close()  # its threads end ...
    sched._closed = False  # ... but it does not say closed: the state a crashed loop leaves
    assert "t2s-loop" in engine_problem(studio)
