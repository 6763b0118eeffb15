"""Load a running server over HTTP: N concurrent streaming clients, and what they got.

Responsibilities: (1) drive ``/tts`` (api_v2, any ``streaming_mode``) or ``/v1/audio/speech`` with
closed-loop clients or at a fixed arrival rate, bounded by a duration and/or a request count;
(2) measure each stream from the client side (first audio byte, audio seconds from the WAV
header's format and the bytes received) and the server's memory from ``/metrics`` when it exposes
it. The client is the standard library only (asyncio streams, one connection per request), so one
thread carries thousands of streams and the tool runs against any api_v2 server.

Timing: a request's clock starts when it is due: when its client sends it (closed loop) or at its
scheduled arrival (fixed rate, so waiting for a free client slot counts, as a user would feel it).
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import re
import ssl
import struct
import time
import uuid
import wave
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from engine.errors import OptionsError
from engine.stream_stats import StreamSample, format_summary, summarize

# The bench's workload (engine.benchmark REF_TEXT and TEXTS["medium"]), so both report the same work.
REF_TEXT = "今天天气很好，我们一起去公园散步吧。"
TEXT = "这是一个用于测试语音合成速度的句子。我们希望它听起来自然流畅，并且速度足够快。"
ENDPOINTS = {"tts": "/tts", "speech": "/v1/audio/speech"}
VOICE_PREFIX = "loadtest-"  # a voice saved for the run (and deleted after it) when none is named
_READ = 1 << 16
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")  # name{labels} value [timestamp]
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# /metrics series that carry the server process's resident memory: ours, then the Prometheus client's
RSS_SERIES = (("sovits_host_memory_bytes", {"kind": "rss"}), ("process_resident_memory_bytes", {}))
DEVICE_SERIES = ("sovits_device_memory_bytes", {"kind": "allocated"})


class LoadTestError(OptionsError):
    """The load test cannot run as asked (bad settings, server unreachable)."""


@dataclass(frozen=True)
class LoadConfig:
    """One load test. Every level of ``clients`` runs the same workload."""

    url: str = "http://127.0.0.1:9880"
    endpoint: str = "tts"  # "tts": api_v2 /tts; "speech": OpenAI /v1/audio/speech (whole file today)
    clients: tuple[int, ...] = (1,)  # concurrent clients per level (with ``rate``: most requests in flight)
    rate: float | None = None  # fixed arrival rate in requests/s; None: closed loop (each client back to back)
    duration_s: float | None = 30.0  # per level: no request starts after this
    requests: int | None = None  # per level: at most this many requests (either bound may be None, not both)
    timeout_s: float = 300.0  # one request, from due to last byte
    warmup: int = 1  # requests sent one by one before the first level, not counted
    text: str = TEXT
    text_lang: str = "zh"
    streaming_mode: int = 2  # api_v2: 0 whole file, 1 per sentence, 2 token chunks, 3 fixed chunks
    ref_audio: bytes | None = None  # uploaded with each /tts request; None and no ref_path: a built-in clip
    ref_path: str | None = None  # a server-side ref_audio_path instead of an upload
    prompt_text: str = REF_TEXT
    prompt_lang: str = "zh"
    voice: str | None = None  # /v1/audio/speech voice; None: save the reference for the run, delete it after
    seed: int = 1
    fields: tuple[tuple[str, Any], ...] = ()  # more request fields (name, value), e.g. ("top_k", 5)
    memory_interval_s: float = 1.0  # /metrics scrape period while a level runs

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise LoadTestError(f"endpoint: {self.endpoint!r} is not one of {', '.join(ENDPOINTS)}")
        if not self.clients or any(not isinstance(c, int) or c < 1 for c in self.clients):
            raise LoadTestError(f"clients: give positive integers, got {self.clients!r}")
        if self.duration_s is None and self.requests is None:
            raise LoadTestError("give a duration or a request count (or both): the test must end by itself")
        if self.duration_s is not None and not self.duration_s > 0:
            raise LoadTestError(f"duration: must be > 0 seconds, got {self.duration_s!r}")
        if self.requests is not None and self.requests < 1:
            raise LoadTestError(f"requests: must be >= 1, got {self.requests!r}")
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise LoadTestError(f"rate: must be > 0 requests/s, got {self.rate!r}")
        if not self.timeout_s > 0:
            raise LoadTestError(f"timeout: must be > 0 seconds, got {self.timeout_s!r}")
        if self.streaming_mode not in (0, 1, 2, 3):
            raise LoadTestError(f"streaming_mode: {self.streaming_mode!r} is not one of 0, 1, 2, 3")
        if self.warmup < 0:
            raise LoadTestError(f"warmup: must be >= 0, got {self.warmup!r}")
        split = urlsplit(self.url)
        try:
            split.port  # noqa: B018 - raises on a port that is not a number in range
        except ValueError:
            split = None
        if split is None or split.scheme not in ("http", "https") or not split.hostname:
            raise LoadTestError(f"url: {self.url!r} is not an http(s)://HOST[:PORT] address")


# ---- HTTP/1.1, one connection per request --------------------------------------------------


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    tls: bool
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        s = urlsplit(url)
        return cls(s.hostname or "127.0.0.1", s.port or (443 if s.scheme == "https" else 80), s.scheme == "https",
                   s.path.rstrip("/"))


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes = b""
    content_type: str | None = None

    def encode(self, target: Target) -> bytes:
        host = f"[{target.host}]" if ":" in target.host else target.host
        lines = [f"{self.method} {target.base_path}{self.path} HTTP/1.1", f"Host: {host}:{target.port}",
                 "User-Agent: sovits-studio-loadtest", "Accept: */*", "Connection: close"]
        if self.method != "GET" or self.body:
            lines.append(f"Content-Length: {len(self.body)}")
        if self.content_type:
            lines.append(f"Content-Type: {self.content_type}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


class IncompleteResponse(Exception):
    """The connection closed before the response said it was complete."""


async def exchange(target: Target, request: Request, on_status: Callable[[int], None],
                   on_body: Callable[[bytes], None]) -> int:
    """Send ``request``; call ``on_status`` with the status code once the headers are in, then
    ``on_body`` with each piece of the body as it arrives (chunked, Content-Length or
    close-delimited); returns the status code."""
    reader, writer = await asyncio.open_connection(target.host, target.port,
                                                   ssl=ssl.create_default_context() if target.tls else None,
                                                   limit=_READ)
    try:
        writer.write(request.encode(target))
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise IncompleteResponse(f"not an HTTP response: {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if not line.endswith(b"\n"):
                raise IncompleteResponse("the connection closed inside the headers")
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        on_status(status)
        if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return status
        if "chunked" in headers.get("transfer-encoding", "").lower():
            await _read_chunked(reader, on_body)
        elif headers.get("content-length", "").isdigit():
            await _read_exactly(reader, int(headers["content-length"]), on_body)
        else:
            while piece := await reader.read(_READ):
                on_body(piece)
        return status
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (OSError, ssl.SSLError):
            pass


async def _read_exactly(reader: asyncio.StreamReader, n: int, on_body: Callable[[bytes], None]) -> None:
    while n > 0:
        piece = await reader.read(min(n, _READ))
        if not piece:
            raise IncompleteResponse(f"the connection closed with {n} body bytes still due")
        on_body(piece)
        n -= len(piece)


async def _read_chunked(reader: asyncio.StreamReader, on_body: Callable[[bytes], None]) -> None:
    while True:
        line = await reader.readline()
        if not line.endswith(b"\n"):
            raise IncompleteResponse("the connection closed before the last chunk")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise IncompleteResponse(f"bad chunk size line {line[:40]!r}") from None
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return
        await _read_exactly(reader, size, on_body)
        await reader.readexactly(2)  # CRLF after the chunk


# ---- what a stream delivered ---------------------------------------------------------------


class WavMeter:
    """Counts the audio of a WAV body as it arrives: the header (``fmt `` gives the byte rate, the
    ``data`` chunk where samples start), then PCM bytes. A streamed WAV declares 0 (or 0xFFFFFFFF)
    data bytes and runs to the end; a whole file counts only its declared data."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._head = b""
        self.byte_rate: int | None = None  # bytes per second of audio
        self.sample_rate: int | None = None
        self._declared: int | None = None
        self.data_bytes = 0
        self.first_audio_at: float | None = None
        self.error: str | None = None

    def feed(self, piece: bytes) -> None:
        if self.error:
            return
        if self._declared is None:
            self._head += piece
            piece = self._parse_header()
            if self._declared is None:
                return
        if piece and self.first_audio_at is None:
            self.first_audio_at = self._clock()
        self.data_bytes += len(piece)

    def _parse_header(self) -> bytes:
        h = self._head
        if len(h) >= 12 and (h[:4] != b"RIFF" or h[8:12] != b"WAVE"):
            self.error = "not a WAV stream"
            return b""
        pos = 12
        while len(h) >= pos + 8:
            cid, size = h[pos:pos + 4], struct.unpack("<I", h[pos + 4:pos + 8])[0]
            if cid == b"data":
                if self.byte_rate is None:
                    self.error = "the WAV data chunk comes before its fmt chunk"
                    return b""
                self._declared = size
                return h[pos + 8:]
            if len(h) < pos + 8 + size:
                return b""
            if cid == b"fmt ":
                _, channels, rate, _, _, bits = struct.unpack("<HHIIHH", h[pos + 8:pos + 24])
                self.sample_rate, self.byte_rate = rate, rate * channels * max(1, bits // 8)
            pos += 8 + size + (size & 1)
        return b""

    @property
    def audio_bytes(self) -> int:
        if self._declared in (None, 0, 0xFFFFFFFF):
            return self.data_bytes
        return min(self.data_bytes, self._declared)

    @property
    def audio_s(self) -> float:
        return self.audio_bytes / self.byte_rate if self.byte_rate else 0.0


@dataclass
class StreamRecord:
    """One request as the client saw it (seconds from when it was due)."""

    status: int | None
    first_chunk_s: float | None
    wall_s: float
    audio_s: float
    sample_rate: int | None
    error: str | None
    message: str = ""

    def sample(self) -> StreamSample:
        return StreamSample(self.first_chunk_s, self.wall_s, self.audio_s, self.error)


async def timed_stream(target: Target, request: Request, due: float, timeout_s: float) -> StreamRecord:
    """Run one request, due at ``due`` (a perf_counter time), metering its WAV body."""
    meter = WavMeter()
    status: list[int] = []
    refusal = bytearray()  # the body of a non-200 answer (its message), first 2000 bytes

    def on_body(piece: bytes) -> None:
        if status[0] == 200:
            meter.feed(piece)
        elif len(refusal) < 2000:
            refusal.extend(piece[:2000 - len(refusal)])

    error: str | None = None
    message = ""
    try:
        remaining = max(timeout_s - (time.perf_counter() - due), 0.001)
        await asyncio.wait_for(exchange(target, request, status.append, on_body), remaining)
        if status[0] != 200:
            error, message = str(status[0]), _message(bytes(refusal))
        elif meter.error:
            error, message = "bad_wav", meter.error
        elif meter.audio_bytes == 0:
            error = "no_audio"
    except asyncio.TimeoutError:
        error, message = "timeout", f"no complete answer within {timeout_s:g} s"
    except (IncompleteResponse, asyncio.IncompleteReadError) as e:
        error, message = "incomplete", str(e)
    except OSError as e:
        error, message = "connection", str(e) or type(e).__name__
    end = time.perf_counter()
    first = meter.first_audio_at - due if meter.first_audio_at is not None else None
    return StreamRecord(status[0] if status else None, first, end - due, meter.audio_s, meter.sample_rate,
                        error, message)


def _message(body: bytes) -> str:
    """The message of an error answer ({"message": ...}, OpenAI's {"error": {"message": ...}}, or text)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict) and "message" in inner:
            return str(inner["message"])[:200]
        if "message" in data:
            return str(data["message"])[:200]
    return text[:200]


# ---- requests ------------------------------------------------------------------------------


def synthetic_reference(seconds: float = 4.0, rate: int = 16000) -> bytes:
    """A deterministic voiced-like WAV clip (a harmonic series with a moving pitch and a syllable-like
    envelope) for servers the user gives no clip for; 3-10 s, as references must be."""
    import array

    samples = array.array("h")
    phase = 0.0
    for i in range(int(seconds * rate)):
        t = i / rate
        phase += 2 * math.pi * (140 + 30 * math.sin(2 * math.pi * 0.7 * t)) / rate
        envelope = 0.5 + 0.5 * math.sin(2 * math.pi * 3.0 * t) ** 2
        voice = sum(math.sin(k * phase) / k for k in range(1, 8))
        samples.append(int(max(-1.0, min(1.0, 0.22 * voice * envelope)) * 32767))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return buf.getvalue()


def multipart(fields: dict[str, Any], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    """A multipart/form-data body and its content type."""
    boundary = uuid.uuid4().hex
    out = io.BytesIO()
    for name, value in fields.items():
        text = json.dumps(value) if isinstance(value, bool) else str(value)
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode())
        out.write(text.encode("utf-8") + b"\r\n")
    for name, (filename, data) in files.items():
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                  f"Content-Type: application/octet-stream\r\n\r\n".encode())
        out.write(data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


def build_request(cfg: LoadConfig, voice: str | None = None) -> Request:
    """The one request every client sends (built once: its bytes are reused)."""
    extra = dict(cfg.fields)
    if cfg.endpoint == "speech":
        body = {"model": "tts-1", "input": cfg.text, "voice": voice or cfg.voice,
                "response_format": "wav", "language": cfg.text_lang, "seed": cfg.seed, **extra}
        return Request("POST", ENDPOINTS["speech"], json.dumps(body).encode(), "application/json")
    fields = {"text": cfg.text, "text_lang": cfg.text_lang, "prompt_text": cfg.prompt_text,
              "prompt_lang": cfg.prompt_lang, "media_type": "wav", "streaming_mode": cfg.streaming_mode,
              "seed": cfg.seed, **extra}
    if cfg.ref_path is not None:
        return Request("POST", ENDPOINTS["tts"], json.dumps({**fields, "ref_audio_path": cfg.ref_path}).encode(),
                       "application/json")
    body, ctype = multipart(fields, {"ref_audio": ("reference.wav", cfg.ref_audio or synthetic_reference())})
    return Request("POST", ENDPOINTS["tts"], body, ctype)


async def simple(target: Target, request: Request, timeout_s: float = 30.0) -> tuple[int, bytes]:
    """A small request answered whole: (status, body)."""
    status: list[int] = []
    body = bytearray()
    await asyncio.wait_for(exchange(target, request, status.append, body.extend), timeout_s)
    return status[0], bytes(body)


async def save_voice(target: Target, cfg: LoadConfig) -> str:
    """Save the reference as a voice of this run's own name for /v1/audio/speech (deleted afterwards)."""
    name = f"{VOICE_PREFIX}{uuid.uuid4().hex[:8]}"
    body, ctype = multipart({"name": name, "prompt_text": cfg.prompt_text, "prompt_lang": cfg.prompt_lang},
                            {"audio": ("reference.wav", cfg.ref_audio or synthetic_reference())})
    status, answer = await simple(target, Request("POST", "/v1/voices", body, ctype))
    if status not in (200, 201):
        raise LoadTestError(f"could not save a voice for /v1/audio/speech ({status}: {_message(answer)}); "
                            f"name a saved one with --voice")
    return name


# ---- server memory from /metrics -----------------------------------------------------------


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> {name: [(labels, value)]} (comments and bad lines skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(m.group(2) or "")}
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def _series_sum(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str,
                match: dict[str, str]) -> float | None:
    values = [v for labels, v in metrics.get(name, []) if all(labels.get(k) == want for k, want in match.items())]
    return sum(values) if values else None


@dataclass
class MemoryProbe:
    """Samples the server's resident memory (and device memory, when exported) from ``/metrics``.
    ``available`` is decided by one first scrape; if it shows no process memory, nothing more is asked."""

    target: Target
    available: bool = False
    note: str = ""
    rss: list[float] = field(default_factory=list)
    device: list[float] = field(default_factory=list)

    async def probe(self) -> None:
        """The first scrape (connection errors propagate: the server is not there)."""
        status, body = await simple(self.target, Request("GET", "/metrics"), 10.0)
        if status != 200:
            self.note = f"n/a: the server has no /metrics (HTTP {status})"
            return
        if self._record(parse_metrics(body.decode("utf-8", "replace"))):
            self.available, self.note = True, "from /metrics"
        else:
            self.note = "n/a: the server's /metrics exports no process memory"

    def _record(self, metrics: dict[str, list[tuple[dict[str, str], float]]]) -> bool:
        rss = next((v for name, match in RSS_SERIES if (v := _series_sum(metrics, name, match)) is not None), None)
        if rss is None:
            return False
        self.rss.append(rss)
        device = _series_sum(metrics, *DEVICE_SERIES)
        if device is not None:
            self.device.append(device)
        return True

    async def sample(self) -> None:
        try:
            status, body = await simple(self.target, Request("GET", "/metrics"), 10.0)
        except (OSError, IncompleteResponse, asyncio.TimeoutError):
            return
        if status == 200:
            self._record(parse_metrics(body.decode("utf-8", "replace")))

    async def watch(self, interval_s: float) -> None:
        """Sample every ``interval_s`` seconds until cancelled."""
        while True:
            await self.sample()
            await asyncio.sleep(interval_s)

    def reset(self) -> None:
        self.rss, self.device = [], []

    def report(self) -> dict[str, Any] | str:
        if not self.available or not self.rss:
            return self.note or "n/a"
        mb = 1 << 20
        out: dict[str, Any] = {"rss_mb": {"start": round(self.rss[0] / mb, 1), "peak": round(max(self.rss) / mb, 1),
                                          "end": round(self.rss[-1] / mb, 1)}}
        if self.device:
            out["device_allocated_mb"] = {"start": round(self.device[0] / mb, 1),
                                          "peak": round(max(self.device) / mb, 1),
                                          "end": round(self.device[-1] / mb, 1)}
        return out


# ---- one level of load ---------------------------------------------------------------------


async def _closed_loop(cfg: LoadConfig, target: Target, request: Request, clients: int, deadline: float,
                       records: list[StreamRecord]) -> None:
    """Each client sends its next request when its last one ends, until the deadline or the budget."""
    budget = cfg.requests if cfg.requests is not None else math.inf
    sent = 0

    async def client() -> None:
        nonlocal sent
        while time.perf_counter() < deadline and sent < budget:
            sent += 1
            records.append(await timed_stream(target, request, time.perf_counter(), cfg.timeout_s))

    await asyncio.gather(*(client() for _ in range(clients)))


async def _fixed_rate(cfg: LoadConfig, target: Target, request: Request, clients: int, rate: float,
                      start: float, deadline: float, records: list[StreamRecord]) -> None:
    """Arrivals every 1/rate s from ``start``; at most ``clients`` in flight, the others wait (their
    clocks run from their arrival)."""
    budget = cfg.requests if cfg.requests is not None else math.inf
    slots = asyncio.Semaphore(clients)

    async def arrival(due: float) -> None:
        async with slots:
            records.append(await timed_stream(target, request, due, cfg.timeout_s))

    tasks = []
    while len(tasks) < budget and (due := start + len(tasks) / rate) < deadline:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.create_task(arrival(due)))
    await asyncio.gather(*tasks)


