"""Each way the adversarial run of issue 13 found to lose data, tie up or mislead the server, on loopback.

A scripted engine stands in for the models where only the server's behaviour matters (timing, failures,
cancellation); it yields results on a schedule and records how far it got and whether its iterator was
closed. Tiny real weights are used where the engine's own behaviour is the point.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import soundfile as sf

from engine.errors import BusyError
from engine.options import EngineSettings, SynthesisOptions
from engine.results import Result
from engine.reference import ReferenceRules
from studio.http.app import create_app
from studio.http.auth import Access
from studio.http.context import ServerSettings
from studio.http.limits import ServerLimits
from tests.support.server import free_port, reference_wav

RATE = 32000
KEY = "a-test-key-0123456789"


class ScriptedStudio:
    """Just what the server reads from a Studio; ``synthesize`` yields ``pieces`` results of ``seconds`` of
    audio each, ``delay`` seconds apart, failing at piece ``fail_at`` if set."""

    def __init__(self, root: Path, pieces: int = 3, delay: float = 0.0, seconds: float = 0.1,
                 fail_at: int | None = None, slots: int | None = None) -> None:
        self.pieces, self.delay, self.seconds, self.fail_at = pieces, delay, seconds, fail_at
        self.settings = EngineSettings()
        self.reference_rules = ReferenceRules()
        self.default_weights = SimpleNamespace(gpt=root / "w" / "a.ckpt", sovits=root / "w" / "b.pth")
        zero = SimpleNamespace(hits=0, misses=0, loads=0)
        self.references = SimpleNamespace(stats=lambda: zero)
        self.pool = SimpleNamespace(stats=lambda: zero)
        self.steps = 0
        self.started, self.closed = threading.Event(), threading.Event()
        # slots: like the engine's scheduler, at most this many requests run; the others queue (load, drain)
        self._slots = None if slots is None else threading.Semaphore(slots)
        self._queued, self._draining = 0, None

    def synthesize(self, text, text_lang, reference, options, gpt=None, sovits=None):
        return self._results()

    def load(self):
        return {"slots": 0, "decoding": 0, "queued": self._queued}

    def drain(self, reason):
        self._draining = reason

    def _take_slot(self) -> None:
        self._queued += 1
        try:
            while not self._slots.acquire(timeout=0.01):
                if self._draining:
                    raise BusyError(self._draining)
        finally:
            self._queued -= 1

    def _results(self):
        if self._slots is not None:
            self._take_slot()
        try:
            for i in range(self.pieces):
                self.started.set()
                time.sleep(self.delay)
                if i == self.fail_at:
                    raise RuntimeError("decoder state <object at 0xdeadbeef> broke")
                self.steps += 1
                audio = np.full(int(self.seconds * RATE), 0.1, dtype=np.float32)
                yield Result(audio, RATE, "x", (), i, i, i == self.pieces - 1, 1)
        finally:
            self.closed.set()
            if self._slots is not None:
                self._slots.release()


@pytest.fixture
def refs(tmp_path) -> Path:
    folder = tmp_path / "refs"
    folder.mkdir()
    (folder / "a.wav").write_bytes(reference_wav(0))
    (tmp_path / "secret.wav").write_bytes(reference_wav(1))  # outside the reference folder
    return folder


def tts_body(**extra) -> dict:
    return {"text": "Hi there.", "text_lang": "en", "ref_audio_path": "a.wav", "prompt_lang": "en", **extra}


def make_app(studio, refs: Path, on_control=None, **limits):
    settings = ServerSettings(reference_roots=(str(refs),), profiles_dir=str(refs.parent / "voices"),
                              limits=ServerLimits(**limits))
    return create_app(studio, settings, on_control=on_control)


@contextmanager
def serving(app):
    """``app`` under uvicorn with its limits (studio.http.lifecycle) on a free loopback port; yields
    ``(url, server)``."""
    from studio.http.lifecycle import DrainingServer, uvicorn_config

    port = free_port()
    server = DrainingServer(uvicorn_config(app, "127.0.0.1", port, app.state.context.limits, log_level="warning"),
                            app.state.context)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(30)


def metric(url: str, name: str, **labels) -> float:
    text = httpx.get(f"{url}/metrics", headers={"X-API-Key": KEY}).text
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def asgi(app, calls):
    """Run ``calls(client)`` against ``app`` in process (no sockets)."""
    async def main():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as c:
            return await calls(c)

    return asyncio.run(main())


# ---- one rule for bad input ---------------------------------------------------------------------


def test_deep_json_malformed_forms_and_bad_encodings_are_400_naming_the_body(tmp_path, refs) -> None:
    app = make_app(ScriptedStudio(tmp_path), refs)
    deep = b"[" * 50_000 + b"]" * 50_000  # RecursionError in json.loads on 60d1d93: a 500
    medium = json.dumps({"text": "x", "nest": json.loads("[" * 40 + "]" * 40)}).encode()
    cases = [
        ("/tts", {"content": deep, "headers": {"content-type": "application/json"}}),
        ("/v1/audio/speech", {"content": deep, "headers": {"content-type": "application/json"}}),
        ("/tts", {"content": medium, "headers": {"content-type": "application/json"}}),
        ("/tts", {"content": b'{"text": "\xff\xfe\xfd"}', "headers": {"content-type": "application/json"}}),
        ("/tts", {"content": b"--xyz\r\nContent-Disposition: form-data; name=\"text\"\r\n\r\nhi\r\n--xy",
                  "headers": {"content-type": "multipart/form-data; boundary=xyz"}}),
        ("/tts", {"content": b"garbage", "headers": {"content-type": "multipart/form-data"}}),
        ("/tts", {"content": b"\x00\x01--" * 50, "headers": {"content-type": "multipart/form-data; boundary=--"}}),
        ("/v1/voices", {"content": b"--b\r\nbroken", "headers": {"content-type": "multipart/form-data; boundary=b"}}),
        ("/tts", {"content": "text=%FF%FE".encode(), "headers": {"content-type": "application/x-www-form-urlencoded"}}),
        ("/tts", {"content": b'{"top_k": ' + b"9" * 5000 + b"}", "headers": {"content-type": "application/json"}}),
    ]

    async def calls(c):
        return [await c.post(path, **kw) for path, kw in cases], await c.get("/metrics")

    answers, metrics = asgi(app, calls)
    for (path, kw), r in zip(cases, answers):
        assert r.status_code == 400, (path, kw["content"][:40], r.status_code, r.text[:200])
        body = r.json()
        message = body["error"]["message"] if path.startswith("/v1/") else body["message"]
        assert re.match(r"(request body|[a-z_]+)[: ]", message), message  # it starts with the part at fault
        assert "Error" not in message and "0x" not in message  # our words, not the parser's
    assert 'status="500"' not in metrics.text


def test_min_chunk_below_overlap_is_a_400_before_any_byte_not_an_empty_200(tmp_path, refs) -> None:
    from engine.errors import OptionsError

    with pytest.raises(OptionsError, match="min_chunk_length") as info:
        SynthesisOptions(streaming_mode=True, min_chunk_length=1, overlap_length=5)
    assert info.value.field == "min_chunk_length"
    SynthesisOptions(streaming_mode=False, min_chunk_length=1, overlap_length=5)  # not streaming: irrelevant
    studio = ScriptedStudio(tmp_path)
    app = make_app(studio, refs)

    async def calls(c):
        return [await c.post("/tts", json=tts_body(streaming_mode=mode, min_chunk_length=1, overlap_length=5))
                for mode in (2, 3)]

    for r in asgi(app, calls):
        assert r.status_code == 400 and r.json()["message"].startswith("min_chunk_length"), r.text
    assert studio.steps == 0


def test_a_stream_failing_after_its_header_ends_visibly_and_is_counted(tmp_path, refs, caplog) -> None:
    app = make_app(ScriptedStudio(tmp_path, pieces=6, fail_at=3), refs)
    with serving(app) as (url, _), caplog.at_level(logging.ERROR, logger="studio.http"):
        got = bytearray()
        with pytest.raises(httpx.RemoteProtocolError):  # 60d1d93: a clean end after 3 chunks (a short "success")
            with httpx.stream("POST", f"{url}/tts", json=tts_body(streaming_mode=1), timeout=30) as r:
                assert r.status_code == 200
                request_id = r.headers["x-request-id"]
                for chunk in r.iter_raw():
                    got += chunk
        assert len(got) == 44 + 3 * int(0.1 * RATE) * 2  # the header and the three good chunks
        assert metric(url, "sovits_request_outcomes_total", endpoint="/tts", outcome="failed_mid_stream") == 1
        assert metric(url, "sovits_request_outcomes_total", endpoint="/tts", outcome="completed") == 0
    assert any(request_id in rec.getMessage() and rec.exc_info for rec in caplog.records)


# ---- bounded work ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0, 1])
def test_a_client_leaving_cancels_the_work_at_once_in_every_mode(tmp_path, refs, mode) -> None:
    studio = ScriptedStudio(tmp_path, pieces=200, delay=0.02, seconds=0.5)
    app = make_app(studio, refs)
    with serving(app) as (url, _):
        if mode == 0:  # whole file: the client gives up waiting
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{url}/tts", json=tts_body(), timeout=httpx.Timeout(30, read=0.3))
        else:  # streaming: the client reads one piece and leaves
            with httpx.stream("POST", f"{url}/tts", json=tts_body(streaming_mode=mode), timeout=30) as r:
                next(r.iter_raw())
        assert studio.closed.wait(5), "the engine iterator was not closed"
        assert studio.steps < 100  # 60d1d93: the whole-file request ran all 200 pieces
        assert wait_for(lambda: metric(url, "sovits_request_outcomes_total", endpoint="/tts",
                                       outcome="cancelled_by_client") == 1)
        assert metric(url, "sovits_requests_total", endpoint="/tts", status="200") == mode  # a stream did send 200
        delivered = metric(url, "sovits_audio_seconds_total")  # only audio that went out: none of the whole
        assert delivered == 0 if mode == 0 else 0 < delivered < 0.5 * 10  # file, the first pieces of the stream
        assert httpx.get(f"{url}/health").json()["admitted"] == 0


def test_the_time_limit_answers_504_and_stops_the_work(tmp_path, refs) -> None:
    studio = ScriptedStudio(tmp_path, pieces=100, delay=0.05)
    app = make_app(studio, refs, request_timeout_s=0.5)
    with serving(app) as (url, _):
        t0 = time.monotonic()
        r = httpx.post(f"{url}/tts", json=tts_body(), timeout=30)
        assert r.status_code == 504 and "request_timeout_s" in r.json()["message"]
        assert time.monotonic() - t0 < 3
        assert studio.closed.wait(5) and studio.steps < 30
        assert metric(url, "sovits_request_outcomes_total", endpoint="/tts", outcome="timed_out") == 1


def test_whole_file_audio_is_capped_and_the_work_stops(tmp_path, refs) -> None:
    studio = ScriptedStudio(tmp_path, pieces=100, seconds=1.0)
    app = make_app(studio, refs, max_audio_seconds=3.0)

    async def calls(c):
        return await c.post("/tts", json=tts_body())

    r = asgi(app, calls)
    assert r.status_code == 400 and r.json()["message"].startswith("text:") and "max_audio_seconds" in r.text
    assert studio.closed.is_set() and studio.steps <= 4


def test_admission_is_decided_before_the_body_is_read(tmp_path, refs) -> None:
    studio = ScriptedStudio(tmp_path, pieces=50, delay=0.05)
    app = make_app(studio, refs, workers=1, max_queue=0)
    with serving(app) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        with httpx.Client(timeout=30) as c, ThreadRequest(c.post, f"{url}/tts", json=tts_body()):
            assert studio.started.wait(5)
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:  # a big upload, barely begun
                s.sendall(b"POST /tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 900000\r\n\r\n{\"text\": ")
                answer = read_answer(s)
        assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer.lower(), answer[:300]
        assert b"busy" in answer and b"internal error" not in answer
        assert metric(url, "sovits_request_outcomes_total", endpoint="/tts", outcome="rejected_busy") == 1


def read_answer(s: socket.socket) -> bytes:
    """One whole HTTP answer (headers and a Content-Length body) from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))
    while len(body) < length:
        body += s.recv(4096)
    return data[:len(head) + 4] + body


