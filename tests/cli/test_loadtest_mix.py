"""`sovits-studio loadtest --mix`, the product workload, against scripted fake servers: every client's
upload is its own (bytes unique per client, the folder clip plus zeros, its exact transcript), the
(mode, language) pairs come in equal shares, the figures are split per mode and language, and
connection failures are counted (a thousand clients at once included)."""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import io
import json
import threading
import wave
from collections import Counter, defaultdict
from contextlib import contextmanager

import pytest

from engine.stream_stats import percentile
from studio.cli import main
from studio.loadtest import LoadConfig, LoadTestError, format_table, run_load
from studio.loadtest.mix import TEXTS, append_silence, load_mix
from studio.loadtest.run import raise_open_files_limit
from tests.cli.test_loadtest import RATE, chunked, metrics_answer, wav_header

CLIPS = {"zh_a.wav": ("zh", "今天天气很好，我们去公园散步吧。", 24000),
         "en_b.wav": ("en", "Yesterday I walked to the old library.", 22050),
         "ja_c.wav": ("ja", "今日はとても良い天気です。", 16000)}


def tone(rate: int, seconds: float, freq: float) -> bytes:
    import math

    frames = bytearray()
    for i in range(int(rate * seconds)):
        frames += int(8000 * math.sin(2 * math.pi * freq * i / rate)).to_bytes(2, "little", signed=True)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(frames))
    return buf.getvalue()


@pytest.fixture()
def refset(tmp_path):
    folder = tmp_path / "refset"
    folder.mkdir()
    clips = []
    for i, (name, (lang, text, rate)) in enumerate(CLIPS.items()):
        (folder / name).write_bytes(tone(rate, 0.25, 200 + 50 * i))
        clips.append({"file": name, "language": lang, "text": text, "duration_s": 0.25})
    (folder / "manifest.json").write_text(json.dumps({"clips": clips}, ensure_ascii=False), encoding="utf-8")
    return folder


def parse_form(body: bytes, content_type: str) -> dict[str, bytes]:
    """A multipart/form-data body -> {field: bytes}, and "_filename": the uploaded clip's file name."""
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    form = {part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
            for part in msg.iter_parts()}
    form["_filename"] = next(p.get_filename() for p in msg.iter_parts() if p.get_filename())
    return form


@contextmanager
def typed_fake_server(handle):
    """An asyncio HTTP/1.1 server on a free loopback port in a thread; ``handle(path, body, writer,
    content_type)`` writes the whole response. Yields the base URL."""
    ready = threading.Event()
    box: dict = {}

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await reader.readline()
            headers = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            body = await reader.readexactly(length) if length else b""
            await handle(request_line.split()[1].decode(), body, writer, headers.get("content-type", ""))
            await writer.drain()
        except (ConnectionError, asyncio.CancelledError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def serve() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(on_connection, "127.0.0.1", 0, backlog=2048))
        box.update(loop=loop, port=server.sockets[0].getsockname()[1])
        ready.set()
        loop.run_forever()
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{box['port']}"
    finally:
        box["loop"].call_soon_threadsafe(box["loop"].stop)
        thread.join(10)