async def run_level(cfg: LoadConfig, target: Target, request: Request, clients: int,
                    memory: MemoryProbe) -> dict[str, Any]:
    """``clients`` concurrent clients (closed loop) or arrivals at ``cfg.rate`` with at most
    ``clients`` in flight, until the duration or request budget is spent and every request ended."""
    records: list[StreamRecord] = []
    start = time.perf_counter()
    deadline = start + cfg.duration_s if cfg.duration_s is not None else math.inf
    cpu0 = time.process_time()
    memory.reset()
    watcher = asyncio.create_task(memory.watch(cfg.memory_interval_s)) if memory.available else None
    if cfg.rate is None:
        await _closed_loop(cfg, target, request, clients, deadline, records)
    else:
        await _fixed_rate(cfg, target, request, clients, cfg.rate, start, deadline, records)
    wall = time.perf_counter() - start
    if watcher is not None:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await memory.sample()
    level = {"clients": clients, **summarize((r.sample() for r in records), wall),
             "client_cpu_s": round(time.process_time() - cpu0, 3),  # this process: did the client keep up?
             "client_host_load_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
             "server_memory": memory.report()}
    level["error_messages"] = {r.error: r.message for r in reversed(records) if r.error and r.message}
    level["streams"] = [asdict(r) for r in records]
    return level