class ThreadRequest:
    """Run one blocking call in a thread for the length of a ``with`` block."""

    def __init__(self, fn, *args, **kwargs) -> None:
        self.thread = threading.Thread(target=lambda: self._run(fn, args, kwargs), daemon=True)
        self.result = None

    def _run(self, fn, args, kwargs) -> None:
        try:
            self.result = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - kept for the test to look at
            self.result = e

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.thread.join(30)


def test_upload_limit_holds_exactly_and_slow_bodies_and_headers_time_out(tmp_path, refs) -> None:
    app = make_app(ScriptedStudio(tmp_path), refs, max_upload_bytes=2000, body_timeout_s=0.5, header_timeout_s=0.5)
    with serving(app) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        fits = {"text": "x" * (2000 - len(json.dumps(tts_body(text="")))), **{k: v for k, v in tts_body().items()
                                                                                if k != "text"}}
        assert len(json.dumps(fits)) == 2000
        over = {**fits, "text": fits["text"] + "y"}
        assert httpx.post(f"{url}/tts", content=json.dumps(fits), timeout=30).status_code == 200

        def chunks(body: str):
            yield body[:1000].encode()
            yield body[1000:].encode()

        for body in (json.dumps(over),):  # no slack: one byte over is refused, declared or streamed
            assert httpx.post(f"{url}/tts", content=body, timeout=30).status_code == 413
            assert httpx.post(f"{url}/tts", content=chunks(body), timeout=30).status_code == 413
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # a body that stops coming
            s.sendall(b"POST /tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{")
            assert read_answer(s).startswith(b"HTTP/1.1 408")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # headers that never end
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            assert s.recv(4096) == b""  # closed by the server
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # a silent connection
            assert s.recv(4096) == b""
        assert time.monotonic() - t0 < 5


