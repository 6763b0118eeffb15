"""api_v2 request mapping and the server's path and size rules, without models (a stand-in studio)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from engine.data import load_json
from engine.errors import OptionsError
from engine.options import EngineSettings, SynthesisOptions
from studio.http.api_v2 import OPTION_FIELDS, STREAMING_MODES, TTSRequest, streaming_flags
from studio.http.app import create_app
from studio.http.context import ServerSettings
from studio.http.limits import ServerLimits


class FakeStudio:
    """Just what create_app reads; synthesis must never be reached by these tests."""

    def __init__(self, root: Path) -> None:
        self.settings = EngineSettings()
        self.default_weights = SimpleNamespace(gpt=root / "w" / "a.ckpt", sovits=root / "w" / "b.pth")
        zero = SimpleNamespace(hits=0, misses=0, loads=0)
        self.references = SimpleNamespace(stats=lambda: zero)
        self.pool = SimpleNamespace(stats=lambda: zero)

    def synthesize(self, *a, **k):
        raise AssertionError("no synthesis expected")

    cloner = synthesize


def test_request_defaults_are_the_official_api_v2_defaults() -> None:
    official = load_json("model_configs.json")["api_v2.py TTS_Request defaults"]
    ours = TTSRequest()
    assert {k: getattr(ours, k) for k in official} == official
    for required in ("text", "text_lang", "ref_audio_path", "prompt_lang", "aux_ref_audio_paths"):
        assert getattr(ours, required) is None
    # every option the request carries is a SynthesisOptions field of the same name
    assert set(OPTION_FIELDS) <= {f for f in SynthesisOptions.__dataclass_fields__}
    assert set(official) - set(OPTION_FIELDS) == {"prompt_text", "media_type", "streaming_mode"}


def test_streaming_mode_mapping_is_the_official_one() -> None:
    # api_v2.tts_handle: 0/False normal; 1/True return_fragment; 2 streaming; 3 streaming + fixed chunks
    assert streaming_flags(False) == streaming_flags(0) == (False, False, False)
    assert streaming_flags(True) == streaming_flags(1) == (True, False, False)
    assert streaming_flags(2) == (False, True, False) and streaming_flags(3) == (False, True, True)
    assert set(STREAMING_MODES) == {0, 1, 2, 3}
    with pytest.raises(OptionsError, match="streaming_mode: 4"):
        streaming_flags(4)
    # query strings convert as FastAPI would convert the official GET parameters
    assert TTSRequest.model_validate({"streaming_mode": "2"}).streaming_mode == 2
    assert TTSRequest.model_validate({"streaming_mode": "true"}).streaming_mode is True


def _context(tmp_path: Path, **settings):
    app = create_app(FakeStudio(tmp_path), ServerSettings(**settings))
    return app, app.state.context


def test_reference_paths_stay_inside_the_reference_folders(tmp_path) -> None:
    refs = tmp_path / "refs"
    (refs / "sub").mkdir(parents=True)
    (refs / "sub" / "a.wav").write_bytes(b"x")
    (tmp_path / "outside.wav").write_bytes(b"x")
    os.symlink(tmp_path / "outside.wav", refs / "link.wav")
    _, ctx = _context(tmp_path, reference_roots=(str(refs),))
    assert ctx.reference_path("sub/a.wav") == (refs / "sub" / "a.wav").resolve()
    assert ctx.reference_path(str(refs / "sub" / "a.wav")) == (refs / "sub" / "a.wav").resolve()
    refused = []
    for bad in ("../outside.wav", "sub/../../outside.wav", str(tmp_path / "outside.wav"), "link.wav",
                "../missing.wav", str(tmp_path / "missing.wav"), "sub/b.wav", "a\x00.wav"):
        with pytest.raises(OptionsError) as info:
            ctx.reference_path(bad, "ref_audio_path")
        assert info.value.field == "ref_audio_path"
        refused.append(str(info.value).replace(repr(bad), "PATH"))
    # one message for every refusal: an existing file outside reads as a missing one (no existence oracle)
    assert set(refused) == {"PATH is not a file in the server's reference folders"}
    _, closed = _context(tmp_path)
    with pytest.raises(OptionsError, match="server-side reference paths are disabled"):
        closed.reference_path("sub/a.wav")


def test_weight_paths_default_to_the_folders_of_the_default_weights(tmp_path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "other.ckpt").write_bytes(b"x")
    (tmp_path / "elsewhere.ckpt").write_bytes(b"x")
    _, ctx = _context(tmp_path)
    assert ctx.weight_path(str(tmp_path / "w" / "other.ckpt"), "gpt_weights_path").name == "other.ckpt"
    for bad in (tmp_path / "w" / ".." / "elsewhere.ckpt", tmp_path / "nowhere.ckpt", tmp_path / "w" / "none.ckpt"):
        with pytest.raises(OptionsError, match="is not a weight file in the server's weight folders") as info:
            ctx.weight_path(str(bad), "gpt_weights_path")
        assert info.value.field == "gpt_weights_path" and str(tmp_path / "w") not in str(info.value).split("'")[-1]


def test_bodies_over_the_limit_are_refused_with_413(tmp_path) -> None:
    app, _ = _context(tmp_path, limits=ServerLimits(max_upload_bytes=1000))

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            declared = await c.post("/tts", content=b"x" * 5000, headers={"content-type": "application/json"})

            async def chunks():
                for _ in range(10):
                    yield b"y" * 500

            chunked = await c.post("/tts", content=chunks(), headers={"content-type": "application/json"})
            small = await c.post("/tts", json={"text": ""})
            metrics = await c.get("/metrics")
        return declared, chunked, small, metrics

    declared, chunked, small, metrics = asyncio.run(main())
    assert declared.status_code == 413 and "the limit is 1000" in declared.json()["message"]
    assert chunked.status_code == 413 and "the limit is 1000" in chunked.json()["message"]
    assert small.status_code == 400 and small.json()["message"] == "text is required (it is empty)"
    assert 'sovits_requests_total{endpoint="/tts",status="413"} 2' in metrics.text


def test_apps_share_nothing(tmp_path) -> None:
    a, ctx_a = _context(tmp_path)
    b, ctx_b = _context(tmp_path)
    assert ctx_a is not ctx_b and ctx_a.runner is not ctx_b.runner and ctx_a.metrics is not ctx_b.metrics
    schema = a.openapi()["paths"]
    paths = {(p, m.upper()) for p, ops in schema.items() for m in ops}
    for route in (("/tts", "GET"), ("/tts", "POST"), ("/set_gpt_weights", "GET"), ("/set_sovits_weights", "GET"),
                  ("/control", "GET"), ("/v1/audio/speech", "POST"), ("/health", "GET"), ("/v1/voices", "GET")):
        assert route in paths


def test_settings_are_validated() -> None:
    with pytest.raises(OptionsError, match="workers"):
        ServerLimits(workers=0)
    with pytest.raises(OptionsError, match="max_tokens_per_sentence"):
        ServerLimits(max_tokens_per_sentence=0)
    with pytest.raises(OptionsError, match="shutdown_grace_s"):
        ServerLimits(shutdown_grace_s=float("inf"))
    with pytest.raises(OptionsError, match="reference_roots"):
        ServerSettings(reference_roots="refs")


def test_an_unexpected_failure_is_a_json_500_and_counted(tmp_path) -> None:
    refs = tmp_path / "refs"
    refs.mkdir()
    (refs / "a.wav").write_bytes(b"x")
    app, _ = _context(tmp_path, reference_roots=(str(refs),))
    body = {"text": "hi", "text_lang": "en", "prompt_lang": "en", "ref_audio_path": "a.wav"}

    async def main():
        # Starlette re-raises after answering (for the server log); the client still gets the answer
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            failed = await c.post("/tts", json=body)
            openai = await c.post("/v1/audio/speech", json={"input": "hi", "voice": "x"})
            metrics = await c.get("/metrics")
        return failed, openai, metrics

    failed, openai, metrics = asyncio.run(main())
    assert failed.status_code == 500
    request_id = failed.headers["x-request-id"]
    # no exception text in the body: the id, which the log line carries with the traceback
    assert failed.json() == {"message": f"internal error (request id {request_id}); the server log has the details",
                             "request_id": request_id}
    assert openai.status_code == 400 and openai.json()["error"]["param"] == "voice"  # no profiles folder
    assert 'sovits_requests_total{endpoint="/tts",status="500"} 1' in metrics.text


def test_serve_command_with_a_key_file_guards_every_route_and_exits_on_control(tmp_path) -> None:
    """`sovits-studio serve --api-key-file` as a user runs it (no weights yet): it warns, serves only clients
    with the key, and `/control?command=exit` (with the key) ends it cleanly."""
    import subprocess
    import sys
    import time

    from tests.support.paths import REPO
    from tests.support.server import free_port

    port = free_port()
    key = "test-key-0123456789abcdef"
    (tmp_path / "keys").write_text(f"# the clients' key\n{key}\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "studio.cli", "serve", "-p", str(port), "--api-key-file", "keys"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    auth = {"X-API-Key": key}
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, headers=auth)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"serve did not start: {proc.communicate()[1][-2000:]}") from None
                time.sleep(0.2)
        assert health.json()["status"] in ("starting", "ready")  # warm-up (no weights here: it ends at once)
        for path in ("/health", "/tts", "/metrics", "/v1/voices", "/docs", "/control?command=exit"):  # every route
            assert httpx.get(f"http://127.0.0.1:{port}{path}").status_code == 401, path
        wrong = httpx.get(f"http://127.0.0.1:{port}/control", params={"command": "exit"},
                          headers={"Authorization": "Bearer not-the-key-at-all-000"})
        assert wrong.status_code == 401
        done = httpx.get(f"http://127.0.0.1:{port}/control", params={"command": "exit"}, headers=auth)
        assert done.status_code == 200
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    assert "sovits-studio download --version v2" in err  # the missing default weights, and how to get them


def test_mounted_under_a_prefix_keeps_its_error_shapes_and_labels(tmp_path) -> None:
    """The web UI mounts this app beside Gradio; paths, OpenAI error shapes and metric labels still hold."""
    from fastapi import FastAPI

    app, _ = _context(tmp_path)
    outer = FastAPI()
    outer.mount("/api", app)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=outer), base_url="http://test") as c:
            speech = await c.post("/api/v1/audio/speech", json={"input": "hi"})
            tts = await c.get("/api/tts", params={"text": ""})
            metrics = await c.get("/api/metrics")
        return speech, tts, metrics

    speech, tts, metrics = asyncio.run(main())
    assert speech.status_code == 400 and speech.json()["error"]["param"] == "voice"
    assert tts.status_code == 400 and tts.json()["message"] == "text is required (it is empty)"
    assert 'sovits_requests_total{endpoint="/tts",status="400"} 1' in metrics.text
