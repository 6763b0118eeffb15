"""Running the load: one timed stream, the closed loop and the fixed arrival rate, levels and the report."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import time
import uuid
import wave
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from engine.stream_stats import StreamSample, summarize
from studio.loadtest.client import IncompleteResponse, Request, Target, exchange, multipart, simple
from studio.loadtest.config import ENDPOINTS, VOICE_PREFIX, LoadConfig, LoadTestError
from studio.loadtest.report import format_level
from studio.loadtest.server_memory import MemoryProbe
from studio.loadtest.wav import WavMeter


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