# ---- bounded shutdown -------------------------------------------------------------------------------


def test_shutdown_answers_queued_jobs_503_lets_running_ones_finish_and_health_says_draining(tmp_path, refs) -> None:
    studio = ScriptedStudio(tmp_path, pieces=20, delay=0.05, slots=1)  # the second request queues in the engine
    app = make_app(studio, refs, workers=1, max_queue=4, shutdown_grace_s=10)
    with serving(app) as (url, server):
        with httpx.Client(timeout=30) as c, ThreadRequest(c.post, f"{url}/tts", json=tts_body()) as running:
            assert studio.started.wait(5)
            with ThreadRequest(c.post, f"{url}/tts", json=tts_body()) as queued:
                assert wait_for(lambda: c.get(f"{url}/health").json()["queued"] == 1)
                health = c.get(f"{url}/health")  # the same keep-alive connection answers while draining
                app.state.context.drain()
                draining = c.get(f"{url}/health")
                assert wait_for(lambda: queued.result is not None, 5)
            t0 = time.monotonic()
            server.request_exit()
        assert health.json()["status"] == "ready" and health.json()["queued"] == 1
        assert draining.status_code == 503 and draining.json()["status"] == "draining"
        assert queued.result.status_code == 503 and "Retry-After" in queued.result.headers
        assert "shutting down" in queued.result.json()["message"]
        assert running.result.status_code == 200 and studio.steps == 20  # the running one finished in its grace
        assert time.monotonic() - t0 < 10


