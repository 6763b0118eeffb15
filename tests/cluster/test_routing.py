"""Which model set a request routes by: the weights it names (query, JSON, form, saved voice), resolved as
the server resolves them, the cluster's defaults for the rest, and never an error of its own."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from studio.cluster.asgi import ForwardedRequest
from studio.cluster.routing import ModelSet, model_set_for
from tests.support.server import reference_wav


@pytest.fixture
def weights(tmp_path) -> dict[str, str]:
    folder = tmp_path / "weights"
    folder.mkdir()
    names = {"gpt": "a.ckpt", "sovits": "a.pth", "gpt2": "b.ckpt", "sovits2": "b.pth"}
    for name in names.values():
        (folder / name).write_bytes(b"x")
    (tmp_path / "outside.ckpt").write_bytes(b"x")
    return {k: str((folder / v).resolve()) for k, v in names.items()} | {"root": str(folder), "tmp": str(tmp_path)}


def forwarded(method: str, url: str, **kw) -> ForwardedRequest:
    request = httpx.Request(method, "http://cluster" + url, **kw)
    body = request.read()
    headers = tuple((k.lower(), v) for k, v in request.headers.raw)  # ASGI names headers in lower case
    return ForwardedRequest(method, request.url.path, request.url.query, headers, body)


def test_model_set_id_round_trips_and_differs_per_pair():
    a, b = ModelSet("/w/a.ckpt", "/w/a.pth"), ModelSet("/w/a.ckpt", "/w/b.pth")
    assert ModelSet.from_id(a.id) == a and a.id != b.id
    assert a.replace(sovits="/w/b.pth") == b and a.replace() == a


@pytest.mark.parametrize("style", ["query", "json", "multipart", "urlencoded"])
def test_tts_names_its_weights_in_every_request_style(weights, style):
    defaults = ModelSet(weights["gpt"], weights["sovits"])
    fields = {"text": "hi", "gpt_weights_path": weights["gpt2"], "sovits_weights_path": weights["sovits2"]}
    if style == "query":
        request = forwarded("GET", "/tts", params=fields)
    elif style == "json":
        request = forwarded("POST", "/tts", json=fields)
    elif style == "multipart":
        request = forwarded("POST", "/tts", data=fields, files={"ref_audio": ("r.wav", reference_wav(0), "audio/wav")})
    else:
        request = forwarded("POST", "/tts", data=fields)
    assert model_set_for(request, defaults, (weights["root"],)) == ModelSet(weights["gpt2"], weights["sovits2"])


def test_what_a_request_leaves_out_comes_from_the_defaults(weights):
    defaults = ModelSet(weights["gpt"], weights["sovits"])
    only_gpt = forwarded("GET", "/tts", params={"gpt_weights_path": weights["gpt2"]})
    assert model_set_for(only_gpt, defaults, (weights["root"],)) == ModelSet(weights["gpt2"], weights["sovits"])
    assert model_set_for(forwarded("GET", "/tts", params={"text": "x"}), defaults, (weights["root"],)) == defaults


def test_paths_are_resolved_as_the_server_resolves_them(weights):
    defaults = ModelSet(weights["gpt"], weights["sovits"])
    spelled = str(Path(weights["root"]) / ".." / "weights" / "b.ckpt")  # same file, another spelling
    request = forwarded("POST", "/tts", json={"gpt_weights_path": spelled})
    assert model_set_for(request, defaults, (weights["root"],)).gpt == weights["gpt2"]


@pytest.mark.parametrize("value", ["outside", "missing", 12, ""])
def test_weights_the_server_would_refuse_route_by_the_defaults(weights, value):
    defaults = ModelSet(weights["gpt"], weights["sovits"])
    given = {"outside": str(Path(weights["tmp"]) / "outside.ckpt"),
             "missing": str(Path(weights["root"]) / "nope.ckpt")}.get(value, value)
    request = forwarded("POST", "/tts", json={"gpt_weights_path": given})
    assert model_set_for(request, defaults, (weights["root"],)) == defaults


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b""])
def test_unreadable_bodies_route_by_the_defaults(weights, body):
    defaults = ModelSet(weights["gpt"], weights["sovits"])
    request = ForwardedRequest("POST", "/tts", headers=((b"content-type", b"application/json"),), body=body)
    assert model_set_for(request, defaults, (weights["root"],)) == defaults


def test_requests_that_load_no_model_have_no_model_set(weights):
    defaults = ModelSet(weights["gpt"], weights["sovits"])
    for method, path in [("GET", "/v1/voices"), ("GET", "/set_refer_audio"), ("GET", "/docs")]:
        assert model_set_for(forwarded(method, path), defaults, (weights["root"],)) is None


def test_speech_routes_by_the_weights_of_the_saved_voice(weights, tmp_path):
    from studio.http.profiles import ProfileStore

    defaults = ModelSet(weights["gpt"], weights["sovits"])
    store = ProfileStore(tmp_path / "voices")
    store.save("alice", reference_wav(1), "Hello.", "en", sovits_weights=weights["sovits2"])
    store.save("bob", reference_wav(2), "Hello.", "en")
    roots = (weights["root"],)

    def speech(voice) -> ModelSet:
        request = forwarded("POST", "/v1/audio/speech", json={"input": "hi", "voice": voice})
        return model_set_for(request, defaults, roots, str(tmp_path / "voices"))

    assert speech("alice") == ModelSet(weights["gpt"], weights["sovits2"])
    assert speech({"id": "alice"}) == ModelSet(weights["gpt"], weights["sovits2"])
    assert speech("bob") == defaults
    assert speech("nobody") == defaults  # the replica answers 404 for it


def test_json_body_is_read_as_utf8(weights):
    defaults = ModelSet(weights["gpt"], weights["sovits"])
    body = json.dumps({"text": "你好", "sovits_weights_path": weights["sovits2"]}, ensure_ascii=False).encode()
    request = ForwardedRequest("POST", "/tts", headers=((b"content-type", b"application/json"),), body=body)
    assert model_set_for(request, defaults, (weights["root"],)).sovits == weights["sovits2"]
