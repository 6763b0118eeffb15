"""Running the load: one timed stream, the closed loop and the fixed arrival rate, levels and the report."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import resource
import time
import uuid
import wave
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from engine.stream_stats import StreamSample, percentile, summarize
from studio.loadtest.client import IncompleteResponse, Request, Target, client_source, exchange, multipart, simple
from studio.loadtest.config import ENDPOINTS, VOICE_PREFIX, LoadConfig, LoadTestError
from studio.loadtest.mix import MODE_NAMES, MixWorkload
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
    tag: str | None = None  # the mix's "mode/language" of this request (None outside --mix)

    def sample(self) -> StreamSample:
        return StreamSample(self.first_chunk_s, self.wall_s, self.audio_s, self.error)


async def timed_stream(target: Target, request: Request, due: float, timeout_s: float,
                       tag: str | None = None, source: str | None = None) -> StreamRecord:
    """Run one request, due at ``due`` (a perf_counter time), metering its WAV body; from address ``source``
    (:func:`studio.loadtest.client.client_source`)."""
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
        await asyncio.wait_for(exchange(target, request, status.append, on_body, source), remaining)
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
                        error, message, tag)


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


class FixedRequests:
    """The plain workload: every client sends the same request (its bytes built once)."""

    def __init__(self, request: Request) -> None:
        self.request = request

    def start_level(self, serials: range) -> None:
        pass

    def next(self, serial: int) -> tuple[Request, str | None]:
        return self.request, None


class MixRequests:
    """The product workload (:mod:`studio.loadtest.mix`): client ``serial`` uploads its own clip; the
    ``n``-th request of a level takes the mix's ``n``-th (mode, language)."""

    def __init__(self, cfg: LoadConfig, mix: MixWorkload) -> None:
        self.cfg, self.mix = cfg, mix
        self.sent = 0
        self._clips: dict[int, tuple[Any, bytes]] = {}  # this level's clients' clips (dropped per level)

    def start_level(self, serials: range) -> None:
        """A new level of clients ``serials``: their clips are made now, before any clock starts."""
        self.sent = 0
        self._clips = {serial: self.mix.clip(serial) for serial in serials}

    def next(self, serial: int) -> tuple[Request, str | None]:
        job = self.mix.job(self.sent)
        self.sent += 1
        if serial not in self._clips:
            self._clips[serial] = self.mix.clip(serial)
        clip, wav = self._clips[serial]
        fields = {"text": job.text, "text_lang": job.text_lang, "prompt_text": clip.text,
                  "prompt_lang": clip.language, "media_type": "wav", "streaming_mode": job.streaming_mode,
                  "seed": self.cfg.seed, **dict(self.cfg.fields)}
        body, ctype = multipart(fields, {"ref_audio": (f"client-{serial}.wav", wav)})
        return Request("POST", ENDPOINTS["tts"], body, ctype), job.tag


Workload = FixedRequests | MixRequests
# a client that was refused or could not connect waits a moment before its next request (a closed loop
# would otherwise spin, sending thousands of requests a second that are answered at once)
_PAUSE_AFTER_S = {"connection": 0.05, "503": 0.25, "429": 0.25}


async def _closed_loop(cfg: LoadConfig, target: Target, work: Workload, clients: int, first_serial: int,
                       deadline: float, records: list[StreamRecord]) -> None:
    """Each client sends its next request when its last one ends, until the deadline or the budget."""
    budget = cfg.requests if cfg.requests is not None else math.inf
    sent = 0

    async def client(serial: int) -> None:
        nonlocal sent
        while time.perf_counter() < deadline and sent < budget:
            sent += 1
            request, tag = work.next(serial)
            record = await timed_stream(target, request, time.perf_counter(), cfg.timeout_s, tag,
                                        client_source(target, serial))
            records.append(record)
            if record.error in _PAUSE_AFTER_S:
                await asyncio.sleep(_PAUSE_AFTER_S[record.error])

    await asyncio.gather(*(client(first_serial + i) for i in range(clients)))