def test_shutdown_is_bounded_by_the_grace_period(tmp_path, refs) -> None:
    studio = ScriptedStudio(tmp_path, pieces=1000, delay=0.05, seconds=0.05)
    app = make_app(studio, refs, shutdown_grace_s=1)
    with serving(app) as (url, server):
        with ThreadRequest(httpx.post, f"{url}/tts", json=tts_body(streaming_mode=1), timeout=60):
            assert studio.started.wait(5)
            t0 = time.monotonic()
            server.request_exit()
            assert wait_for(lambda: not server.started or server.should_exit, 5)
            assert studio.closed.wait(10)  # cancelled once the grace ran out
        assert time.monotonic() - t0 < 8 and studio.steps < 1000


def test_a_whole_file_request_cut_by_the_grace_period_is_a_503_not_a_500(tmp_path, refs) -> None:
    studio = ScriptedStudio(tmp_path, pieces=1000, delay=0.05, seconds=0.01)
    app = make_app(studio, refs, shutdown_grace_s=1)
    with serving(app) as (url, server):
        with ThreadRequest(httpx.post, f"{url}/tts", json=tts_body(), timeout=60) as running:
            assert studio.started.wait(5)
            t0 = time.monotonic()
            server.request_exit()
            assert wait_for(lambda: running.result is not None, 10)
        assert studio.closed.wait(10) and studio.steps < 1000  # its work stopped
    assert running.result.status_code == 503 and "Retry-After" in running.result.headers
    assert "shutting down" in running.result.json()["message"] and time.monotonic() - t0 < 5


# ---- keys -----------------------------------------------------------------------------------------------


