"""A stream's reader cannot keep a worker slot (issue 32, item 2), through a real uvicorn server on loopback.

The attack run held every worker slot with clients that stopped reading their streams (or closed them halfway):
the server answered 503 to everyone for 12 minutes and more while /health said ready. Now a stream's body send
that does not complete within ``stream_write_timeout_s`` cuts the stream and frees the slot (its producer stops
and closes the engine's iterator), a closed stream frees it at once, and /health says "degraded" when no slot has
been free for longer than ``request_timeout_s``. A scripted engine stands in for the models.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import numpy as np

from engine.results import Result
from tests.http.test_hardening import RATE, ScriptedStudio, make_app, refs, serving, tts_body, wait_for

__all__ = ["refs"]  # the fixture


def _request(port: int, body: dict, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    raw = json.dumps(body).encode()
    s.sendall(b"POST /tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
    return s


def _stream_starts(url: str) -> bool:
    with httpx.stream("POST", f"{url}/tts", json=tts_body(streaming_mode=True), timeout=10) as answer:
        return answer.status_code == 200 and bool(next(answer.iter_raw()))


def _free(ctx) -> bool:
    """No synthesis is admitted and no worker thread holds one."""
    return ctx.admission.active == 0 and ctx.runner.running == 0 and ctx.runner.queue_length == 0


def test_a_stream_whose_reader_stops_frees_its_slot_within_the_write_timeout(tmp_path, refs) -> None:
    studio = ScriptedStudio(tmp_path, pieces=10_000, seconds=2.0)  # 128 KB per piece, as fast as it can
    # the request's own time limit is far away: only the write timeout can free the slot within the test
    app = make_app(studio, refs, request_timeout_s=600, stream_write_timeout_s=1.0, workers=1, max_queue=0)
    ctx = app.state.context
    with serving(app) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        s = _request(port, tts_body(streaming_mode=True), rcvbuf=4096)  # and never reads
        try:
            assert wait_for(lambda: ctx.admission.active == 1, 5)
            busy = httpx.post(f"{url}/tts", json=tts_body(), timeout=10)
            assert busy.status_code == 503  # the one place is taken by the stalled stream
            assert wait_for(lambda: _free(ctx), 20)  # before: held until request_timeout_s (600 s)
            assert studio.closed.wait(5)  # the engine's iterator was closed: its work stopped
            assert _stream_starts(url)  # the place is free again
        finally:
            s.close()


class HeldStudio(ScriptedStudio):
    """Each result waits for :attr:`go`; ``stuck``: the first one ignores cancellation until then."""

    def __init__(self, root, pieces: int = 50) -> None:
        super().__init__(root, pieces=pieces)
        self.go, self.made = threading.Event(), 0

    def _results(self):
        try:
            for i in range(self.pieces):
                self.started.set()
                self.go.wait(60)
                self.made += 1
                yield Result(np.full(RATE // 10, 0.1, dtype=np.float32), RATE, "x", (), i, i, i == self.pieces - 1, 1)
        finally:
            self.closed.set()


def test_a_stream_closed_halfway_frees_its_slot(tmp_path, refs) -> None:
    studio = HeldStudio(tmp_path, pieces=10_000)
    studio.go.set()  # results come as fast as they are read
    app = make_app(studio, refs, request_timeout_s=600, workers=1, max_queue=0, max_pending_chunks=2)
    ctx = app.state.context
    with serving(app) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        s = _request(port, tts_body(streaming_mode=True))
        assert s.recv(65536).startswith(b"HTTP/1.1 200")  # the stream has begun
        s.close()  # halfway
        assert wait_for(lambda: _free(ctx), 20)
        assert studio.closed.wait(5)
        assert _stream_starts(url)  # the place is free again


def test_health_says_degraded_when_no_slot_was_free_for_longer_than_the_request_limit(tmp_path, refs) -> None:
    studio = HeldStudio(tmp_path, pieces=1)  # its one result waits: the worker cannot stop before it
    app = make_app(studio, refs, request_timeout_s=0.5, workers=1, max_queue=0)
    with serving(app) as (url, _):
        try:
            answer = httpx.post(f"{url}/tts", json=tts_body(), timeout=10)
            assert answer.status_code == 504  # the request gave up; its worker is still inside a step
            assert httpx.post(f"{url}/tts", json=tts_body(), timeout=10).status_code == 503
            health = {}
            assert wait_for(lambda: health.update(httpx.get(f"{url}/health").json()) or
                            health["status"] == "degraded", 10), health  # before: "ready" throughout
            assert "request_timeout_s" in health["reason"]
        finally:
            studio.go.set()
        assert wait_for(lambda: httpx.get(f"{url}/health").json()["status"] == "ready", 10)
