"""Every bound a running server keeps, in one frozen dataclass with its defaults (:class:`ServerLimits`).

``serve``, ``webui`` and any other deployment build one ``ServerLimits`` and hand it to
:func:`studio.http.app.create_app` (inside :class:`~studio.http.context.ServerSettings`) and to
:func:`studio.http.lifecycle.uvicorn_config`; nothing else holds a limit. A request over a limit gets a
4xx/5xx naming the limit, never unbounded work.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

from engine.decode_budget import DEFAULT_DECODE_BUDGET_BYTES
from engine.errors import OptionsError

MIB = 1 << 20
DEFAULT_QUEUE = 32  # the automatic max_queue before the engine's schedulers exist (and its floor)


@dataclass(frozen=True)
class ServerLimits:
    """How much one server admits, reads, computes and waits for. Times in seconds."""

    # ---- admission -------------------------------------------------------------------------
    workers: int = 1  # syntheses computed at once
    max_queue: int | None = None  # admitted syntheses waiting beyond those; more get 503 + Retry-After at once,
    # before their body is read. None: as many as the engine's schedulers hold (decoding slots, sized from free
    # device memory, + their waiting room), once the warm-up made them; DEFAULT_QUEUE until then
    retry_after_s: float = 1.0  # the Retry-After of a busy 503
    max_uploads_per_client: int = 8  # admitted syntheses of one client address whose body is still arriving;
    # more: 503 + Retry-After. Slow senders that reconnect (each bounded by body_timeout_s) took every place
    # ---- request bodies ----------------------------------------------------------------------
    max_upload_bytes: int = 20 * MIB  # a whole request body (JSON or multipart with every clip): over it, 413;
    # checked against Content-Length first and again while reading, with no slack
    decode_budget_bytes: int = DEFAULT_DECODE_BUDGET_BYTES  # decoded audio held by the reads under way in the
    # whole process (engine.decode_budget; every request, page and API): a read that does not fit beside them
    # gets 503 + Retry-After before its samples are allocated (8 parallel maximal uploads grew a server 1.5 GB)
    max_json_depth: int = 32  # nesting of a JSON body (objects and lists); deeper: 400
    max_json_items: int = 100_000  # ',' and ':' in a JSON body, counted before it is parsed (a bound on its
    # members and items: 1.5M keys held the interpreter lock 1.2 s while parsing); more: 400
    max_form_fields: int = 64  # multipart/urlencoded fields of one request
    max_header_line_bytes: int = 16 * 1024  # one header line (name and value); the request line likewise
    # (a longer request line: 414); over it: 431
    max_header_bytes: int = 64 * 1024  # every header line of one request together; over it: 431
    max_headers: int = 100  # header lines of one request; more: 431
    header_timeout_s: float = 10.0  # a connection must send its request headers within this; else it is closed
    body_timeout_s: float = 30.0  # a request body must arrive completely within this (in total); else 408
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this
    max_connections: int = 2048  # open connections + running requests; beyond, uvicorn answers 503 (idle
    # connections are closed first, oldest first, to make room). Sized for a GPU's admission (hundreds of
    # streams); the server raises its open-files limit to fit, or lowers this with a warning
    max_connections_per_client: int = 1024  # open connections from one client address; more: 503 and closed.
    # The listeners of one demo link share the address of its tunnel or proxy, so this is not small
    # ---- work ----------------------------------------------------------------------------------
    request_timeout_s: float = 600.0  # one synthesis request, admission to last byte; then 504 (or the
    # stream ends with an error) and its work is cancelled
    max_audio_seconds: float = 600.0  # audio of one whole-file response (streaming has no such cap);
    # over it: 400 and the work stops
    max_pending_chunks: int = 8  # streamed results waiting for a slow client before synthesis pauses
    stream_write_timeout_s: float = 30.0  # one piece of a stream must be taken by the client within this; a
    # client that stops reading (or is gone) loses the stream and its worker slot then, not at request_timeout_s
    max_tokens_per_sentence: int | None = None  # cap on semantic tokens per sentence (25 per second of
    # audio); None: the GPT checkpoint's own limit (50 * max_sec = 2700, i.e. up to ~108 s per sentence)
    max_profiles: int = 256  # saved voices; one more: 400 (checked under the store's write lock)
    max_profiles_bytes: int = 512 * MIB  # every saved voice's files together (a voice keeps only its checked
    # reference, mono: a 10 s 48 kHz clip is 0.9-1.8 MiB); over it: 400
    # ---- shutdown ------------------------------------------------------------------------------
    shutdown_grace_s: float = 30.0  # after SIGTERM: running requests get this long, queued ones 503 at once

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("max_tokens_per_sentence", "max_queue") and value is None:
                continue
            if f.type in ("int", "int | None"):
                low = 1 if f.name in ("workers", "max_upload_bytes", "max_json_depth", "max_json_items",
                                      "max_connections", "max_pending_chunks", "max_tokens_per_sentence",
                                      "max_header_line_bytes", "max_connections_per_client", "max_uploads_per_client",
                                      "decode_budget_bytes", "max_profiles_bytes", "max_header_bytes",
                                      "max_headers") else 0
                if not isinstance(value, int) or isinstance(value, bool) or value < low:
                    raise OptionsError(f"{f.name} must be an integer >= {low}, got {value!r}", field=f.name)
            elif (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                  or value <= 0):
                raise OptionsError(f"{f.name} must be a positive number of seconds, got {value!r}", field=f.name)

    @property
    def max_inflight(self) -> int:
        """Synthesis requests admitted at once (reading their body, queued, computing or streaming) with a
        fixed ``max_queue``; with the automatic one, before the engine's schedulers exist."""
        return self.workers + (DEFAULT_QUEUE if self.max_queue is None else self.max_queue)

    def admission(self, engine_capacity: Callable[[], int]) -> Callable[[], int]:
        """The number of synthesis requests admitted at once, read at each admission: ``max_inflight`` with a
        fixed ``max_queue``; else sized from the engine (``engine_capacity()``: its slots + waiting room)."""
        if self.max_queue is not None:
            fixed = self.max_inflight
            return lambda: fixed
        floor = self.max_inflight
        return lambda: max(floor, self.workers + engine_capacity())


