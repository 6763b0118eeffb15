"""`sovits-studio loadtest`: the client's measurements against scripted fake servers (exact figures),
and the CI-size run against a real tiny-weights server on loopback (report fields only, no speed)."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import threading
import time
import wave
from collections import Counter
from contextlib import contextmanager

import pytest

from studio.cli import main
from studio.loadtest import LoadConfig, LoadTestError, WavMeter, parse_metrics, run_load

RATE = 16000  # the fake servers' audio: 16 kHz mono int16, 32000 bytes per second


def wav_header(rate: int = RATE, frames: int = 0) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x00" * frames)
    return buf.getvalue()[:44]


# ---- a scripted HTTP server ------------------------------------------------------------------


@contextmanager
def fake_server(handle):
    """An asyncio HTTP/1.1 server on a free loopback port in a thread. ``handle(path, body, writer)`` is
    an async function that writes the whole response. Yields (base URL, Counter of paths asked)."""
    hits: Counter[str] = Counter()
    ready = threading.Event()
    box: dict = {}

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        body = await reader.readexactly(length) if length else b""
        path = request_line.split()[1].decode()
        hits[path] += 1
        hits[f"from {writer.get_extra_info('peername')[0]}"] += 1
        try:
            await handle(path, body, writer)
            await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def serve() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(on_connection, "127.0.0.1", 0))
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
        yield f"http://127.0.0.1:{box['port']}", hits
    finally:
        box["loop"].call_soon_threadsafe(box["loop"].stop)
        thread.join(10)


def chunked(writer: asyncio.StreamWriter, piece: bytes) -> None:
    writer.write(b"%x\r\n" % len(piece) + piece + b"\r\n")


def metrics_answer(writer: asyncio.StreamWriter, rss_bytes: int) -> None:
    body = (f'# TYPE sovits_host_memory_bytes gauge\nsovits_host_memory_bytes{{kind="rss"}} {rss_bytes}\n'
            f'sovits_host_memory_bytes{{kind="peak_rss"}} {rss_bytes * 2}\n').encode()
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def streaming_tts(delay: float, pieces: int, piece_bytes: int, rss: int | None):
    """/tts streams a zero-frame WAV header after ``delay`` s, then ``pieces`` PCM pieces."""

    async def handle(path: str, body: bytes, writer: asyncio.StreamWriter) -> None:
        if path == "/metrics":
            if rss is None:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            else:
                metrics_answer(writer, rss)
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: audio/wav\r\nTransfer-Encoding: chunked\r\n\r\n")
        await asyncio.sleep(delay)
        chunked(writer, wav_header())
        for _ in range(pieces):
            chunked(writer, b"\x01\x00" * (piece_bytes // 2))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")

    return handle


# ---- measurements against fake servers -------------------------------------------------------


def test_streamed_wav_is_metered_from_its_header_and_bytes() -> None:
    with fake_server(streaming_tts(delay=0.2, pieces=5, piece_bytes=6400, rss=300 << 20)) as (url, hits):
        report = run_load(LoadConfig(url=url, clients=(1, 3), requests=3, duration_s=None, warmup=0))
    assert [lv["clients"] for lv in report["levels"]] == [1, 3]
    for level in report["levels"]:
        assert level["requests"] == level["completed"] == 3 and level["errors"] == {}
        for s in level["streams"]:
            assert s["sample_rate"] == RATE and s["status"] == 200 and s["error"] is None
            assert s["audio_s"] == pytest.approx(5 * 6400 / (2 * RATE))  # 1.0 s exactly
            assert 0.2 <= s["first_chunk_s"] < s["wall_s"]
        assert level["audio_s"] == pytest.approx(3.0)
        fc = level["first_chunk_s"]
        assert 0.2 <= fc["p50"] <= fc["p95"] <= fc["p99"] <= fc["max"]
        speed = level["stream_speed"]
        assert 0 < speed["min"] <= speed["p50"] <= speed["max"] and speed["below_real_time"] == 0
        assert level["audio_s_per_s"] == pytest.approx(level["audio_s"] / level["wall_s"], rel=1e-2)
        assert level["server_memory"]["rss_mb"] == {"start": 300.0, "peak": 300.0, "end": 300.0}
    assert hits["/tts"] == 6


def test_a_server_without_memory_metrics_is_asked_once_and_reported_na() -> None:
    with fake_server(streaming_tts(delay=0.0, pieces=1, piece_bytes=3200, rss=None)) as (url, hits):
        report = run_load(LoadConfig(url=url, clients=(2,), duration_s=0.5, warmup=1))
    level = report["levels"][0]
    assert level["server_memory"].startswith("n/a") and "404" in report["server_memory_source"]
    assert hits["/metrics"] == 1
    assert level["completed"] == level["requests"] >= 2  # closed loop: both clients went on until the deadline


def test_refusals_and_timeouts_are_counted_by_kind_with_their_message() -> None:
    async def handle(path: str, body: bytes, writer: asyncio.StreamWriter) -> None:
        if path == "/metrics":
            metrics_answer(writer, 1 << 20)
        elif b"busy" in body:
            message = b'{"message": "the server is busy; retry after 1 s"}'
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n"
                         % len(message) + message)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunked(writer, wav_header())
            await asyncio.sleep(30)  # never finishes: the client's timeout ends it

    with fake_server(handle) as (url, _):
        busy = run_load(LoadConfig(url=url, clients=(2,), requests=4, duration_s=None, warmup=0,
                                   text="busy"))
        t0 = time.perf_counter()
        stalled = run_load(LoadConfig(url=url, clients=(1,), requests=1, duration_s=None, warmup=0,
                                      timeout_s=0.5))
        assert time.perf_counter() - t0 < 10  # bounded by the 0.5 s timeout, not the 30 s stall
    level = busy["levels"][0]
    assert level["errors"] == {"503": 4} and level["completed"] == 0 and level["first_chunk_s"] is None
    assert "busy" in level["error_messages"]["503"]
    level = stalled["levels"][0]
    assert level["errors"] == {"timeout": 1} and level["streams"][0]["wall_s"] >= 0.5


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux routes all of 127.0.0.0/8 to itself")
def test_each_client_connects_from_a_loopback_address_of_its_own() -> None:
    """A server's per-address bounds (max_uploads_per_client) must see many users in a load test, as from many
    machines: each simulated client has its own source address, the same one for each of its requests."""
    with fake_server(streaming_tts(delay=0.0, pieces=1, piece_bytes=320, rss=1 << 20)) as (url, hits):
        report = run_load(LoadConfig(url=url, clients=(5,), requests=10, duration_s=None, warmup=0))
    assert report["levels"][0]["completed"] == 10
    sources = {k.removeprefix("from "): n for k, n in hits.items() if k.startswith("from ") and n}
    tts_sources = {a for a in sources if a != "127.0.0.1"}  # the /metrics probe keeps the system's address
    assert len(tts_sources) == 5 and all(a.startswith("127.") for a in tts_sources)


def test_fixed_arrival_rate_sends_on_schedule_and_counts_the_wait_for_a_slot() -> None:
    with fake_server(streaming_tts(delay=0.3, pieces=1, piece_bytes=3200, rss=1 << 20)) as (url, hits):
        report = run_load(LoadConfig(url=url, clients=(1,), rate=20.0, requests=4, duration_s=None, warmup=0))
    level = report["levels"][0]
    assert report["mode"] == "fixed arrival rate 20/s" and level["requests"] == 4 and hits["/tts"] == 4
    # one slot, 0.3 s per answer, arrivals every 0.05 s: the 4th waits for three answers before its own
    assert level["first_chunk_s"]["max"] >= 3 * 0.3 + 0.3 - 3 * 0.05


def test_wav_meter_reads_a_header_cut_anywhere_and_counts_only_declared_data() -> None:
    whole = wav_header(frames=800)
    with_tail = whole[:40] + (1600).to_bytes(4, "little") + b"\x02\x00" * 800 + b"LIST\x04\x00\x00\x00abcd"
    meter = WavMeter()
    for i in range(len(with_tail)):
        meter.feed(with_tail[i:i + 1])
    assert meter.sample_rate == RATE and meter.audio_s == pytest.approx(800 / RATE)
    bad = WavMeter()
    bad.feed(b"ID3\x04 this is an mp3 file")
    assert bad.error and bad.audio_s == 0


def test_metrics_text_parsing() -> None:
    text = ('# HELP a b\nsovits_host_memory_bytes{kind="rss"} 1.5e9\nprocess_resident_memory_bytes 42 1700000\n'
            'x{a="p,q\\"r",b="2"} +Inf\nnot a sample\n')
    parsed = parse_metrics(text)
    assert parsed["sovits_host_memory_bytes"] == [({"kind": "rss"}, 1.5e9)]
    assert parsed["process_resident_memory_bytes"] == [({}, 42.0)]
    assert parsed["x"][0][0] == {"a": 'p,q"r', "b": "2"}


def test_settings_that_would_not_end_or_make_no_sense_are_refused() -> None:
    with pytest.raises(LoadTestError, match="duration or a request count"):
        LoadConfig(duration_s=None, requests=None)
    with pytest.raises(LoadTestError, match="clients"):
        LoadConfig(clients=(0,))
    for url in ("ftp://x", "http://127.0.0.1:port", "127.0.0.1:9880"):
        with pytest.raises(LoadTestError, match="url"):
            LoadConfig(url=url)
    with pytest.raises(LoadTestError, match="does not answer"):
        run_load(LoadConfig(url="http://127.0.0.1:9", requests=1, warmup=0))


# ---- the CI-size run: a real server with tiny weights ----------------------------------------


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    from engine.studio import Studio
    from engine.testweights import make_test_weights
    from studio.http.app import create_app
    from studio.http.context import ServerSettings
    from studio.http.limits import ServerLimits
    from tests.support.server import running_server

    root = tmp_path_factory.mktemp("loadtest")
    studio = Studio.from_config(str(make_test_weights(root / "weights", "v2")))
    settings = ServerSettings(profiles_dir=str(root / "voices"), limits=ServerLimits(max_tokens_per_sentence=10, workers=1))
    with running_server(create_app(studio, settings)) as url:
        yield url


def test_ci_size_loadtest_of_a_tiny_server_reports_every_field(tiny_server, tmp_path, capsys) -> None:
    out, png = tmp_path / "report.json", tmp_path / "sweep.png"
    assert main(["loadtest", "--url", tiny_server, "--clients", "1,2", "--duration", "1", "--json",
                 "--out", str(out), "--png", str(png)]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert json.loads(out.read_text(encoding="utf-8")) == report
    assert report["endpoint"] == "/tts" and report["mode"] == "closed loop"
    assert report["workload"]["streaming_mode"] == 2 and report["server_memory_source"] == "from /metrics"
    assert [lv["clients"] for lv in report["levels"]] == [1, 2]
    for level in report["levels"]:
        assert level["completed"] == level["requests"] >= level["clients"] and level["errors"] == {}
        fc, speed = level["first_chunk_s"], level["stream_speed"]
        assert 0 < fc["p50"] <= fc["p95"] <= fc["p99"] <= fc["max"]
        assert 0 < speed["min"] <= speed["p50"] <= speed["max"]
        assert level["audio_s"] == pytest.approx(sum(s["audio_s"] for s in level["streams"]), abs=1e-3)
        assert level["audio_s_per_s"] > 0
        assert all(s["sample_rate"] == 32000 and s["audio_s"] > 0 for s in level["streams"])
        rss = level["server_memory"]["rss_mb"]
        assert 0 < rss["start"] <= rss["peak"] and rss["end"] <= rss["peak"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not png.exists() and "matplotlib" in captured.err
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ci_size_openai_speech_load(tiny_server, capsys) -> None:
    assert main(["loadtest", "--url", tiny_server, "--endpoint", "speech", "--clients", "2", "--requests", "2",
                 "--warmup", "0"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("clients") and table[1].split()[:3] == ["2", "2", "2"]
    import httpx

    assert httpx.get(f"{tiny_server}/v1/voices").json() == {"voices": []}  # the run's own voice is deleted


def test_the_default_workload_is_the_bench_s() -> None:
    from studio.bench import REF_TEXT, TEXTS
    from studio import loadtest

    assert loadtest.TEXT == TEXTS["medium"] and loadtest.REF_TEXT == REF_TEXT
    clip = loadtest.synthetic_reference()
    meter = WavMeter()
    meter.feed(clip)
    assert 3.0 <= meter.audio_s <= 10.0  # the length a reference must have


def test_ci_size_product_mix_of_a_tiny_server(tiny_server, tmp_path, capsys) -> None:
    """--mix through the real server: three languages through the text front end, a clip of its own per
    client, streams and whole files; every (mode, language) pair answered."""
    from tests.cli.test_loadtest_mix import CLIPS, tone

    clips = []
    for i, (name, (lang, text, rate)) in enumerate(CLIPS.items()):
        (tmp_path / name).write_bytes(tone(rate, 3.5, 180 + 40 * i))  # 3-10 s, as references must be
        clips.append({"file": name, "language": lang, "text": text})
    (tmp_path / "manifest.json").write_text(json.dumps({"clips": clips}, ensure_ascii=False), encoding="utf-8")
    assert main(["loadtest", "--url", tiny_server, "--mix", "--ref-dir", str(tmp_path), "--clients", "2",
                 "--requests", "6", "--warmup", "0", "--json"]) == 0
    level = json.loads(capsys.readouterr().out)["levels"][0]
    assert level["errors"] == {} and level["completed"] == 6
    assert sorted(level["by_mode_language"]) == sorted(f"{m}/{lang}" for m in ("stream", "whole file")
                                                       for lang in ("zh", "en", "ja"))
    assert all(s["audio_s"] > 0 and s["status"] == 200 for s in level["streams"])
    assert level["first_chunk_s"]["p50"] > 0 and level["whole_file_s"]["p50"] > 0


def test_the_engine_figures_of_a_level_come_from_two_scrapes_of_its_counters() -> None:
    from studio.loadtest.server_memory import engine_work, work_figures

    def scrape(steps: int, tokens: int, decode_s: float, prefills: int, rows: int, prefill_s: float) -> dict:
        text = (f'sovits_engine_work_total{{kind="decode_steps"}} {steps}\n'
                f'sovits_engine_work_total{{kind="tokens"}} {tokens}\n'
                f'sovits_engine_work_total{{kind="prefills"}} {prefills}\n'
                f'sovits_engine_work_total{{kind="prefill_rows"}} {rows}\n'
                f'sovits_engine_busy_seconds_total{{stage="decode"}} {decode_s}\n'
                f'sovits_engine_busy_seconds_total{{stage="prefill"}} {prefill_s}\n'
                f'sovits_engine_occupancy_seconds_total{{place="decoding"}} {steps / 10}\n'
                f'sovits_cache_hits_total{{cache="reference"}} {prefills}\n'
                f'sovits_cache_misses_total{{cache="reference"}} {rows - prefills}\n'
                'sovits_cache_hits_total{cache="model_pool"} 7\n'
                'sovits_acoustic_graph_captures_total{phase="serving"} 3\n')
        return engine_work(parse_metrics(text))

    first = (10.0, scrape(100, 1000, 0.5, 4, 4, 0.2))
    last = (12.0, scrape(300, 9000, 1.1, 9, 24, 0.7))
    got = work_figures(first, last)
    assert got["decode_steps_per_s"] == 100.0 and got["rows_per_step"] == 40.0 and got["ms_per_step"] == 3.0
    assert got["decode_busy"] == 0.3 and got["prefill_busy"] == 0.25
    assert got["prefills_per_s"] == 2.5 and got["rows_per_prefill"] == 4.0 and got["ms_per_prefill"] == 100.0
    assert got["acoustic_captures"] == 0  # 3 before, 3 after
    assert got["reference_hit_ratio"] == 0.25  # 5 hits, 15 misses
    assert got["mean_decoding"] == 10.0 and "mean_admitted" not in got  # (30 - 10) row-seconds over 2 s
    assert engine_work(parse_metrics("sovits_host_memory_bytes{kind=\"rss\"} 5\n")) == {}  # an older server