async def _fixed_rate(cfg: LoadConfig, target: Target, work: Workload, clients: int, first_serial: int,
                      rate: float, start: float, deadline: float, records: list[StreamRecord]) -> None:
    """Arrivals every 1/rate s from ``start``; at most ``clients`` in flight, the others wait (their
    clocks run from their arrival). Arrival k is client ``k % clients``'s."""
    budget = cfg.requests if cfg.requests is not None else math.inf
    slots = asyncio.Semaphore(clients)

    async def arrival(k: int, due: float) -> None:
        async with slots:
            serial = first_serial + k % clients
            request, tag = work.next(serial)
            records.append(await timed_stream(target, request, due, cfg.timeout_s, tag, client_source(target, serial)))

    tasks = []
    while len(tasks) < budget and (due := start + len(tasks) / rate) < deadline:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.create_task(arrival(len(tasks), due)))
    await asyncio.gather(*tasks)


def _wall_spread(records: list[StreamRecord]) -> dict[str, float] | None:
    walls = [r.wall_s for r in records if r.error is None]
    if not walls:
        return None
    return {"p50": round(percentile(walls, 50), 4), "p95": round(percentile(walls, 95), 4), "max": round(max(walls), 4)}


def mix_figures(records: list[StreamRecord], wall: float) -> dict[str, Any]:
    """A mixed level's figures: first chunk and speed over the streams only, whole-file latency, and the
    summaries per mode, per language and per (mode, language) (each share's audio over the level's wall)."""
    def summary(subset: list[StreamRecord]) -> dict[str, Any]:
        out = summarize((r.sample() for r in subset), wall)
        out["latency_s"] = _wall_spread(subset)  # request to last byte, completed requests
        return out

    tagged = [r for r in records if r.tag]
    whole = MODE_NAMES[0]
    streams = [r for r in tagged if r.tag.split("/")[0] != whole]
    files = [r for r in tagged if r.tag.split("/")[0] == whole]
    stream_summary = summarize((r.sample() for r in streams), wall)
    groups: dict[str, dict[str, list[StreamRecord]]] = {"by_mode": {}, "by_language": {}, "by_mode_language": {}}
    for r in tagged:
        mode, lang = r.tag.split("/")
        groups["by_mode"].setdefault(mode, []).append(r)
        groups["by_language"].setdefault(lang, []).append(r)
        groups["by_mode_language"].setdefault(r.tag, []).append(r)
    return {"first_chunk_s": stream_summary["first_chunk_s"], "stream_speed": stream_summary["stream_speed"],
            "stream_requests": {"sent": len(streams), "completed": stream_summary["completed"]},
            "whole_file_s": _wall_spread(files),
            **{name: {key: summary(subset) for key, subset in sorted(group.items())}
               for name, group in groups.items()}}


async def run_level(cfg: LoadConfig, target: Target, work: Workload, clients: int, memory: MemoryProbe,
                    first_serial: int = 0) -> dict[str, Any]:
    """``clients`` concurrent clients (closed loop) or arrivals at ``cfg.rate`` with at most
    ``clients`` in flight, until the duration or request budget is spent and every request ended.
    Clients are numbered from ``first_serial`` (the mix gives each number its own clip)."""
    records: list[StreamRecord] = []
    work.start_level(range(first_serial, first_serial + clients))
    start = time.perf_counter()
    deadline = start + cfg.duration_s if cfg.duration_s is not None else math.inf
    cpu0 = time.process_time()
    memory.reset()
    watcher = asyncio.create_task(memory.watch(cfg.memory_interval_s)) if memory.available else None
    if cfg.rate is None:
        await _closed_loop(cfg, target, work, clients, first_serial, deadline, records)
    else:
        await _fixed_rate(cfg, target, work, clients, first_serial, cfg.rate, start, deadline, records)
    wall = time.perf_counter() - start
    if watcher is not None:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await memory.sample()
    level = {"clients": clients, **summarize((r.sample() for r in records), wall),
             "client_cpu_s": round(time.process_time() - cpu0, 3),  # this process: did the client keep up?
             "client_host_load_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
             "server_memory": memory.report()}
    if cfg.mix is not None:
        level["stream_speed_all_requests"] = level["stream_speed"]  # whole files too, before the streams-only
        level.update(mix_figures(records, wall))
    level["error_messages"] = {r.error: r.message for r in reversed(records) if r.error and r.message}
    level["streams"] = [asdict(r) for r in records]
    return level


