"""OpenAI-compatible speech: ``POST /v1/audio/speech`` where ``voice`` names a saved profile, and
``/v1/voices`` to list, add and delete profiles.

Request fields as OpenAI's: ``model`` (accepted, not used: the profile or the server picks the
weights), ``input`` (at most 4096 characters), ``voice`` (a profile name, or ``{"id": name}``),
``response_format`` (mp3, opus, aac, flac, wav, pcm; default mp3), ``speed`` (0.25-4), and
``instructions`` (accepted, ignored: GPT-SoVITS has no style prompt). ``pcm`` is 24 kHz 16-bit
mono as OpenAI documents. Extensions: ``language`` (default ``auto``), ``seed``, ``top_k``,
``top_p``, ``temperature``, ``text_split_method``, ``sample_steps``. Errors use OpenAI's
``{"error": {"message", "type", "param", "code"}}`` shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from engine.audio_formats import OPENAI_FORMATS, check_media_type
from engine.errors import OptionsError
from engine.options import SynthesisOptions
from studio.http.bodies import read_form, read_json
from studio.http.synthesis import TTSJob, admit, language, respond, validate_model

if TYPE_CHECKING:
    from studio.http.context import ServerContext

MAX_INPUT_CHARS = 4096  # OpenAI's limit for `input`
PCM_RATE = 24000  # OpenAI's pcm format: 24 kHz, 16-bit signed little-endian, mono
_D = SynthesisOptions()
API_SPLIT_METHOD = "cut5"  # as the api_v2 routes (api_v2's TTS_Request default)


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = "tts-1"
    input: str
    voice: str | dict[str, str]
    response_format: str = "mp3"
    speed: float = 1.0
    instructions: str | None = None
    stream_format: str = "audio"
    # SoVITS Studio extensions
    language: str = "auto"
    seed: int = _D.seed
    top_k: int = _D.top_k
    top_p: float = _D.top_p
    temperature: float = _D.temperature
    text_split_method: str = API_SPLIT_METHOD
    sample_steps: int = _D.sample_steps


# the engine's names -> this route's: the saved voice stands for the whole reference
NAMES = {"reference.audio": "voice", "reference.aux_audio": "voice", "reference.text": "voice",
         "reference.language": "voice", "text": "input", "text_lang": "language"}


def build_speech_job(ctx: "ServerContext", req: SpeechRequest) -> TTSJob:
    from engine.reference import Reference
    from studio.http.profiles import check_name

    if ctx.profiles is None:
        raise OptionsError("this server has no saved voices (start it with a profiles folder)", field="voice")
    voice = req.voice.get("id", "") if isinstance(req.voice, dict) else req.voice
    profile = ctx.profiles.get(check_name(voice))
    if not req.input.strip():
        raise OptionsError("input is empty: give the text to speak", field="input")
    if len(req.input) > MAX_INPUT_CHARS:
        raise OptionsError(f"{len(req.input)} characters; at most {MAX_INPUT_CHARS}", field="input")
    check_media_type(req.response_format, OPENAI_FORMATS, "response_format")
    if not 0.25 <= req.speed <= 4.0:
        raise OptionsError(f"{req.speed!r} is outside [0.25, 4.0]", field="speed")
    if req.stream_format != "audio":
        raise OptionsError(f"{req.stream_format!r} is not supported; use 'audio'", field="stream_format")
    options = ctx.bounded(SynthesisOptions.from_mapping({
        "speed_factor": float(req.speed), "seed": req.seed, "top_k": req.top_k, "top_p": req.top_p,
        "temperature": req.temperature, "text_split_method": req.text_split_method, "sample_steps": req.sample_steps,
    }))
    try:
        prompt_lang = language(profile.prompt_lang, "prompt_lang")
        gpt = str(ctx.weight_path(profile.gpt_weights, "gpt_weights")) if profile.gpt_weights else None
        sovits = str(ctx.weight_path(profile.sovits_weights, "sovits_weights")) if profile.sovits_weights else None
    except OptionsError as e:
        raise OptionsError(f"the saved voice {voice!r} is unusable ({e})", field="voice") from None
    reference = Reference(audio=profile.audio_path, text=profile.prompt_text, language=prompt_lang,
                          aux_audio=profile.aux_audio_paths)
    return TTSJob(req.input, language(req.language, "language"), reference, options, gpt, sovits,
                  req.response_format, streaming=False, names=NAMES)


async def speech(ctx: "ServerContext", request: Request) -> Response:
    """OpenAI ``audio.speech.create``: text in the voice of a saved profile."""
    ex = admit(ctx, request)
    ex.names = NAMES
    body = await read_json(request, ctx.limits.max_json_depth, ctx.limits.max_json_items)
    ex.check_drained(ctx.limits.retry_after_s)  # SIGTERM came while the body arrived: 503 before any check
    job = await run_in_threadpool(build_speech_job, ctx, validate_model(SpeechRequest, body))  # file checks
    rate = PCM_RATE if job.media_type == "pcm" else None
    return await respond(ctx, request, ex, job, "/v1/audio/speech", encode_as=job.media_type, rate=rate)


def _store(ctx: "ServerContext", writing: bool = False):
    if ctx.profiles is None:
        raise OptionsError("this server has no saved voices (start it with a profiles folder)", field="voice")
    if writing and not ctx.settings.voice_uploads:
        raise OptionsError("this server does not accept new or deleted voices", field="voices")
    return ctx.profiles


async def list_voices(ctx: "ServerContext", request: Request) -> dict[str, Any]:
    """The saved voices (what ``voice`` may name)."""
    return {"voices": [p.to_json() for p in (ctx.profiles.list() if ctx.profiles else [])]}


async def add_voice(ctx: "ServerContext", request: Request) -> JSONResponse:
    """Save a voice: multipart fields ``name``, ``prompt_text``, ``prompt_lang`` and file ``audio``. The clip
    is checked as a request's reference is (the server's reference rules) before anything is stored."""
    from starlette.datastructures import UploadFile

    profiles = _store(ctx, writing=True)
    if len(profiles.names()) >= ctx.limits.max_profiles:  # early, before the body is read (the store checks again)
        raise OptionsError(f"{ctx.limits.max_profiles} voices are saved already, the most this server keeps "
                           "(max_profiles); delete one first", field="voices")
    form = await read_form(request, max_files=1, max_fields=16)
    try:
        audio = form.get("audio")
        if not isinstance(audio, UploadFile):
            raise OptionsError("upload the reference clip as multipart file field 'audio'", field="audio")
        fields = {k: form.get(k) for k in ("name", "prompt_text", "prompt_lang")}
        for k, v in fields.items():
            if not isinstance(v, str) or (k != "prompt_text" and not v):
                raise OptionsError(f"{k} is required (a form field)", field=k)
        data = await audio.read()
        suffix = Path(audio.filename or "clip.wav").suffix or ".wav"
        profile = await ctx.runner.run(lambda: profiles.save(
            fields["name"], data, fields["prompt_text"], fields["prompt_lang"], suffix=suffix,
            rules=ctx.studio.reference_rules))
    finally:
        await form.close()
    return JSONResponse(profile.to_json(), status_code=201)


async def delete_voice(ctx: "ServerContext", request: Request) -> dict[str, str]:
    """Delete a saved voice."""
    name = request.path_params["name"]
    _store(ctx, writing=True).delete(name)
    return {"message": "deleted", "name": name}


def router(ctx: "ServerContext") -> APIRouter:
    """The OpenAI-compatible routes over ``ctx`` (under ``/v1``)."""
    from studio.http.api_v2 import bind

    r = APIRouter(prefix="/v1")
    r.add_api_route("/audio/speech", bind(ctx, speech, name="speech"), methods=["POST"])
    r.add_api_route("/voices", bind(ctx, list_voices, name="list_voices"), methods=["GET"])
    r.add_api_route("/voices", bind(ctx, add_voice, name="add_voice"), methods=["POST"], status_code=201)
    r.add_api_route("/voices/{name}", bind(ctx, delete_voice, name="delete_voice"), methods=["DELETE"])
    return r
