"""The official ``api_v2.py`` interface (RVC-Boss/GPT-SoVITS): ``/tts``, ``/set_gpt_weights``, ``/set_sovits_weights``,
``/set_refer_audio``, ``/control``, with the official parameter names, defaults and response formats.

Compatible: GET query or POST JSON with the ``TTS_Request`` fields; ``streaming_mode`` 0-3 or
true/false; wav/raw/ogg/aac; a streamed WAV is one zero-frame header and then raw PCM; errors are
``{"message": ...}``. Different on purpose: every field is checked and the message names it;
``ref_audio_path`` must lie in a configured reference folder (or the clip is uploaded as multipart
field ``ref_audio``); each request may name its own ``gpt_weights_path``/``sovits_weights_path``
(``/set_*_weights`` only change the defaults for requests naming none, never a running request's
models); unexpected failures answer 500, not 400; errors carry a ``request_id`` (also the
``X-Request-Id`` header) and never exception text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from engine.audio_formats import API_V2_MEDIA_TYPES, check_media_type
from engine.errors import EngineError, OptionsError
from engine.options import SynthesisOptions
from studio.http.bodies import is_form, read_form, read_json
from studio.http.errors import status_for
from studio.http.synthesis import TTSJob, admit, exchange, language, respond, validate_model

if TYPE_CHECKING:
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
# the engine's names for what a request gives -> the api_v2 parameter names
NAMES = {"reference.audio": "ref_audio_path", "reference.aux_audio": "aux_ref_audio_paths",
         "reference.text": "prompt_text", "reference.language": "prompt_lang", "text": "text", "text_lang": "text_lang"}


def streaming_flags(mode: bool | int) -> tuple[bool, bool, bool]:
    key = int(mode) if isinstance(mode, bool) else mode
    if key not in STREAMING_MODES:
        raise OptionsError(f"streaming_mode: {mode!r} is not valid; use 0, 1, 2, 3 or true/false",
                           field="streaming_mode")
    return STREAMING_MODES[key]


def _names(paths: int, ref_uploaded: bool, aux_uploaded: int) -> dict[str, str]:
    """NAMES, with the upload fields for clips that came as files (aux: named paths first, then uploads)."""
    names = dict(NAMES)
    if ref_uploaded:
        names["reference.audio"] = "ref_audio"
    for i in range(aux_uploaded):
        names[f"reference.aux_audio[{paths + i}]"] = f"aux_ref_audio[{i}]"
    return names


def build_job(ctx: "ServerContext", req: TTSRequest, ref_upload: bytes | None = None,
              aux_uploads: tuple[bytes, ...] = ()) -> TTSJob:
    """Check a request (all but what depends on the model) and turn it into a job."""
    from engine.reference import Reference

    if req.text in (None, "") or not req.text.strip():
        raise OptionsError("text is required (it is empty)", field="text")
    limit = ctx.studio.settings.max_text_chars
    if len(req.text) > limit:
        raise OptionsError(f"text: {len(req.text)} characters; at most {limit} are accepted per request", field="text")
    if len(req.prompt_text or "") > limit:
        raise OptionsError(f"prompt_text: {len(req.prompt_text)} characters; at most {limit} are accepted",
                           field="prompt_text")
    text_lang = language(req.text_lang, "text_lang")
    prompt_lang = language(req.prompt_lang, "prompt_lang")
    check_media_type(req.media_type, API_V2_MEDIA_TYPES)
    fragment, streaming, fixed = streaming_flags(req.streaming_mode)
    values = {name: getattr(req, name) for name in OPTION_FIELDS}
    options = ctx.bounded(SynthesisOptions.from_mapping(
        {**values, "return_fragment": fragment, "streaming_mode": streaming, "fixed_length_chunk": fixed}))
    if ref_upload is not None and req.ref_audio_path:
        raise OptionsError("give either a server-side path or an uploaded ref_audio, not both", field="ref_audio_path")
    audio = ref_upload if ref_upload is not None else ctx.reference_path(req.ref_audio_path, "ref_audio_path")
    aux_paths = list(req.aux_ref_audio_paths or [])
    if len(aux_paths) + len(aux_uploads) > MAX_AUX_REFERENCES:
        raise OptionsError(f"at most {MAX_AUX_REFERENCES} clips", field="aux_ref_audio_paths")
    aux = tuple(ctx.reference_path(p, f"aux_ref_audio_paths[{i}]") for i, p in enumerate(aux_paths)) + aux_uploads
    reference = Reference(audio=audio, text=req.prompt_text or "", language=prompt_lang, aux_audio=aux)
    gpt = str(ctx.weight_path(req.gpt_weights_path, "gpt_weights_path")) if req.gpt_weights_path else None
    sovits = str(ctx.weight_path(req.sovits_weights_path, "sovits_weights_path")) if req.sovits_weights_path else None
    return TTSJob(req.text, text_lang, reference, options, gpt, sovits, req.media_type,
                  streaming=fragment or streaming,
                  names=_names(len(aux_paths), ref_upload is not None, len(aux_uploads)))


# ---- reading requests -------------------------------------------------------------------------


async def read_request(ctx: "ServerContext", request: Request) -> tuple[TTSRequest, bytes | None, tuple[bytes, ...]]:
    """The request's fields from the query (GET), a JSON body or a form (POST), plus uploaded clips."""
    if request.method == "GET":
        data: dict[str, Any] = dict(request.query_params)
        if "aux_ref_audio_paths" in data:
            data["aux_ref_audio_paths"] = request.query_params.getlist("aux_ref_audio_paths")
        return validate_model(TTSRequest, data), None, ()
    if is_form(request):
        return await _read_form(ctx, request)
    body = await read_json(request, ctx.limits.max_json_depth, ctx.limits.max_json_items)
    return validate_model(TTSRequest, body), None, ()