def test_an_api_key_guards_every_route_and_401s_are_counted(tmp_path, refs) -> None:
    settings = ServerSettings(reference_roots=(str(refs),), access=Access(api_keys=(KEY,)))
    app = create_app(ScriptedStudio(tmp_path), settings)

    async def calls(c):
        denied = [await c.get(p) for p in ("/health", "/metrics", "/tts", "/v1/voices", "/docs", "/nowhere")]
        denied.append(await c.post("/tts", json=tts_body(), headers={"Authorization": "Bearer wrong-key-000000000"}))
        ok = [await c.get("/health", headers={"X-API-Key": KEY}),
              await c.post("/tts", json=tts_body(), headers={"Authorization": f"Bearer {KEY}"})]
        return denied, ok, await c.get("/metrics", headers={"X-API-Key": KEY})

    denied, ok, metrics = asgi(app, calls)
    assert [r.status_code for r in denied] == [401] * 7 and [r.status_code for r in ok] == [200, 200]
    assert all(r.headers["www-authenticate"] == "Bearer" for r in denied)
    assert 'sovits_request_outcomes_total{endpoint="/tts",outcome="unauthorised"} 2' in metrics.text


def test_web_ui_logins_guard_the_api_and_401s_are_counted(tmp_path, refs) -> None:
    """The web UI mounts its page into the API app; the page has its own login, the API takes Basic."""
    from starlette.responses import PlainTextResponse

    settings = ServerSettings(reference_roots=(str(refs),), access=Access(logins=(("ann", "pw"),)))
    app = create_app(ScriptedStudio(tmp_path), settings)
    app.mount("/", lambda scope, receive, send: PlainTextResponse("page")(scope, receive, send))

    async def calls(c):
        return (await c.get("/tts"), await c.get("/tts", auth=("ann", "nope")), await c.get("/", auth=None),
                await c.get("/metrics", auth=("ann", "pw")))

    plain, wrong, page, metrics = asgi(app, calls)
    assert plain.status_code == wrong.status_code == 401 and page.text == "page"
    assert 'sovits_requests_total{endpoint="/tts",status="401"} 2' in metrics.text  # 60d1d93: not counted


# ---- no oracle, no leaks ---------------------------------------------------------------------------


def test_paths_outside_the_folders_read_the_same_whether_they_exist_or_not(tmp_path, refs) -> None:
    app = make_app(ScriptedStudio(tmp_path), refs)

    paths = (str(tmp_path / "secret.wav"), str(tmp_path / "nothing.wav"), "/etc/passwd", "/etc/nope", "../secret.wav",
             "a\x00b.wav", "x" * 100)  # NUL and a name too long for the file system: refused alike, not a 500

    async def calls(c):
        return [await c.post("/tts", json=tts_body(ref_audio_path=p)) for p in paths]

    answers = asgi(app, calls)
    messages = {r.json()["message"].replace(repr(p), "PATH") for r, p in zip(answers, paths)}
    assert all(r.status_code == 400 for r in answers)
    assert messages == {"ref_audio_path: PATH is not a file in the server's reference folders"}  # 60d1d93: two kinds

    async def long_and_nul(c):
        return [await c.post("/tts", json=tts_body(ref_audio_path="y" * 5000)),
                await c.get("/set_gpt_weights", params={"weights_path": "a\x00b"}),
                await c.get("/set_gpt_weights", params={"weights_path": "z" * 5000})]

    assert [r.status_code for r in asgi(app, long_and_nul)] == [400, 400, 400]


def test_error_bodies_carry_a_request_id_never_exception_text(tmp_path, refs, caplog) -> None:
    app = make_app(ScriptedStudio(tmp_path, fail_at=0), refs)

    async def calls(c):
        broken = await c.post("/tts", json=tts_body())
        junk = await c.post("/v1/voices", data={"name": "v", "prompt_text": "hi", "prompt_lang": "en"},
                            files={"audio": ("v.wav", b"RIFF not really audio at all")})
        return broken, junk

    with caplog.at_level(logging.WARNING, logger="studio.http"):
        broken, junk = asgi(app, calls)
    assert broken.status_code == 500 and junk.status_code == 400
    for r in (broken, junk):
        text = r.text
        assert "0x" not in text and "object at" not in text and "Error" not in text and "Traceback" not in text
        request_id = r.headers["x-request-id"]
        assert request_id in text
        assert any(request_id in rec.getMessage() for rec in caplog.records)  # the details are in the log


# ---- saved voices ----------------------------------------------------------------------------------


def _wav_bytes(samples: np.ndarray, sr: int = 16000, subtype: str = "FLOAT") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, sr, format="WAV", subtype=subtype)
    return buf.getvalue()


