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

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from engine.audio_formats import OPENAI_FORMATS, check_media_type, content_type
from engine.errors import OptionsError
from engine.options import SynthesisOptions
from studio.http.api_v2 import API_SPLIT_METHOD, TTSJob, parse_language, synthesize_whole, validate_model

if TYPE_CHECKING:
    from studio.http.context import ServerContext

MAX_INPUT_CHARS = 4096  # OpenAI's limit for `input`
PCM_RATE = 24000  # OpenAI's pcm format: 24 kHz, 16-bit signed little-endian, mono
_D = SynthesisOptions()


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


def build_speech_job(ctx: "ServerContext", req: SpeechRequest) -> TTSJob:
    from engine.pipeline import Reference
    from studio.http.profiles import check_name

    if ctx.profiles is None:
        raise OptionsError("voice: this server has no saved voices (start it with a profiles folder)")
    voice = req.voice.get("id", "") if isinstance(req.voice, dict) else req.voice
    profile = ctx.profiles.get(check_name(voice))
    if not req.input.strip():
        raise OptionsError("input is empty: give the text to speak")
    if len(req.input) > MAX_INPUT_CHARS:
        raise OptionsError(f"input: {len(req.input)} characters; at most {MAX_INPUT_CHARS}")
    check_media_type(req.response_format, OPENAI_FORMATS, "response_format")
    if not 0.25 <= req.speed <= 4.0:
        raise OptionsError(f"speed: {req.speed!r} is outside [0.25, 4.0]")
    if req.stream_format != "audio":
        raise OptionsError(f"stream_format: {req.stream_format!r} is not supported; use 'audio'")
    options = ctx.bounded(SynthesisOptions.from_mapping({
        "speed_factor": float(req.speed), "seed": req.seed, "top_k": req.top_k, "top_p": req.top_p,
        "temperature": req.temperature, "text_split_method": req.text_split_method, "sample_steps": req.sample_steps,
    }))
    reference = Reference(audio=profile.audio_path, text=profile.prompt_text,
                          language=parse_language(profile.prompt_lang, f"voice {voice}: prompt_lang"),
                          aux_audio=profile.aux_audio_paths)
    gpt = str(ctx.weight_path(profile.gpt_weights, f"voice {voice}: gpt_weights")) if profile.gpt_weights else None
    sovits = (str(ctx.weight_path(profile.sovits_weights, f"voice {voice}: sovits_weights"))
              if profile.sovits_weights else None)
    return TTSJob(req.input, parse_language(req.language, "language"), reference, options, gpt, sovits,
                  req.response_format, streaming=False, reference_field=f"voice {voice}")


def router(ctx: "ServerContext") -> "APIRouter":
    r = APIRouter(prefix="/v1")

    @r.post("/audio/speech")
    async def speech(request: Request) -> Response:
        """OpenAI ``audio.speech.create``: text in the voice of a saved profile."""
        t0 = time.perf_counter()
        try:
            body = await request.json()
        except ValueError as e:
            raise OptionsError(f"request body: not valid JSON ({e})") from None
        if not isinstance(body, dict):
            raise OptionsError("request body: expected a JSON object")
        job = build_speech_job(ctx, validate_model(SpeechRequest, body))
        rate = PCM_RATE if job.media_type == "pcm" else None
        data, sr, _ = await ctx.runner.run(synthesize_whole, ctx, job, job.media_type, rate)
        elapsed = time.perf_counter() - t0
        labels = {"endpoint": "/v1/audio/speech"}
        ctx.metrics.first_chunk.observe(elapsed, labels)
        ctx.metrics.latency.observe(elapsed, labels)
        return Response(data, media_type=content_type(job.media_type), headers={"X-Sample-Rate": str(sr)})

    def store():
        if ctx.profiles is None:
            raise OptionsError("voice: this server has no saved voices (start it with a profiles folder)")
        return ctx.profiles

    def writable():
        if not ctx.settings.voice_uploads:
            raise OptionsError("voices: this server does not accept new or deleted voices")
        return store()

    @r.get("/voices")
    async def list_voices() -> dict[str, Any]:
        """The saved voices (what ``voice`` may name)."""
        return {"voices": [p.to_json() for p in (ctx.profiles.list() if ctx.profiles else [])]}

    @r.post("/voices", status_code=201)
    async def add_voice(request: Request) -> JSONResponse:
        """Save a voice: multipart fields ``name``, ``prompt_text``, ``prompt_lang`` and file ``audio``."""
        from starlette.datastructures import UploadFile

        profiles = writable()
        if len(profiles.names()) >= ctx.settings.max_profiles:
            raise OptionsError(f"voices: {ctx.settings.max_profiles} voices are saved already; delete one first")
        form = await request.form(max_files=1, max_fields=16)
        try:
            audio = form.get("audio")
            if not isinstance(audio, UploadFile):
                raise OptionsError("audio: upload the reference clip as multipart file field 'audio'")
            fields = {k: form.get(k) for k in ("name", "prompt_text", "prompt_lang")}
            for k, v in fields.items():
                if not isinstance(v, str) or (k != "prompt_text" and not v):
                    raise OptionsError(f"{k} is required (a form field)")
            data = await audio.read()
            suffix = Path(audio.filename or "clip.wav").suffix or ".wav"
            profile = await ctx.runner.run(lambda: profiles.save(
                fields["name"], data, fields["prompt_text"], fields["prompt_lang"], suffix=suffix))
        finally:
            await form.close()
        return JSONResponse(profile.to_json(), status_code=201)

    @r.delete("/voices/{name}")
    async def delete_voice(name: str) -> dict[str, str]:
        writable().delete(name)
        return {"message": "deleted", "name": name}

    return r