async def _read_form(ctx: "ServerContext", request: Request) -> tuple[TTSRequest, bytes | None, tuple[bytes, ...]]:
    from starlette.datastructures import UploadFile

    form = await read_form(request, max_files=1 + MAX_AUX_REFERENCES, max_fields=ctx.limits.max_form_fields)
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
            raise OptionsError("unexpected file field; upload clips as ref_audio and aux_ref_audio", field=unknown[0])
        if len(uploads.get("ref_audio", [])) > 1:
            raise OptionsError("upload one main reference clip", field="ref_audio")
        ref = await _upload_bytes(uploads["ref_audio"][0], "ref_audio") if "ref_audio" in uploads else None
        aux = tuple([await _upload_bytes(f, f"aux_ref_audio[{i}]")
                     for i, f in enumerate(uploads.get("aux_ref_audio", []))])
        return validate_model(TTSRequest, data), ref, aux
    finally:
        await form.close()


async def _upload_bytes(upload, name: str) -> bytes:
    data = await upload.read()
    if not data:
        raise OptionsError("the uploaded file is empty", field=name)
    return data


# ---- routes --------------------------------------------------------------------------------


async def tts(ctx: "ServerContext", request: Request):
    """Text to speech: admitted before the body is read, checked before any work, bounded while it runs."""
    ex = admit(ctx, request)
    ex.names = NAMES
    req, ref_upload, aux_uploads = await read_request(ctx, request)
    ex.check_drained(ctx.limits.retry_after_s)  # SIGTERM came while the body arrived: 503 before any check
    job = await run_in_threadpool(build_job, ctx, req, ref_upload, aux_uploads)  # file system checks: off the loop
    return await respond(ctx, request, ex, job, "/tts")


