"""The official ``api_v2.py`` interface: ``/tts``, ``/set_gpt_weights``, ``/set_sovits_weights``,
``/set_refer_audio``, ``/control``, with the official parameter names, defaults and response formats.

Compatible: GET query or POST JSON with the ``TTS_Request`` fields; ``streaming_mode`` 0-3 or
true/false; wav/raw/ogg/aac; a streamed WAV is one zero-frame header and then raw PCM; errors are
``{"message": ...}``. Different on purpose: every field is checked and the message names it;
``ref_audio_path`` must lie in a configured reference folder (or the clip is uploaded as multipart
field ``ref_audio``); each request may name its own ``gpt_weights_path``/``sovits_weights_path``
(``/set_*_weights`` only change the defaults for requests naming none, never a running request's
models); unexpected failures answer 500, not 400.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from engine.audio_formats import API_V2_MEDIA_TYPES, check_media_type, content_type
from engine.errors import EngineError, OptionsError, ReferenceAudioError, UnsupportedLanguageError
from engine.options import SynthesisOptions

if TYPE_CHECKING:
    from engine.pipeline import Reference
    from studio.http.context import ServerContext

API_SPLIT_METHOD = "cut5"  # api_v2's TTS_Request default (TTS.run's own default is cut1)
MAX_AUX_REFERENCES = 16
_D = SynthesisOptions()  # the one place the synthesis defaults live


class TTSRequest(BaseModel):
    """``api_v2.TTS_Request``: the official fields and defaults, plus two per-request weight paths."""

    model_config = ConfigDict(extra="ignore")

    text: str | None = None  # required
    text_lang: str | None = None  # required
    ref_audio_path: str | None = None  # required (or an uploaded ref_audio)
    aux_ref_audio_paths: list[str] | None = None
    prompt_lang: str | None = None  # required
    prompt_text: str | None = ""  # null reads as "" (no transcript: reference-free, v1/v2/v2Pro* only)
    top_k: int = _D.top_k
    top_p: float = _D.top_p
    temperature: float = _D.temperature
    text_split_method: str = API_SPLIT_METHOD
    batch_size: int = _D.batch_size
    batch_threshold: float = _D.batch_threshold
    split_bucket: bool = _D.split_bucket
    speed_factor: float = _D.speed_factor
    fragment_interval: float = _D.fragment_interval
    seed: int = _D.seed
    media_type: str = "wav"
    streaming_mode: bool | int = False  # 0/false whole file, 1/true per sentence, 2 token chunks, 3 fixed chunks
    parallel_infer: bool = _D.parallel_infer
    repetition_penalty: float = _D.repetition_penalty
    sample_steps: int = _D.sample_steps
    super_sampling: bool = _D.super_sampling
    overlap_length: int = _D.overlap_length
    min_chunk_length: int = _D.min_chunk_length
    # SoVITS Studio: the weights of this request (default: the server's current ones)
    gpt_weights_path: str | None = None
    sovits_weights_path: str | None = None


OPTION_FIELDS = ("top_k", "top_p", "temperature", "text_split_method", "batch_size", "batch_threshold",
                 "split_bucket", "speed_factor", "fragment_interval", "seed", "parallel_infer",
                 "repetition_penalty", "sample_steps", "super_sampling", "overlap_length", "min_chunk_length")
# streaming_mode -> (return_fragment, streaming_mode, fixed_length_chunk), as api_v2.tts_handle maps it
STREAMING_MODES = {0: (False, False, False), 1: (True, False, False), 2: (False, True, False), 3: (False, True, True)}


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
    reference_field: str = "ref_audio_path"  # what to call the reference in error messages


def validate_model(model: type[BaseModel], data: Mapping[str, Any]) -> Any:
    """``model.model_validate(data)`` with errors as one OptionsError naming each field."""
    from studio.http.errors import describe_validation_error

    try:
        return model.model_validate(dict(data))
    except ValidationError as e:
        raise OptionsError(describe_validation_error(e.errors())) from None


def parse_language(value: str | None, name: str) -> str:
    from engine.text.frontend import languages

    if value in (None, ""):
        raise OptionsError(f"{name} is required")
    lang = value.lower()
    valid = languages("v2")  # the widest set; the pipeline checks the model version's own set
    if lang not in valid:
        raise UnsupportedLanguageError(f"{name}: {value!r} is not supported; use one of {', '.join(valid)}")
    return lang


def streaming_flags(mode: bool | int) -> tuple[bool, bool, bool]:
    key = int(mode) if isinstance(mode, bool) else mode
    if key not in STREAMING_MODES:
        raise OptionsError(f"streaming_mode: {mode!r} is not valid; use 0, 1, 2, 3 or true/false")
    return STREAMING_MODES[key]


def build_job(ctx: "ServerContext", req: TTSRequest, ref_upload: bytes | None = None,
              aux_uploads: tuple[bytes, ...] = ()) -> TTSJob:
    """Check a request (all but what depends on the model) and turn it into a job."""
    from engine.pipeline import Reference

    if req.text in (None, "") or not req.text.strip():
        raise OptionsError("text is required (it is empty)")
    limit = ctx.studio.settings.max_text_chars
    if len(req.text) > limit:
        raise OptionsError(f"text: {len(req.text)} characters; at most {limit} are accepted per request")
    if len(req.prompt_text or "") > limit:
        raise OptionsError(f"prompt_text: {len(req.prompt_text)} characters; at most {limit} are accepted")
    text_lang = parse_language(req.text_lang, "text_lang")
    prompt_lang = parse_language(req.prompt_lang, "prompt_lang")
    check_media_type(req.media_type, API_V2_MEDIA_TYPES)
    fragment, streaming, fixed = streaming_flags(req.streaming_mode)
    values = {name: getattr(req, name) for name in OPTION_FIELDS}
    options = ctx.bounded(SynthesisOptions.from_mapping(
        {**values, "return_fragment": fragment, "streaming_mode": streaming, "fixed_length_chunk": fixed}))
    if ref_upload is not None and req.ref_audio_path:
        raise OptionsError("ref_audio_path: give either a server-side path or an uploaded ref_audio, not both")
    audio = ref_upload if ref_upload is not None else ctx.reference_path(req.ref_audio_path)
    aux_paths = list(req.aux_ref_audio_paths or [])
    if len(aux_paths) + len(aux_uploads) > MAX_AUX_REFERENCES:
        raise OptionsError(f"aux_ref_audio_paths: at most {MAX_AUX_REFERENCES} clips")
    aux = tuple(ctx.reference_path(p, f"aux_ref_audio_paths[{i}]") for i, p in enumerate(aux_paths)) + aux_uploads
    reference = Reference(audio=audio, text=req.prompt_text or "", language=prompt_lang, aux_audio=aux)
    gpt = str(ctx.weight_path(req.gpt_weights_path, "gpt_weights_path")) if req.gpt_weights_path else None
    sovits = str(ctx.weight_path(req.sovits_weights_path, "sovits_weights_path")) if req.sovits_weights_path else None
    return TTSJob(req.text, text_lang, reference, options, gpt, sovits, req.media_type,
                  streaming=fragment or streaming)


# ---- work on the worker threads ------------------------------------------------------------


def _start(ctx: "ServerContext", job: TTSJob) -> Iterator[Any]:
    """``Studio.synthesize`` (which validates before the first result, naming text_lang/prompt_lang when
    the model's version lacks a language), with reference errors named after the field that gave the clip."""
    try:
        return ctx.studio.synthesize(job.text, job.text_lang, job.reference, job.options, gpt=job.gpt,
                                     sovits=job.sovits)
    except ReferenceAudioError as e:
        if str(e).startswith(("ref_audio_path", "aux_ref_audio_paths")):
            raise
        raise ReferenceAudioError(f"{job.reference_field}: {e}") from e


V3_SAMPLE_RATE = 24000  # only v3 speaks at 24 kHz: the official code super-samples v3 only


def synthesize_whole(ctx: "ServerContext", job: TTSJob, encode_as: str | None = None,
                     rate: int | None = None) -> tuple[bytes, int, float]:
    """Synthesise the whole text and encode it: (file bytes, sample rate, seconds of audio)."""
    from engine.audio_formats import encode
    from engine.pipeline import join

    results = _start(ctx, job)
    try:
        sr, audio = join(results)
    finally:
        results.close()
    seconds = len(audio) / sr
    ctx.metrics.audio_seconds.inc(amount=seconds)
    if job.options.super_sampling and sr == V3_SAMPLE_RATE and ctx.super_sampler is not None:
        sampler = ctx.super_sampler.get()  # absent: the audio keeps its rate, as in the official code
        if sampler is not None:
            audio, sr = sampler(audio, sr)
    if rate is not None and rate != sr:
        from engine.audio import resample_soxr

        audio, sr = resample_soxr(audio, sr, rate), rate
    return encode(audio, sr, encode_as or job.media_type), sr, seconds


def start_stream(ctx: "ServerContext", job: TTSJob) -> Iterator[bytes]:
    """Validate and start synthesis (errors raise here, before any byte), then encode each result as
    the official streaming response does."""
    from engine.audio_formats import encode_stream

    results = _start(ctx, job)

    def chunks() -> Iterator[tuple[int, Any]]:
        for r in results:
            ctx.metrics.audio_seconds.inc(amount=len(r.audio) / r.sample_rate)
            yield r.sample_rate, r.audio

    def encoded() -> Iterator[bytes]:
        try:
            yield from encode_stream(chunks(), job.media_type)
        finally:
            results.close()

    return encoded()


# ---- responses -----------------------------------------------------------------------------


async def respond(ctx: "ServerContext", job: TTSJob, endpoint: str, t0: float):
    """Run a job on the worker pool: a whole-file Response or a StreamingResponse."""
    metrics = ctx.metrics
    labels = {"endpoint": endpoint}
    headers = language_warning(job.text, job.text_lang)
    if not job.streaming:
        data, _, _ = await ctx.runner.run(synthesize_whole, ctx, job)
        elapsed = time.perf_counter() - t0
        metrics.first_chunk.observe(elapsed, labels)
        metrics.latency.observe(elapsed, labels)
        return Response(data, media_type=content_type(job.media_type), headers=headers)
    stream = await ctx.runner.stream(lambda: start_stream(ctx, job), ctx.settings.max_pending_chunks)

    async def body():
        import logging

        first = True
        try:
            async for chunk in stream:
                if first:
                    metrics.first_chunk.observe(time.perf_counter() - t0, labels)
                    first = False
                yield chunk
        except Exception as e:  # noqa: BLE001 - the status line is sent; end the stream and say why in the log
            logging.getLogger(__name__).error("streaming synthesis failed after it started: %s", e, exc_info=e)
        finally:
            stream.cancel()
            metrics.latency.observe(time.perf_counter() - t0, labels)

    return StreamingResponse(body(), media_type=content_type(job.media_type), headers=headers)


def language_warning(text: str, text_lang: str) -> dict[str, str]:
    """``X-Text-Language-Warning`` when ``text_lang`` reads almost none of the text (synthesis still runs)."""
    from engine.text.language_check import check_text_language

    message = check_text_language(text, text_lang).message()
    return {"X-Text-Language-Warning": message} if message else {}


async def read_request(request: "Request") -> tuple[TTSRequest, bytes | None, tuple[bytes, ...]]:
    """The request's fields from the query (GET), a JSON body or a multipart form (POST), plus uploads."""
    if request.method == "GET":
        data: dict[str, Any] = dict(request.query_params)
        if "aux_ref_audio_paths" in data:
            data["aux_ref_audio_paths"] = request.query_params.getlist("aux_ref_audio_paths")
        return validate_model(TTSRequest, data), None, ()
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data") or ctype.startswith("application/x-www-form-urlencoded"):
        return await _read_form(request)
    try:
        data = await request.json()
    except ValueError as e:
        raise OptionsError(f"request body: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise OptionsError("request body: expected a JSON object of TTS_Request fields")
    return validate_model(TTSRequest, data), None, ()


async def _read_form(request: "Request") -> tuple[TTSRequest, bytes | None, tuple[bytes, ...]]:
    from starlette.datastructures import UploadFile

    form = await request.form(max_files=1 + MAX_AUX_REFERENCES, max_fields=64)
    try:
        data: dict[str, Any] = {}
        uploads: dict[str, list[UploadFile]] = {}
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                uploads.setdefault(key, []).append(value)
            elif key == "aux_ref_audio_paths":
                data.setdefault(key, []).append(value)
            else:
                data[key] = value
        unknown = sorted(set(uploads) - {"ref_audio", "aux_ref_audio"})
        if unknown:
            raise OptionsError(f"{unknown[0]}: unexpected file field; upload clips as ref_audio and aux_ref_audio")
        if len(uploads.get("ref_audio", [])) > 1:
            raise OptionsError("ref_audio: upload one main reference clip")
        ref = await _upload_bytes(uploads["ref_audio"][0], "ref_audio") if "ref_audio" in uploads else None
        aux = tuple([await _upload_bytes(f, f"aux_ref_audio[{i}]") for i, f in enumerate(uploads.get("aux_ref_audio", []))])
        return validate_model(TTSRequest, data), ref, aux
    finally:
        await form.close()


async def _upload_bytes(upload, name: str) -> bytes:
    data = await upload.read()
    if not data:
        raise OptionsError(f"{name}: the uploaded file is empty")
    return data


# ---- routes --------------------------------------------------------------------------------


def router(ctx: "ServerContext") -> "APIRouter":
    from studio.http.runner import ServerBusyError

    r = APIRouter()

    async def tts(request: Request):
        t0 = time.perf_counter()
        req, ref_upload, aux_uploads = await read_request(request)
        job = build_job(ctx, req, ref_upload, aux_uploads)
        return await respond(ctx, job, "/tts", t0)

    @r.get("/tts")
    async def tts_get(request: Request):
        """Text to speech with the official api_v2 query parameters."""
        return await tts(request)

    @r.post("/tts")
    async def tts_post(request: Request):
        """Text to speech from a JSON ``TTS_Request`` body, or a multipart form with the clip as ``ref_audio``."""
        return await tts(request)

    async def set_weights(kind: str, weights_path: str | None):
        if weights_path in (None, ""):
            return JSONResponse({"message": f"{kind} weight path is required"}, status_code=400)
        try:
            path = ctx.weight_path(weights_path, "weights_path")
            args = {"gpt": path} if kind == "gpt" else {"sovits": path}
            await ctx.runner.run(lambda: ctx.studio.set_default_weights(**args))
        except ServerBusyError:
            raise
        except EngineError as e:
            return JSONResponse({"message": f"change {kind} weight failed", "Exception": str(e)}, status_code=400)
        return JSONResponse({"message": "success"})

    @r.get("/set_gpt_weights")
    async def set_gpt_weights(weights_path: str | None = None):
        """Change the default GPT weights (requests naming gpt_weights_path are not affected)."""
        return await set_weights("gpt", weights_path)

    @r.get("/set_sovits_weights")
    async def set_sovits_weights(weights_path: str | None = None):
        """Change the default SoVITS weights (requests naming sovits_weights_path are not affected)."""
        return await set_weights("sovits", weights_path)

    @r.get("/set_refer_audio")
    async def set_refer_audio(refer_audio_path: str | None = None):
        """Check that a reference clip is usable (the official call preloads it; our cache is keyed by content)."""
        from engine.reference import read_reference

        try:
            path = ctx.reference_path(refer_audio_path, "refer_audio_path")
            await ctx.runner.run(read_reference, path, ctx.studio.reference_rules)
        except ServerBusyError:
            raise
        except EngineError as e:
            return JSONResponse({"message": "set refer audio failed", "Exception": str(e)}, status_code=400)
        return JSONResponse({"message": "success"})

    async def control(request: Request):
        command = request.query_params.get("command")
        if command is None and request.method == "POST":
            try:
                body = await request.json()
                command = body.get("command") if isinstance(body, dict) else None
            except ValueError:
                command = None
        if command in (None, ""):
            return JSONResponse({"message": "command is required"}, status_code=400)
        if command not in ("restart", "exit"):
            return JSONResponse({"message": f"command: {command!r} is not one of restart, exit"}, status_code=400)
        if ctx.on_control is None:
            return JSONResponse({"message": "control: this server does not accept process commands"},
                                status_code=403)
        ctx.on_control(command)
        return JSONResponse({"message": f"{command} scheduled"})

    @r.get("/control")
    async def control_get(request: Request):
        """``command=restart|exit``; only when the server was started with process control (``serve``)."""
        return await control(request)

    @r.post("/control")
    async def control_post(request: Request):
        """``{"command": "restart"|"exit"}``; only when the server runs under ``serve``."""
        return await control(request)

    return r