async def _run(cfg: LoadConfig, log: Callable[[str], None]) -> dict[str, Any]:
    target = Target.parse(cfg.url)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    memory = MemoryProbe(target)
    try:
        await memory.probe()
    except (OSError, IncompleteResponse, asyncio.TimeoutError) as e:
        raise LoadTestError(f"{cfg.url} does not answer ({str(e) or type(e).__name__}); start the server first "
                            f"(sovits-studio serve) or give its address with --url") from None
    log(f"server memory: {memory.note}")
    voice = await save_voice(target, cfg) if cfg.endpoint == "speech" and cfg.voice is None else cfg.voice
    try:
        request = build_request(cfg, voice)
        for i in range(cfg.warmup):
            r = await timed_stream(target, request, time.perf_counter(), cfg.timeout_s)
            log(f"warm-up {i + 1}/{cfg.warmup}: " + (f"{r.audio_s:.2f} s of audio in {r.wall_s:.2f} s"
                                                      if r.error is None else f"failed ({r.error}: {r.message})"))
        levels = []
        for clients in cfg.clients:
            levels.append(await run_level(cfg, target, request, clients, memory))
            log(format_level(levels[-1]))
    finally:
        if voice is not None and voice != cfg.voice:
            await simple(target, Request("DELETE", f"/v1/voices/{voice}"))
    return {"tool": "sovits-studio loadtest", "url": cfg.url, "endpoint": ENDPOINTS[cfg.endpoint],
            "mode": "closed loop" if cfg.rate is None else f"fixed arrival rate {cfg.rate:g}/s",
            "started": started, "workload": _workload(cfg), "server_memory_source": memory.note, "levels": levels}