def test_saved_voices_are_checked_as_a_request_reference_at_save_time(tmp_path, refs) -> None:
    hour = io.BytesIO()  # an hour of silence, small as FLAC
    with sf.SoundFile(hour, "w", 8000, 1, format="FLAC", subtype="PCM_16") as f:
        for _ in range(60):
            f.write(np.zeros(8000 * 60, dtype=np.int16))
    nan = np.full(16000 * 4, np.nan, dtype=np.float32)
    silent = np.zeros(16000 * 4, dtype=np.float32)
    app = make_app(ScriptedStudio(tmp_path), refs)
    form = {"prompt_text": "Hello.", "prompt_lang": "en"}
    clips = {"nan": _wav_bytes(nan), "hour": hour.getvalue(), "silent": _wav_bytes(silent),
             "good": reference_wav(3)}

    async def calls(c):
        return {name: await c.post("/v1/voices", data={**form, "name": name},
                                   files={"audio": ("c.flac" if name == "hour" else "c.wav", clip)})
                for name, clip in clips.items()}

    answers = asgi(app, calls)
    for name in ("nan", "hour", "silent"):  # 60d1d93: 201, and a failure only when used
        r = answers[name]
        assert r.status_code == 400 and r.json()["error"]["param"] == "audio", (name, r.text)
    assert answers["good"].status_code == 201
    assert sorted(p.name for p in (refs.parent / "voices").iterdir()) == ["good"]


# ---- honest metrics ----------------------------------------------------------------------------------


def test_busy_is_a_503_that_says_busy_and_a_disconnect_mid_upload_is_not_a_500(tmp_path, refs) -> None:
    studio = ScriptedStudio(tmp_path, pieces=40, delay=0.05)
    app = make_app(studio, refs, workers=1, max_queue=0)
    with serving(app) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        with httpx.Client(timeout=30) as c, ThreadRequest(c.post, f"{url}/tts", json=tts_body()):
            assert studio.started.wait(5)
            busy = c.post(f"{url}/tts", json=tts_body())
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert "busy" in busy.json()["message"] and "internal error" not in busy.json()["message"]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:  # leave halfway through the upload
            s.sendall(b"POST /tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"text\": \"abc")
            time.sleep(0.2)
        assert wait_for(lambda: metric(url, "sovits_request_outcomes_total", endpoint="/tts",
                                       outcome="cancelled_by_client") == 1)
        assert metric(url, "sovits_requests_total", endpoint="/tts", status="500") == 0
        assert metric(url, "sovits_requests_total", endpoint="/tts", status="499") == 1
        assert metric(url, "sovits_request_outcomes_total", endpoint="/tts", outcome="rejected_busy") == 1


class CancellableResults:
    """An engine iterator like the serving scheduler's handle: one long step, and ``cancel()`` from any thread
    ends it at its next decode step (here: within 10 ms)."""

    def __init__(self) -> None:
        self.cancelled_at: float | None = None
        self.closed = threading.Event()

    def __iter__(self):
        return self

    def __next__(self):
        for _ in range(500):  # a 5 s step unless cancelled
            if self.cancelled_at is not None:
                raise StopIteration
            time.sleep(0.01)
        return Result(np.zeros(RATE, np.float32), RATE, "x", (), 0, 0, True, 1)

    def cancel(self) -> None:
        self.cancelled_at = self.cancelled_at or time.monotonic()

    def close(self) -> None:
        self.closed.set()


def test_a_client_leaving_cancels_a_scheduler_handle_at_once_not_at_the_next_result(tmp_path, refs) -> None:
    studio = ScriptedStudio(tmp_path)
    handle = CancellableResults()
    studio.synthesize = lambda *a, **k: handle
    app = make_app(studio, refs)
    with serving(app) as (url, _):
        left = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/tts", json=tts_body(), timeout=httpx.Timeout(30, read=0.3))
        assert wait_for(lambda: handle.cancelled_at is not None, 3)
        assert handle.cancelled_at - left < 1.5  # the 5 s step did not run to its end
        assert handle.closed.wait(3)  # and the worker closed the iterator


def test_the_engines_busy_error_is_a_503_with_its_retry_after(tmp_path, refs) -> None:
    from engine.errors import BusyError

    studio = ScriptedStudio(tmp_path)

    def busy(*a, **k):
        raise BusyError("every scheduler slot is taken", retry_after=7.2)

    studio.synthesize = busy
    app = make_app(studio, refs)

    async def calls(c):
        return await c.post("/tts", json=tts_body()), await c.get("/metrics")

    r, metrics = asgi(app, calls)
    assert r.status_code == 503 and r.headers["retry-after"] == "7" and "slot" in r.json()["message"]
    assert 'sovits_request_outcomes_total{endpoint="/tts",outcome="rejected_busy"} 1' in metrics.text
