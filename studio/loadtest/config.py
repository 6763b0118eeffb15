"""What a load test does: its settings (:class:`LoadConfig`), checked once, and the default workload."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from studio.loadtest.errors import LoadTestError

if TYPE_CHECKING:
    from studio.loadtest.mix import MixWorkload

# The bench's workload (studio.bench REF_TEXT and TEXTS["medium"]), so both report the same work.
REF_TEXT = "今天天气很好，我们一起去公园散步吧。"
TEXT = "这是一个用于测试语音合成速度的句子。我们希望它听起来自然流畅，并且速度足够快。"
ENDPOINTS = {"tts": "/tts", "speech": "/v1/audio/speech"}
VOICE_PREFIX = "loadtest-"  # a voice saved for the run (and deleted after it) when none is named
__all__ = ["ENDPOINTS", "REF_TEXT", "TEXT", "VOICE_PREFIX", "LoadConfig", "LoadTestError"]


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
    mix: MixWorkload | None = None  # the product workload (studio.loadtest.mix): replaces text, mode and clip

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
        if self.mix is not None and self.endpoint != "tts":
            raise LoadTestError("mix: the product workload uploads a clip per client, which only /tts takes; "
                                "drop --endpoint speech")
        if self.mix is not None and (self.ref_path is not None or self.ref_audio is not None):
            raise LoadTestError("mix: each client uploads its own clip from --ref-dir; drop --ref / --ref-path")
        split = urlsplit(self.url)
        try:
            split.port  # noqa: B018 - raises on a port that is not a number in range
        except ValueError:
            split = None
        if split is None or split.scheme not in ("http", "https") or not split.hostname:
            raise LoadTestError(f"url: {self.url!r} is not an http(s)://HOST[:PORT] address")