def _workload(cfg: LoadConfig) -> dict[str, Any]:
    keep = ("endpoint", "clients", "rate", "duration_s", "requests", "timeout_s", "warmup", "text", "text_lang",
            "streaming_mode", "ref_path", "prompt_text", "prompt_lang", "voice", "seed")
    out = {k: getattr(cfg, k) for k in keep}
    out["fields"] = dict(cfg.fields)
    out["reference"] = cfg.ref_path or ("uploaded clip" if cfg.ref_audio else "built-in synthetic clip (uploaded)")
    return out


def run_load(cfg: LoadConfig, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run every level of ``cfg`` against its server; the report (JSON-ready)."""
    return asyncio.run(_run(cfg, log))


# ---- presentation --------------------------------------------------------------------------


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def format_level(level: dict[str, Any]) -> str:
    return f"{level['clients']} clients: {format_summary(level)}"


TABLE_COLUMNS = ("clients", "requests", "ok", "errors", "first chunk p50 / p95 / p99 (s)",
                 "stream speed min / p50 (x real time)", "audio s/s (vs 1 client)", "server RSS peak (MB)",
                 "client host load (1 min)")


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    base = next((lv["audio_s_per_s"] for lv in report["levels"] if lv["clients"] == 1), 0.0)
    for lv in report["levels"]:
        fc, sp, mem = lv["first_chunk_s"] or {}, lv["stream_speed"] or {}, lv["server_memory"]
        errors = ", ".join(f"{k}: {v}" for k, v in lv["errors"].items()) or "0"
        rows.append([str(lv["clients"]), str(lv["requests"]), str(lv["completed"]), errors,
                     " / ".join(_fmt(fc.get(p), ".2f") for p in ("p50", "p95", "p99")),
                     " / ".join(_fmt(sp.get(p), ".2f") for p in ("min", "p50")),
                     f"{lv['audio_s_per_s']:.2f}" + (f" ({lv['audio_s_per_s'] / base:.2f}x)" if base else ""),
                     f"{mem['rss_mb']['peak']:.0f}" if isinstance(mem, dict) else "n/a",
                     _fmt(lv.get("client_host_load_1m"), ".1f")])
    return rows


def format_table(report: dict[str, Any], markdown: bool = False) -> str:
    """The levels as a text table (or a Markdown one, for docs/benchmarks.md)."""
    rows = table_rows(report)
    if markdown:
        lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(TABLE_COLUMNS)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        lines = [fmt.format(*TABLE_COLUMNS).rstrip()] + [fmt.format(*r).rstrip() for r in rows]
    note = report.get("server_memory_source", "")
    if note.startswith("n/a"):
        lines.append(f"server memory {note}")
    return "\n".join(lines)


def draw_png(report: dict[str, Any], path: str) -> str:
    """First-chunk latency and total throughput against clients, as a PNG (needs matplotlib: the
    ``plot`` extra). Returns what was done, for the user."""
    try:
        from matplotlib.figure import Figure  # the object API: no pyplot, no global backend switch
    except ImportError:
        return (f"no PNG written to {path}: drawing needs matplotlib (pip install 'sovits-studio[plot]'); "
                f"the JSON and the table hold the same figures")
    levels = [lv for lv in report["levels"] if lv["first_chunk_s"]]
    clients = [lv["clients"] for lv in report["levels"]]
    fig = Figure(figsize=(10, 4), dpi=100)
    ax1, ax2 = fig.subplots(1, 2)
    for key, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
        ax1.plot([lv["clients"] for lv in levels], [lv["first_chunk_s"][key] for lv in levels], style, label=key)
    ax1.set(xlabel="concurrent clients", ylabel="first chunk (s)", title="First-chunk latency")
    ax1.legend()
    ax2.plot(clients, [lv["audio_s_per_s"] for lv in report["levels"]], "o-", label="all streams together")
    ax2.plot(clients, clients, color="grey", lw=0.8, ls=":", label="every client at real time")
    ax2.set(xlabel="concurrent clients", ylabel="audio seconds per second", title="Total throughput")
    ax2.legend()
    for ax in (ax1, ax2):  # log-log: latencies and rates span decades between 1 and many clients
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(clients, [str(c) for c in clients])
        ax.grid(alpha=0.3)
    fig.suptitle(f"{report['endpoint']} at {report['url']} ({report['mode']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return f"wrote {path}"
