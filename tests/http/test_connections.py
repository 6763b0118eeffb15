"""Connections and heads (issue 21): header limits answer 431/414, a body must arrive within body_timeout_s
in total, a client that stops reading a stream loses it at request_timeout_s and frees its slot, idle
connections cannot lock others out, and one client address has a connection limit. A normal request is
served while the hostile clients hang."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx

from tests.http.test_hardening import ScriptedStudio, make_app, read_answer, refs, serving, tts_body, wait_for

__all__ = ["refs"]  # the fixture


def _raw(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        return read_answer(s)


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_header_limits_answer_431_and_long_urls_414(tmp_path, refs) -> None:
    with serving(make_app(ScriptedStudio(tmp_path), refs)) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        ok = b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * (16 * 1024 - 20) + b"\r\n\r\n"
        assert _status(_raw(port, ok)) == 200
        long_line = b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * (16 * 1024) + b"\r\n\r\n"
        answer = _raw(port, long_line)
        assert _status(answer) == 431 and b"max_header_line_bytes" in answer
        many = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(100)) + b"\r\n"
        answer = _raw(port, many)
        assert _status(answer) == 431 and b"max_headers" in answer
        big = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(
            b"X-%d: " % i + b"b" * 14_000 + b"\r\n" for i in range(5)) + b"\r\n"
        answer = _raw(port, big)
        assert _status(answer) == 431 and b"max_header_bytes" in answer
        answer = _raw(port, b"GET /health?x=" + b"c" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _status(answer) == 414
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # larger than h11 buffers: refused
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-B: " + b"d" * 200_000)
            assert s.recv(4096).split(b" ", 2)[1] in (b"400", b"431")
        assert httpx.get(f"{url}/health").status_code == 200


def test_trickled_bodies_get_408_within_the_body_timeout_and_a_normal_request_is_served(tmp_path, refs) -> None:
    app = make_app(ScriptedStudio(tmp_path), refs, body_timeout_s=1.5, workers=1, max_queue=4)
    with serving(app) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps(tts_body()).encode()
        answers: list[bytes] = []

        def trickle() -> None:
            with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
                s.sendall(b"POST /tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body))
                start = time.monotonic()
                try:
                    for byte in body:  # a byte every 0.1 s: never a pause of body_timeout_s
                        s.sendall(bytes([byte]))
                        time.sleep(0.1)
                        if time.monotonic() - start > 10:
                            break
                except OSError:
                    pass  # the server answered and closed
                answers.append(read_answer(s))

        threads = [threading.Thread(target=trickle, daemon=True) for _ in range(4)]
        start = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(0.3)
        assert httpx.post(f"{url}/tts", json=tts_body(), timeout=10).status_code == 200  # served meanwhile
        for t in threads:
            t.join(15)
        assert len(answers) == 4 and all(a.startswith(b"HTTP/1.1 408") for a in answers), answers
        assert time.monotonic() - start < 5
        assert wait_for(lambda: httpx.get(f"{url}/health").json()["admitted"] == 0, 5)


def test_a_stream_to_a_client_that_stops_reading_ends_at_the_time_limit(tmp_path, refs) -> None:
    studio = ScriptedStudio(tmp_path, pieces=10_000, seconds=2.0)  # 128 KB per piece, as fast as it can
    app = make_app(studio, refs, request_timeout_s=2.0, workers=2)
    with serving(app) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        body = json.dumps(tts_body(streaming_mode=True)).encode()
        s.sendall(b"POST /tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)  # and never reads
        try:
            assert wait_for(lambda: httpx.get(f"{url}/health").json()["admitted"] == 1, 5)
            with httpx.stream("POST", f"{url}/tts", json=tts_body(streaming_mode=True), timeout=10) as served:
                assert served.status_code == 200 and next(served.iter_raw())  # served meanwhile
            start = time.monotonic()
            assert wait_for(lambda: httpx.get(f"{url}/health").json()["admitted"] == 0, 6)
            assert time.monotonic() - start < 4
            assert studio.closed.wait(5)  # the work stopped
        finally:
            s.close()


def test_idle_connections_are_closed_before_they_lock_others_out(tmp_path, refs) -> None:
    app = make_app(ScriptedStudio(tmp_path), refs, max_connections=20, header_timeout_s=60)
    with serving(app) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
        try:
            time.sleep(0.2)
            with httpx.Client() as client:
                for _ in range(3):
                    assert client.get(f"{url}/health").status_code == 200
                    assert client.post(f"{url}/tts", json=tts_body()).status_code == 200
        finally:
            for s in idle:
                s.close()


def test_one_client_address_has_a_connection_limit(tmp_path, refs) -> None:
    app = make_app(ScriptedStudio(tmp_path), refs, max_connections_per_client=5, header_timeout_s=60)
    with serving(app) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(5)]
        try:
            time.sleep(0.2)
            answer = _raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _status(answer) == 503 and b"max_connections_per_client" in answer
        finally:
            for s in held:
                s.close()
        assert wait_for(lambda: httpx.get(f"{url}/health").status_code == 200, 5)


def test_a_connection_sending_its_head_at_shutdown_gets_a_503_not_a_bare_close(tmp_path, refs) -> None:
    studio = ScriptedStudio(tmp_path, pieces=20, delay=0.1)
    app = make_app(studio, refs, shutdown_grace_s=5, header_timeout_s=30)
    with serving(app) as (url, server):
        port = int(url.rsplit(":", 1)[1])
        half = socket.create_connection(("127.0.0.1", port), timeout=10)
        half.sendall(b"GET /health HTTP/1.1\r\nHo")
        running = socket.create_connection(("127.0.0.1", port), timeout=20)
        body = json.dumps(tts_body()).encode()
        running.sendall(b"POST /tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert studio.started.wait(5)
        server.request_exit()
        try:
            assert half.recv(4096).startswith(b"HTTP/1.1 503")
            assert read_answer(running).startswith(b"HTTP/1.1 200")  # the running request finishes
        finally:
            half.close()
            running.close()


def test_the_server_raises_its_open_files_limit_to_fit_its_connections(monkeypatch, caplog) -> None:
    import resource

    from studio.http.lifecycle import FD_MARGIN, fit_open_files

    limits = {"soft": 1024, "hard": 1_000_000}
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (limits["soft"], limits["hard"]))

    privileged = {"yes": False}

    def setrlimit(kind, values):
        if values[0] > values[1] or (values[1] > limits["hard"] and not privileged["yes"]):
            raise ValueError("not allowed")
        limits["soft"], limits["hard"] = values

    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    assert fit_open_files(2048) == 2048 and limits["soft"] == 2048 + FD_MARGIN
    limits.update(soft=1024, hard=1024)  # a machine that cannot raise it: fewer connections, and a warning
    with caplog.at_level("WARNING", logger="studio.http"):
        assert fit_open_files(2048) == 1024 - FD_MARGIN
    assert "ulimit -n" in caplog.text and limits["hard"] == 1024
    privileged["yes"] = True  # root (CAP_SYS_RESOURCE): the hard limit of the machine is no ceiling
    assert fit_open_files(2048) == 2048 and limits["soft"] == limits["hard"] == 2048 + FD_MARGIN