async def set_weights(ctx: "ServerContext", kind: str, request: Request):
    """``/set_gpt_weights`` / ``/set_sovits_weights``: the official answers, our path rule."""
    weights_path = request.query_params.get("weights_path")
    if weights_path in (None, ""):
        return _answer(request, 400, f"{kind} weight path is required")
    try:
        path = await run_in_threadpool(ctx.weight_path, weights_path, "weights_path")
        args = {"gpt": path} if kind == "gpt" else {"sovits": path}
        await ctx.runner.run(lambda: ctx.studio.set_default_weights(**args))
    except EngineError as e:
        if status_for(e) != 400:
            raise  # busy, out of memory: the usual answer (503 + Retry-After)
        return _answer(request, 400, f"change {kind} weight failed", e)
    return JSONResponse({"message": "success"})


async def set_refer_audio(ctx: "ServerContext", request: Request):
    """Check that a reference clip is usable (the official call preloads it; our cache is keyed by content)."""
    from engine.reference import read_reference

    try:
        path = await run_in_threadpool(ctx.reference_path, request.query_params.get("refer_audio_path"),
                                       "refer_audio_path")
        await ctx.runner.run(read_reference, path, ctx.studio.reference_rules)
    except EngineError as e:
        if status_for(e) != 400:
            raise
        return _answer(request, 400, "set refer audio failed", e)
    return JSONResponse({"message": "success"})


def _answer(request: Request, status: int, message: str, error: EngineError | None = None) -> JSONResponse:
    """An official-shape answer: ``{"message"}``, with the error (in the client's words) as ``Exception``."""
    from studio.http.errors import client_message, server_folders

    ex = exchange(request)
    body: dict[str, Any] = {"message": message, "request_id": ex.id}
    if error is not None:
        body["Exception"] = client_message(error, {"reference.audio": "refer_audio_path"}, ex.id,
                                           server_folders(request))[0]
    return JSONResponse(body, status_code=status)


async def control(ctx: "ServerContext", request: Request):
    """``command=restart|exit`` (query or JSON body). Only under ``serve``, and only with an API key or
    ``--allow-control``."""
    command = request.query_params.get("command")
    if command is None and request.method == "POST":
        try:
            body = await read_json(request, ctx.limits.max_json_depth, ctx.limits.max_json_items)
        except OptionsError:
            body = {}
        command = body.get("command")
    if command in (None, ""):
        return _answer(request, 400, "command is required")
    if command not in ("restart", "exit"):
        return _answer(request, 400, f"command: {command!r} is not one of restart, exit")
    if ctx.on_control is None:
        return _answer(request, 403, "control: this server does not accept process commands")
    if not ctx.settings.control_enabled:
        return _answer(request, 403, "control: off; start the server with --api-key (then send the key) "
                                     "or with --allow-control")
    ctx.on_control(command)
    return JSONResponse({"message": f"{command} scheduled"})


def router(ctx: "ServerContext") -> APIRouter:
    """The api_v2 routes over ``ctx``."""
    r = APIRouter()
    # the official routes that change state are GETs; POST (same query) is the form to prefer, and without
    # an API key the guard refuses both from web pages (studio.http.origins)
    routes = (("/tts", ("GET", "POST"), tts, ()), ("/set_gpt_weights", ("GET", "POST"), set_weights, ("gpt",)),
              ("/set_sovits_weights", ("GET", "POST"), set_weights, ("sovits",)),
              ("/set_refer_audio", ("GET", "POST"), set_refer_audio, ()), ("/control", ("GET", "POST"), control, ()))
    for path, methods, fn, args in routes:
        for method in methods:
            r.add_api_route(path, bind(ctx, fn, *args, name=f"{path.strip('/')}_{method.lower()}"), methods=[method])
    return r


def bind(ctx: "ServerContext", fn, *args, name: str):
    """An endpoint that calls ``fn(ctx, *args, request)`` (one per path and method: distinct OpenAPI ids)."""
    async def endpoint(request: Request):
        return await fn(ctx, *args, request)

    endpoint.__name__ = endpoint.__qualname__ = name
    endpoint.__doc__ = fn.__doc__
    return endpoint