# ---- command-line flags (serve, webui) ---------------------------------------------------------

_FLAGS = {  # field -> (flag, help); the *_bytes fields are given in MiB (_MIB_FLAGS)
    "workers": ("--workers", "syntheses computed at once, page and API together"),
    "max_queue": ("--max-queue", "syntheses waiting beyond that; more get 503 at once (auto: as many as the "
                                 "engine's decoding slots, sized from free device memory, and their queue hold)"),
    "max_upload_bytes": ("--max-upload-mb", "request body limit in MiB (the whole body, clips included)"),
    "request_timeout_s": ("--request-timeout", "seconds one synthesis request may take; then 504 and its work stops"),
    "max_audio_seconds": ("--max-audio-seconds", "longest audio of a whole-file response (streaming: no cap)"),
    "shutdown_grace_s": ("--shutdown-grace", "seconds running requests get after SIGTERM before the server exits"),
    "header_timeout_s": ("--header-timeout", "seconds a connection may take to send its request headers"),
    "body_timeout_s": ("--body-timeout", "seconds a whole request body may take to arrive (then 408)"),
    "stream_write_timeout_s": ("--stream-write-timeout", "seconds a client may take to accept one piece of a "
                                                         "stream; then the stream is cut and its slot freed"),
    "max_tokens_per_sentence": ("--max-tokens-per-sentence",
                                "cap semantic tokens per sentence (25 per second of audio; default: the GPT file's)"),
    "decode_budget_bytes": ("--decode-budget-mb", "MiB of decoded audio the whole process holds in reads under "
                                                  "way (every request, page and API); a read beyond: 503"),
}
_MIB_FLAGS = {"max_upload_bytes": "max_upload_mb", "decode_budget_bytes": "decode_budget_mb"}  # field -> dest


def add_limit_arguments(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """The limits a user sets from a command line, with the defaults of :class:`ServerLimits`."""
    d = ServerLimits()
    for name, (flag, text) in _FLAGS.items():
        if name in skip:
            continue
        default = getattr(d, name)
        kind = int if name in ("workers", "max_queue", "max_tokens_per_sentence") else float
        if name in _MIB_FLAGS:
            default = default / MIB
        shown = ("auto" if name == "max_queue" else "none") if default is None else f"{default:g}"
        dest = _MIB_FLAGS.get(name, name)
        parser.add_argument(flag, type=kind, default=default, dest=dest, help=f"{text} (default {shown})")


def limits_from_args(args: argparse.Namespace, **overrides) -> ServerLimits:
    """:class:`ServerLimits` from the flags of :func:`add_limit_arguments` (absent flags keep the defaults)."""
    values = {}
    for name in _FLAGS:
        dest = _MIB_FLAGS.get(name, name)
        if hasattr(args, dest):
            values[name] = round(getattr(args, dest) * MIB) if name in _MIB_FLAGS else getattr(args, dest)
    return ServerLimits(**{**values, **overrides})
