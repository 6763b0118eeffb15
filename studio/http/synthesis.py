"""Running one synthesis request for a route, bounded: admitted before its body is read, computed on the
worker pool under its :class:`~studio.http.exchange.JobControl` (time limit, cancellation, and the audio
limit of whole-file answers), answered as a whole file or as a stream whose first chunk exists before
the status line is sent. Shared by the api_v2 and OpenAI routes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from engine.errors import OptionsError, UnsupportedLanguageError
from engine.options import SynthesisOptions
from studio.http.exchange import (
    TIMED_OUT,
    AudioLimitError,
    Exchange,
    JobControl,
    RequestTimeoutError,
    await_work,
)

if TYPE_CHECKING:
    from engine.reference import Reference
    from studio.http.context import ServerContext


@dataclass(frozen=True)
class TTSJob:
    """A validated request: everything the worker needs; only what depends on the loaded model (its
    version's languages, the clip's content) is still checked, by the pipeline."""

    text: str
    text_lang: str
    reference: "Reference"
    options: SynthesisOptions
    gpt: str | None
    sovits: str | None
    media_type: str
    streaming: bool
    names: Mapping[str, str] = field(default_factory=dict)  # engine field -> the route's parameter name


def validate_model(model: type[BaseModel], data: Mapping[str, Any]) -> Any:
    """``model.model_validate(data)`` with errors as one OptionsError naming each field."""
    from studio.http.errors import validation_error

    try:
        return model.model_validate(dict(data))
    except ValidationError as e:
        raise validation_error(e.errors()) from None


def language(value: str | None, name: str) -> str:
    """A language code any model version may support (the pipeline checks the loaded version's own set)."""
    from engine.text.frontend import languages

    if value in (None, ""):
        raise OptionsError(f"{name} is required", field=name)
    lang = value.lower()
    valid = languages("v2")  # the widest set
    if lang not in valid:
        raise UnsupportedLanguageError(f"{name}: {value!r} is not supported; use one of {', '.join(valid)}",
                                       field=name)
    return lang


def exchange(request) -> Exchange:
    """The request's Exchange (made by the guard; a fresh one when the app runs without it)."""
    state = request.scope.setdefault("state", {})
    if "exchange" not in state:
        state["exchange"] = Exchange("other")
    return state["exchange"]


def admit(ctx: "ServerContext", request) -> Exchange:
    """Admit a synthesis request before its body is read (BusyError/DrainingError at once otherwise)."""
    ex = exchange(request)
    ctx.admission.enter(ex, ctx.limits.request_timeout_s)
    return ex


async def wait_disconnect(request) -> None:
    """Returns when the client has closed the connection (call once the body has been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# ---- work on the worker threads ------------------------------------------------------------


def _start(ctx: "ServerContext", job: TTSJob, control: JobControl) -> Iterator[Any]:
    """``Studio.synthesize`` once the request is known to be still wanted (validation errors raise here)."""
    control.begin()
    results = ctx.studio.synthesize(job.text, job.text_lang, job.reference, job.options, gpt=job.gpt,
                                    sovits=job.sovits)
    control.attach(results)
    return results


V3_SAMPLE_RATE = 24000  # only v3 speaks at 24 kHz: the official code super-samples v3 only


def synthesize_whole(ctx: "ServerContext", job: TTSJob, control: JobControl, encode_as: str | None = None,
                     rate: int | None = None) -> tuple[bytes, int, float]:
    """The whole text, encoded: (file bytes, sample rate, seconds of audio). Stops between results when
    the request is cancelled or over its time limit, and when the audio passes ``max_audio_seconds``."""
    from engine.audio_formats import encode
    from engine.results import join

    limit = ctx.limits.max_audio_seconds
    results = _start(ctx, job, control)
    kept, seconds = [], 0.0
    try:
        for r in results:
            control.check()
            seconds += len(r.audio) / r.sample_rate
            if seconds > limit:
                raise AudioLimitError(f"the audio would be longer than {limit:g} s, the most a whole-file answer "
                                      f"holds (max_audio_seconds); stream it (streaming_mode) or send less text",
                                      field="text")
            kept.append(r)
    finally:
        results.close()  # the engine frees the request's state (the scheduler its slot)
    sr, audio = join(kept)
    del kept
    if job.options.super_sampling and sr == V3_SAMPLE_RATE and ctx.super_sampler is not None:
        sampler = ctx.super_sampler.get()  # absent: the audio keeps its rate, as in the official code
        if sampler is not None:
            audio, sr = sampler(audio, sr)
    if rate is not None and rate != sr:
        from engine.audio import resample_soxr

        audio, sr = resample_soxr(audio, sr, rate), rate
    return encode(audio, sr, encode_as or job.media_type), sr, seconds


def start_stream(ctx: "ServerContext", job: TTSJob, control: JobControl) -> Iterator[tuple[bytes, float]]:
    """Start synthesis (errors raise here, before any byte), then ``(encoded piece, seconds of audio in
    it)`` as the official streaming response encodes them; stops between results when cancelled."""
    from engine.audio_formats import encode_stream

    results = _start(ctx, job, control)
    made = [0.0]
    # official: each fragment is widened on its own (v3 streams sentence by sentence)
    widen = ctx.super_sampler.get() if job.options.super_sampling and ctx.super_sampler is not None else None

    def chunks() -> Iterator[tuple[int, Any]]:
        for r in results:
            control.check()
            made[0] += len(r.audio) / r.sample_rate
            if widen is not None and r.sample_rate == V3_SAMPLE_RATE:
                audio, sr = widen(r.audio, r.sample_rate)
                yield sr, audio
            else:
                yield r.sample_rate, r.audio

    def encoded() -> Iterator[tuple[bytes, float]]:
        credited = 0.0
        try:
            for piece in encode_stream(chunks(), job.media_type):
                yield piece, made[0] - credited
                credited = made[0]
        finally:
            results.close()

    return encoded()


# ---- answers -------------------------------------------------------------------------------


def language_warning(text: str, text_lang: str) -> dict[str, str]:
    """``X-Text-Language-Warning`` when ``text_lang`` reads almost none of the text (synthesis still runs)."""
    from engine.text.language_check import check_text_language

    message = check_text_language(text, text_lang).message()
    return {"X-Text-Language-Warning": message} if message else {}


async def respond(ctx: "ServerContext", request, ex: Exchange, job: TTSJob, endpoint: str, *,
                  encode_as: str | None = None, rate: int | None = None, headers: Mapping[str, str] | None = None):
    """Run an admitted job: a whole-file Response or a StreamingResponse."""
    from fastapi.responses import Response

    from engine.audio_formats import content_type

    ex.names = job.names
    ex.check_drained(ctx.limits.retry_after_s)  # shutdown began while the body arrived: no work starts
    labels = {"endpoint": endpoint}
    headers = {**language_warning(job.text, job.text_lang), **(headers or {})}
    if job.streaming:
        return await _respond_stream(ctx, request, ex, job, labels, headers)
    work = ctx.runner.run(synthesize_whole, ctx, job, ex.job, encode_as, rate)
    data, sr, seconds = await await_work(ex, work, lambda: wait_disconnect(request), ctx.limits.retry_after_s)
    elapsed = time.perf_counter() - ex.started
    ctx.metrics.first_chunk.observe(elapsed, labels)
    ctx.metrics.latency.observe(elapsed, labels)
    ex.audio_seconds = seconds  # counted once the whole answer has been sent
    extra = dict(headers)
    if rate is not None:
        extra["X-Sample-Rate"] = str(sr)
    return Response(data, media_type=content_type(encode_as or job.media_type), headers=extra)


async def _respond_stream(ctx: "ServerContext", request, ex: Exchange, job: TTSJob, labels: dict,
                          headers: Mapping[str, str]):
    from fastapi.responses import StreamingResponse

    from engine.audio_formats import content_type

    disconnected, retry = (lambda: wait_disconnect(request)), ctx.limits.retry_after_s
    control = ex.job
    stream = await await_work(ex, ctx.runner.stream(lambda: start_stream(ctx, job, control),
                                                    ctx.limits.max_pending_chunks, lambda: control.cancelled),
                              disconnected, retry)
    pieces = stream.__aiter__()
    try:  # the first piece exists before the status line: early failures are ordinary JSON errors
        first = await await_work(ex, anext(pieces), disconnected, retry)
    except BaseException:
        stream.cancel()
        raise
    ctx.metrics.first_chunk.observe(time.perf_counter() - ex.started, labels)
    return StreamingResponse(_stream_body(ctx, ex, stream, pieces, first, labels),
                             media_type=content_type(job.media_type), headers=dict(headers))


async def _stream_body(ctx: "ServerContext", ex: Exchange, stream, pieces: AsyncIterator, first, labels: dict):
    """The stream's bytes. Audio seconds are counted once their bytes went out; a failure after the
    first byte propagates to the guard, which cuts the connection so the client sees the answer broke."""
    piece = first
    try:
        while True:
            data, seconds = piece
            yield data
            ctx.metrics.audio_seconds.inc(amount=seconds)  # resumed: the bytes were sent
            try:
                piece = await asyncio.wait_for(anext(pieces), ex.job.remaining())
            except StopAsyncIteration:
                return
            except TimeoutError:
                ex.outcome = TIMED_OUT
                raise RequestTimeoutError("the stream took longer than the server's limit "
                                          "(request_timeout_s)") from None
    finally:
        stream.cancel()
        ctx.metrics.latency.observe(time.perf_counter() - ex.started, labels)