def mixed_server(seen: list[dict], stream_delay: float = 0.05, file_delay: float = 0.3, fail_every: int = 0,
                 count: Counter | None = None, together: int = 0):
    """/tts: mode 2 streams a header at once, audio after ``stream_delay`` s; mode 0 answers one whole WAV
    of 0.5 s after ``file_delay`` s. Every ``fail_every``-th request's connection is closed unanswered.
    With ``count``, forms are not parsed (cheap for many clients) and ``count`` gets "in_flight_max".
    With ``together``, a stream's audio waits until that many requests are in flight at once (at most
    ``stream_delay`` s: a client that serialises its clients is answered late, not never)."""
    parse = count is None
    count = Counter() if count is None else count
    all_in = asyncio.Event()

    async def handle(path: str, body: bytes, writer: asyncio.StreamWriter, content_type: str = "") -> None:
        if path == "/metrics":
            metrics_answer(writer, 1 << 20)
            return
        if parse:
            seen.append(parse_form(body, content_type))
        count["n"] += 1
        if fail_every and count["n"] % fail_every == 0:
            return  # closed with no answer
        count["in_flight"] += 1
        count["in_flight_max"] = max(count["in_flight_max"], count["in_flight"])
        if together and count["in_flight"] >= together:
            all_in.set()
        try:
            await answer(b'name="streaming_mode"\r\n\r\n2\r\n' in body, writer)
        finally:
            count["in_flight"] -= 1

    async def answer(stream: bool, writer: asyncio.StreamWriter) -> None:
        if stream:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: audio/wav\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunked(writer, wav_header())
            await writer.drain()
            if together:
                try:
                    await asyncio.wait_for(all_in.wait(), stream_delay)
                except asyncio.TimeoutError:  # (TimeoutError itself from Python 3.11)
                    pass
            else:
                await asyncio.sleep(stream_delay)
            chunked(writer, b"\x01\x00" * (RATE // 2))  # 0.5 s
            writer.write(b"0\r\n\r\n")
        else:
            await asyncio.sleep(file_delay)
            data = wav_header(frames=RATE // 2)[:40] + (RATE).to_bytes(4, "little") + b"\x01\x00" * (RATE // 2)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: audio/wav\r\nContent-Length: %d\r\n\r\n" % len(data) + data)

    return handle


def _frames(wav_bytes: bytes) -> tuple[int, bytes]:
    with wave.open(io.BytesIO(wav_bytes), "rb") as r:
        return r.getframerate(), r.readframes(r.getnframes())


def test_each_client_uploads_its_own_clip_and_the_pairs_come_in_equal_shares(refset) -> None:
    seen: list[dict] = []
    mix = load_mix(refset)
    with typed_fake_server(mixed_server(seen)) as url:
        report = run_load(LoadConfig(url=url, clients=(2, 4), requests=12, duration_s=None, warmup=2, mix=mix))
    assert len(seen) == 2 + 12 + 12
    originals = {name: _frames((refset / name).read_bytes()) for name in CLIPS}
    by_client: dict[str, set[bytes]] = defaultdict(set)
    for form in seen:
        clip = form["ref_audio"]
        rate, frames = _frames(clip)
        base = next(n for n, (r, f) in originals.items() if frames.startswith(f) and r == rate)
        lang, text, _ = CLIPS[base]
        extra = frames[len(originals[base][1]):]
        assert extra and set(extra) == {0}  # the folder clip, then zero samples only
        assert form["prompt_text"].decode() == text and form["prompt_lang"].decode() == lang  # its own transcript
        assert form["text"].decode() == TEXTS[form["text_lang"].decode()]
        by_client[form["_filename"]].add(clip)
    # one clip per client, and no two clients (2 warm-up + 2 + 4 of the levels) share bytes
    assert len(by_client) == 8 and all(len(clips) == 1 for clips in by_client.values())
    assert len({next(iter(c)) for c in by_client.values()}) == 8
    for level in report["levels"]:
        pairs = level["by_mode_language"]
        assert sorted(pairs) == sorted(f"{m}/{lang}" for m in ("stream", "whole file") for lang in ("zh", "en", "ja"))
        assert all(p["requests"] == 2 and p["completed"] == 2 for p in pairs.values())  # 12 = 6 pairs x 2
        # first chunk and stream speed come from the streams only, whole files apart: the figures are those of
        # the level's own records of each kind (whatever their times were on this machine)
        assert level["stream_requests"] == {"sent": 6, "completed": 6}
        streams = [r for r in level["streams"] if r["tag"].startswith("stream/")]
        files = [r for r in level["streams"] if r["tag"].startswith("whole file/")]
        assert len(streams) == len(files) == 6
        assert level["first_chunk_s"]["max"] == round(max(r["first_chunk_s"] for r in streams), 4)
        assert level["first_chunk_s"]["p50"] == round(percentile([r["first_chunk_s"] for r in streams], 50), 4)
        assert level["whole_file_s"]["p50"] == round(percentile([r["wall_s"] for r in files], 50), 4)
        assert level["by_mode"]["whole file"]["first_chunk_s"]["max"] == round(
            max(r["first_chunk_s"] for r in files), 4)
        assert level["by_mode"]["stream"]["audio_s"] == pytest.approx(3.0)  # 6 x 0.5 s
        assert level["by_language"]["ja"]["requests"] == 4
        assert {s["tag"] for s in level["streams"]} == set(pairs)
    table = format_table(report)
    assert "per mode and language" in table and "whole file/ja" in table
    assert report["workload"]["mix"]["modes"] == [2, 0] and "text" not in report["workload"]


def test_connection_failures_are_counted_and_a_thousand_clients_run_at_once(refset) -> None:
    limits = raise_open_files_limit(2300)  # both ends of 1000 connections live in this process
    if limits["soft"] != -1 and limits["soft"] < 2300:
        pytest.skip(f"this machine allows {limits['soft']} open files")
    count: Counter = Counter()
    mix = load_mix(refset, ("en",), (2,))
    with typed_fake_server(mixed_server([], stream_delay=60.0, fail_every=10, count=count, together=900)) as url:
        report = run_load(LoadConfig(url=url, clients=(1000,), requests=1000, duration_s=None, warmup=0, mix=mix,
                                     timeout_s=120))
    level = report["levels"][0]
    assert level["requests"] == 1000 and count["n"] == 1000
    assert level["errors"] == {"incomplete": 100} and level["completed"] == 900
    assert level["error_messages"]["incomplete"]
    # all 900 answered ones were open together (each held until then): the client does not serialise its clients
    assert count["in_flight_max"] == 900


def test_mix_settings_are_checked(refset, tmp_path) -> None:
    with pytest.raises(LoadTestError, match="manifest.json"):
        load_mix(tmp_path / "nowhere")
    with pytest.raises(LoadTestError, match="no text for ko"):
        load_mix(refset, ("ko",))
    (refset / "en_b.wav").write_bytes(b"ID3 not a wav")
    with pytest.raises(LoadTestError, match="not a PCM WAV"):
        load_mix(refset)

    good = tmp_path / "good"
    good.mkdir()
    (good / "a.wav").write_bytes(tone(16000, 0.1, 300))
    (good / "manifest.json").write_text(json.dumps({"clips": [{"file": "a.wav", "text": "hi", "language": "en"}]}))
    with pytest.raises(LoadTestError, match="drop --ref"):
        LoadConfig(mix=load_mix(good), ref_audio=b"x")
    with pytest.raises(LoadTestError, match="only /tts"):
        LoadConfig(mix=load_mix(good), endpoint="speech")
    assert main(["loadtest", "--mix", "--text", "hello", "--ref-dir", str(good)]) != 0
    assert main(["loadtest", "--ref-dir", str(good)]) != 0  # --ref-dir without --mix


def test_appended_silence_is_exact() -> None:
    clip = tone(16000, 0.1, 300)
    longer = append_silence(clip, 7)
    rate, frames = _frames(longer)
    assert rate == 16000 and frames == _frames(clip)[1] + b"\x00\x00" * 7
