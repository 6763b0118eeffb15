"""Which model set a request needs: the key that routes it to a replica holding that set.

A model set is a (GPT, SoVITS) pair of resolved weight paths. ``/tts`` names its weights in
``gpt_weights_path``/``sovits_weights_path`` (query, JSON or form fields); ``/v1/audio/speech``
through the saved voice it names; anything a request leaves out comes from the cluster's defaults.
Reading a request here never fails it: a value that does not check out routes by the defaults and
the replica's app answers with its usual message.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

from studio.cluster.asgi import ForwardedRequest

SYNTHESIS_PATHS = ("/tts", "/v1/audio/speech")


@dataclass(frozen=True)
class ModelSet:
    """A GPT + SoVITS weight pair; ``id`` is its routing key (``serve.multiplexed`` model id)."""

    gpt: str
    sovits: str

    @property
    def id(self) -> str:
        return json.dumps([self.gpt, self.sovits])

    @classmethod
    def from_id(cls, model_id: str) -> "ModelSet":
        gpt, sovits = json.loads(model_id)
        return cls(str(gpt), str(sovits))

    @classmethod
    def of(cls, gpt: str | os.PathLike, sovits: str | os.PathLike) -> "ModelSet":
        """The set of two weight files, their paths resolved."""
        return cls(str(Path(gpt).resolve()), str(Path(sovits).resolve()))

    def replace(self, gpt: str | None = None, sovits: str | None = None) -> "ModelSet":
        return ModelSet(gpt or self.gpt, sovits or self.sovits)

    def to_json(self) -> dict[str, str]:
        return {"gpt": self.gpt, "sovits": self.sovits}


@dataclass(frozen=True)
class Defaults:
    """The cluster's default model set and its version: ``epoch`` changes when the state restarts,
    ``generation`` on every change, so a replica knows when to follow."""

    models: ModelSet
    epoch: str
    generation: int = 0


def weight_path(value: object, roots: tuple[str, ...]) -> str | None:
    """``value`` resolved as the server resolves weight paths, or None when it is not a usable one."""
    from engine.errors import EngineError
    from engine.loading.model_pool import check_weight_path

    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return str(check_weight_path(value, roots, "weights"))
    except EngineError:
        return None


def _fields_from_body(request: ForwardedRequest) -> dict[str, object]:
    """The top-level fields of a JSON, urlencoded or multipart body ({} when it is none of these)."""
    ctype = (request.header(b"content-type") or b"").decode("latin-1").lower()
    if ctype.startswith("application/x-www-form-urlencoded"):
        return {k: v[-1] for k, v in parse_qs(request.body.decode("utf-8", "replace")).items()}
    if ctype.startswith("multipart/form-data"):
        return _multipart_fields(request.body, ctype)
    try:
        data = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _multipart_fields(body: bytes, ctype: str) -> dict[str, object]:
    """Plain (non-file) fields of a multipart/form-data body."""
    from email.parser import BytesParser
    from email.policy import HTTP

    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + ctype.encode("latin-1") + b"\r\n\r\n" + body)
    if not message.is_multipart():
        return {}
    fields: dict[str, object] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name and part.get_filename() is None:
            payload = part.get_payload(decode=True) or b""
            fields[str(name)] = payload.decode("utf-8", "replace")
    return fields


def requested_weights(request: ForwardedRequest, voices_dir: str = "") -> tuple[object, object]:
    """The (gpt, sovits) values a synthesis request names, unchecked (None where it names none)."""
    if request.path == "/tts":
        if request.method == "GET":
            query = parse_qs(request.query_string.decode("latin-1"))
            fields: dict[str, object] = {k: v[-1] for k, v in query.items()}
        else:
            fields = _fields_from_body(request)
        return fields.get("gpt_weights_path"), fields.get("sovits_weights_path")
    if request.path == "/v1/audio/speech" and voices_dir:
        voice = _fields_from_body(request).get("voice")
        if isinstance(voice, dict):
            voice = voice.get("id")
        return _profile_weights(voices_dir, voice)
    return None, None


def _profile_weights(voices_dir: str, voice: object) -> tuple[object, object]:
    from engine.errors import EngineError
    from studio.http.profiles import ProfileStore

    if not isinstance(voice, str):
        return None, None
    try:
        profile = ProfileStore(voices_dir).get(voice)
    except (EngineError, OSError):
        return None, None
    return profile.gpt_weights or None, profile.sovits_weights or None


def model_set_for(request: ForwardedRequest, defaults: ModelSet, roots: tuple[str, ...],
                  voices_dir: str = "") -> ModelSet | None:
    """The model set a synthesis request will use; None for requests that load no model."""
    if request.path not in SYNTHESIS_PATHS:
        return None
    gpt, sovits = requested_weights(request, voices_dir)
    return defaults.replace(weight_path(gpt, roots), weight_path(sovits, roots))