def raise_open_files_limit(needed: int) -> dict[str, int]:
    """Raise this process's soft limit of open files to at least ``needed``
    (:func:`engine.platform_env.raise_open_files`): one socket per client, and the children it starts inherit
    it. Returns the limits before and after."""
    from engine.platform_env import raise_open_files

    before = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    soft, hard = raise_open_files(needed)
    return {"soft_before": before, "soft": soft, "hard": hard}


async def _run(cfg: LoadConfig, log: Callable[[str], None],
               on_level: Callable[[dict[str, Any]], bool | None] | None) -> dict[str, Any]:
    target = Target.parse(cfg.url)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    files = raise_open_files_limit(max(cfg.clients) + 256)
    if files["soft"] != resource.RLIM_INFINITY and files["soft"] < max(cfg.clients) + 16:
        log(f"open files: this process may open only {files['soft']} (hard limit {files['hard']}); "
            f"clients beyond that fail with connection errors (raise it with ulimit -n)")
    memory = MemoryProbe(target)
    try:
        await memory.probe()
    except (OSError, IncompleteResponse, asyncio.TimeoutError) as e:
        raise LoadTestError(f"{cfg.url} does not answer ({str(e) or type(e).__name__}); start the server first "
                            f"(sovits-studio serve) or give its address with --url") from None
    log(f"server memory: {memory.note}")
    voice = await save_voice(target, cfg) if cfg.endpoint == "speech" and cfg.voice is None else cfg.voice
    try:
        work: Workload = MixRequests(cfg, cfg.mix) if cfg.mix is not None else FixedRequests(build_request(cfg, voice))
        serial = sum(cfg.clients)  # warm-up clients come after every level's (their clips are their own too)
        for i in range(cfg.warmup):
            request, tag = work.next(serial + i)
            r = await timed_stream(target, request, time.perf_counter(), cfg.timeout_s, tag)
            log(f"warm-up {i + 1}/{cfg.warmup}{f' ({tag})' if tag else ''}: "
                + (f"{r.audio_s:.2f} s of audio in {r.wall_s:.2f} s" if r.error is None
                   else f"failed ({r.error}: {r.message})"))
        levels = []
        serial = 0
        for clients in cfg.clients:
            levels.append(await run_level(cfg, target, work, clients, memory, serial))
            serial += clients
            log(format_level(levels[-1]))
            if on_level is not None and on_level(levels[-1]) is False:
                log(f"sweep stopped after {clients} clients")
                break
    finally:
        if voice is not None and voice != cfg.voice:
            await simple(target, Request("DELETE", f"/v1/voices/{voice}"))
    return {"tool": "sovits-studio loadtest", "url": cfg.url, "endpoint": ENDPOINTS[cfg.endpoint],
            "mode": "closed loop" if cfg.rate is None else f"fixed arrival rate {cfg.rate:g}/s",
            "started": started, "workload": _workload(cfg), "open_files": files,
            "server_memory_source": memory.note, "levels": levels}


def _workload(cfg: LoadConfig) -> dict[str, Any]:
    keep = ("endpoint", "clients", "rate", "duration_s", "requests", "timeout_s", "warmup", "text", "text_lang",
            "streaming_mode", "ref_path", "prompt_text", "prompt_lang", "voice", "seed")
    out = {k: getattr(cfg, k) for k in keep}
    out["fields"] = dict(cfg.fields)
    out["reference"] = cfg.ref_path or ("uploaded clip" if cfg.ref_audio else "built-in synthetic clip (uploaded)")
    if cfg.mix is not None:
        for k in ("text", "text_lang", "streaming_mode", "prompt_text", "prompt_lang"):
            out.pop(k)
        out["reference"] = "a clip of its own per client (mix)"
        out["mix"] = cfg.mix.describe()
    return out


def run_load(cfg: LoadConfig, log: Callable[[str], None] = lambda s: None,
             on_level: Callable[[dict[str, Any]], bool | None] | None = None) -> dict[str, Any]:
    """Run every level of ``cfg`` against its server; the report (JSON-ready). ``on_level`` gets each
    level's figures as soon as it ends (to keep partial results of a long sweep); returning False
    stops the sweep there."""
    return asyncio.run(_run(cfg, log, on_level))
