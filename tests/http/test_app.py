"""The HTTP API through a real uvicorn server on loopback, with tiny random weights of every version.

The oracle for every audio answer is the pipeline itself: the server's bytes must decode to exactly the
samples ``Studio.synthesize`` gives for the same request (same options, seed and reference), so the
tests check the api_v2 name/default mapping, the encoders and the isolation of concurrent requests.
"""

from __future__ import annotations

import io
import json
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.support.server import (
    MAX_TOKENS,
    VERSIONS,
    reference_wav,
    running_server,
    wav_pcm,
    weight_files,
    write_weight_tree,
)

TIMEOUT = httpx.Timeout(300.0)
PROMPT = {"prompt_text": "Hello.", "prompt_lang": "en"}
OUTPUT_RATES = {"v1": 32000, "v2": 32000, "v2Pro": 32000, "v2ProPlus": 32000, "v3": 24000, "v4": 48000}


# ---- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("weights")
    config = write_weight_tree(root)
    (root / "GPT_SoVITS/pretrained_models/broken.pth").write_bytes(b"PK\x03\x04 not a checkpoint")
    return root, config


@pytest.fixture(scope="module")
def refs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("refs")
    for i in range(16):
        (folder / f"ref_{i:02d}.wav").write_bytes(reference_wav(i))
    (folder / "junk.wav").write_bytes(b"RIFF....WAVEjunk" * 64)
    (folder / "short.wav").write_bytes(reference_wav(99, seconds=1.0))
    (folder.parent / "secret.wav").write_bytes(reference_wav(98))  # outside the reference folder
    return folder


@pytest.fixture(scope="module")
def studio(tree):
    from engine.config import load_config
    from engine.studio import Studio

    root, config = tree
    return Studio.from_config(load_config(config, base_dir=root))


@pytest.fixture(scope="module")
def server(studio, tree, refs, tmp_path_factory):
    from studio.http.app import create_app
    from studio.http.context import ServerSettings

    root, _ = tree
    from studio.http.limits import ServerLimits

    limits = ServerLimits(max_upload_bytes=1 << 20, workers=4, max_queue=32, max_tokens_per_sentence=MAX_TOKENS)
    settings = ServerSettings(reference_roots=(str(refs),), weight_roots=(str(root / "GPT_SoVITS"),),
                              profiles_dir=str(tmp_path_factory.mktemp("voices")), limits=limits)
    app = create_app(studio, settings)
    with running_server(app) as url:
        yield url


def direct(studio, text: str, ref, seed: int, gpt=None, sovits=None, prompt=PROMPT, **options) -> tuple[int, np.ndarray]:
    """What the pipeline gives for an api_v2 request with these values (cut5, the server's token cap)."""
    from engine.options import SynthesisOptions
    from engine.reference import Reference
    from engine.results import join

    opts = SynthesisOptions(text_split_method=options.pop("text_split_method", "cut5"), seed=seed,
                            early_stop_num=MAX_TOKENS, **options)
    results = list(studio.synthesize(text, "en", Reference(ref, prompt["prompt_text"], prompt["prompt_lang"]), opts,
                                     gpt=gpt, sovits=sovits))
    rate, audio = join(results)
    return rate, np.clip(audio * 32768.0, -32768, 32767).astype(np.int16)


def tts_query(ref: str = "ref_00.wav", text: str = "Hi there.", seed: int = 7, **extra) -> dict:
    return {"text": text, "text_lang": "en", "ref_audio_path": ref, **PROMPT, "text_split_method": "cut5",
            "batch_size": 1, "media_type": "wav", "seed": seed, **extra}


# ---- api_v2 ---------------------------------------------------------------------------------


def test_api_v2_client_get_and_post_match_the_pipeline(server, studio, refs) -> None:
    """An official api_v2-style client: GET with query parameters, then the same as a POST JSON body."""
    r = httpx.get(f"{server}/tts", params=tts_query(), timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "audio/wav"
    rate, pcm = wav_pcm(r.content)
    want_rate, want = direct(studio, "Hi there.", refs / "ref_00.wav", 7)
    assert rate == want_rate == 32000 and np.array_equal(pcm, want)
    posted = httpx.post(f"{server}/tts", json=tts_query(), timeout=TIMEOUT)
    assert posted.status_code == 200 and posted.content == r.content
    # language codes are case-insensitive, as the official GET lower-cases them
    upper = httpx.get(f"{server}/tts", params=tts_query(text_lang="EN"), timeout=TIMEOUT)
    assert upper.content == r.content


def test_uploaded_reference_is_the_same_voice_as_the_path(server, refs) -> None:
    path_answer = httpx.post(f"{server}/tts", json=tts_query(), timeout=TIMEOUT)
    fields = {k: str(v) for k, v in tts_query().items() if k != "ref_audio_path"}
    files = {"ref_audio": ("mine.wav", (refs / "ref_00.wav").read_bytes(), "audio/wav")}
    uploaded = httpx.post(f"{server}/tts", data=fields, files=files, timeout=TIMEOUT)
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.content == path_answer.content
    # auxiliary clips: uploaded (aux_ref_audio) or named (aux_ref_audio_paths) give the same voice mix
    named_aux = httpx.post(f"{server}/tts", json=tts_query(aux_ref_audio_paths=["ref_01.wav"]), timeout=TIMEOUT)
    files = [("ref_audio", ("a.wav", (refs / "ref_00.wav").read_bytes())),
             ("aux_ref_audio", ("b.wav", (refs / "ref_01.wav").read_bytes()))]
    uploaded_aux = httpx.post(f"{server}/tts", data=fields, files=files, timeout=TIMEOUT)
    assert named_aux.status_code == uploaded_aux.status_code == 200, uploaded_aux.text
    assert uploaded_aux.content == named_aux.content != path_answer.content


@pytest.mark.parametrize("mode,flags", [(1, {"return_fragment": True}), (2, {"streaming_mode": True})])
def test_streaming_wav_is_one_header_then_the_pipelines_pcm(server, studio, refs, mode, flags) -> None:
    text = "Hi there. How are you?"
    with httpx.stream("POST", f"{server}/tts", json=tts_query(text=text, streaming_mode=mode), timeout=TIMEOUT) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
        body = b"".join(r.iter_bytes())
    with wave.open(io.BytesIO(body[:44])) as w:  # the official zero-frame header
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 32000, 0)
    pcm = np.frombuffer(body[44:], dtype="<i2")
    _, want = direct(studio, text, refs / "ref_00.wav", 7, **flags)
    assert np.array_equal(pcm, want)


def test_raw_ogg_and_aac(server) -> None:
    wav = httpx.get(f"{server}/tts", params=tts_query(), timeout=TIMEOUT).content
    _, pcm = wav_pcm(wav)
    raw = httpx.get(f"{server}/tts", params=tts_query(media_type="raw"), timeout=TIMEOUT)
    assert raw.headers["content-type"] == "audio/raw" and raw.content == pcm.astype("<i2").tobytes()
    ogg = httpx.get(f"{server}/tts", params=tts_query(media_type="ogg"), timeout=TIMEOUT)
    data, rate = sf.read(io.BytesIO(ogg.content), dtype="int16")
    assert ogg.headers["content-type"] == "audio/ogg" and rate == 32000 and abs(len(data) - len(pcm)) < 1024
    aac = httpx.get(f"{server}/tts", params=tts_query(media_type="aac"), timeout=TIMEOUT)
    assert aac.headers["content-type"] == "audio/aac" and aac.content[:2] == b"\xff\xf1"


def _bad_cases(root: Path, refs: Path) -> list[tuple[dict, int, str]]:
    v1_gpt, v1_sovits = weight_files(root, "v1")
    return [
        ({"text_lang": "xx"}, 400, "text_lang: 'xx' is not supported"),
        ({"prompt_lang": "klingon"}, 400, "prompt_lang: 'klingon' is not supported"),
        ({"text": ""}, 400, "text is required"),
        ({"text": "a" * 10_001}, 400, "text: 10001 characters"),
        ({"prompt_text": "a" * 10_001}, 400, "prompt_text: 10001 characters"),
        ({"top_k": 0}, 400, "top_k must be an integer"),
        ({"top_k": "many"}, 400, "top_k: Input should be a valid integer"),
        ({"top_p": 1.5}, 400, "top_p must be a number"),
        ({"temperature": -1}, 400, "temperature must be a number"),
        ({"speed_factor": 0}, 400, "speed_factor must be a number"),
        ({"seed": -2}, 400, "seed must be -1"),
        ({"batch_size": 0}, 400, "batch_size must be an integer"),
        ({"media_type": "mp4"}, 400, "media_type: 'mp4' is not supported"),
        ({"streaming_mode": 7}, 400, "streaming_mode: 7 is not valid"),
        ({"text_split_method": "cut9"}, 400, "text_split_method 'cut9' is unknown"),
        ({"ref_audio_path": None}, 400, "ref_audio_path: a reference clip is required"),
        ({"ref_audio_path": "../secret.wav"}, 400, "ref_audio_path: '../secret.wav' is not a file in the server's"),
        ({"ref_audio_path": str(refs.parent / "secret.wav")}, 400, "is not a file in the server's reference folders"),
        ({"ref_audio_path": "missing.wav"}, 400, "ref_audio_path: 'missing.wav' is not a file in the server's"),
        ({"ref_audio_path": "junk.wav"}, 400, "ref_audio_path: the clip cannot be decoded as audio"),
        ({"ref_audio_path": "short.wav"}, 400, "ref_audio_path: reference audio is 1.00 s long (too short)"),
        ({"aux_ref_audio_paths": ["../secret.wav"]}, 400, "aux_ref_audio_paths[0]: '../secret.wav' is not a file"),
        ({"gpt_weights_path": "/etc/passwd"}, 400, "gpt_weights_path: '/etc/passwd' is not a weight file"),
        ({"gpt_weights_path": str(root / "GPT_SoVITS/../../x.ckpt")}, 400, "gpt_weights_path"),
        ({"sovits_weights_path": str(root / "GPT_SoVITS/pretrained_models/nope.pth")}, 400,
         "sovits_weights_path"),
        ({"sovits_weights_path": str(root / "GPT_SoVITS/pretrained_models/broken.pth")}, 400,
         "the weight file cannot be loaded"),
        ({"text_lang": "ko", "gpt_weights_path": str(v1_gpt), "sovits_weights_path": str(v1_sovits)}, 400,
         "text_lang: language 'ko' is not supported by v1 models"),
    ]


def test_bad_requests_get_4xx_naming_the_field_and_the_server_keeps_serving(server, tree, refs) -> None:
    root, _ = tree
    with httpx.Client(base_url=server, timeout=TIMEOUT) as c:
        for change, status, message in _bad_cases(root, refs):
            r = c.post("/tts", json=tts_query(**change))
            assert (r.status_code, message in r.json()["message"]) == (status, True), (change, r.text)
            assert r.status_code < 500
        assert c.post("/tts", content=b"{not json", headers={"content-type": "application/json"}).status_code == 400
        assert "JSON object" in c.post("/tts", json=[1, 2]).json()["message"]
        big = {"ref_audio": ("big.wav", b"\0" * (2 << 20), "audio/wav")}
        too_large = c.post("/tts", data={"text": "hi"}, files=big)
        assert too_large.status_code == 413 and "limit" in too_large.json()["message"]
        get_bad = c.get("/tts", params=tts_query(top_k="x"))
        assert get_bad.status_code == 400 and get_bad.json()["message"].startswith("top_k")
        # nothing is left running or queued, and a good request still works
        assert c.get("/health").json()["running"] == 0 and c.get("/health").json()["queued"] == 0
        assert c.get("/tts", params=tts_query()).status_code == 200


def test_16_concurrent_requests_match_the_same_requests_one_at_a_time(server) -> None:
    requests = [tts_query(ref=f"ref_{i:02d}.wav", seed=100 + i, text="Hi there." if i % 2 else "Good day.")
                for i in range(16)]

    def call(q: dict) -> bytes:
        r = httpx.post(f"{server}/tts", json=q, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        return r.content

    with ThreadPoolExecutor(max_workers=16) as pool:  # cold references: prepared concurrently too
        together = list(pool.map(call, requests))
    alone = [call(q) for q in requests]
    assert together == alone
    assert len({wav_pcm(b)[1].tobytes() for b in alone}) == 16  # 16 different voices: a swap would show


@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_through_per_request_weights(server, tree, version) -> None:
    root, _ = tree
    gpt, sovits = weight_files(root, version)
    q = tts_query(gpt_weights_path=str(gpt), sovits_weights_path=str(sovits), sample_steps=2)
    r = httpx.post(f"{server}/tts", json=q, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    rate, pcm = wav_pcm(r.content)
    assert rate == OUTPUT_RATES[version] and len(pcm) > 0 and np.abs(pcm).max() > 0


def test_set_weights_changes_the_defaults_only(server, studio, tree, refs) -> None:
    root, _ = tree
    v1_gpt, v1_sovits = weight_files(root, "v1")
    v2_gpt, v2_sovits = weight_files(root, "v2")
    with httpx.Client(base_url=server, timeout=TIMEOUT) as c:
        assert c.get("/set_gpt_weights").json()["message"] == "gpt weight path is required"
        outside = c.get("/set_gpt_weights", params={"weights_path": "/etc/passwd"})
        assert outside.status_code == 400 and outside.json()["message"] == "change gpt weight failed"
        assert "is not a weight file in the server's weight folders" in outside.json()["Exception"]
        broken = c.get("/set_sovits_weights", params={"weights_path": str(root / "GPT_SoVITS/pretrained_models/broken.pth")})
        assert broken.status_code == 400 and broken.json()["message"] == "change sovits weight failed"
        before = c.get("/tts", params=tts_query()).content
        try:
            assert c.get("/set_gpt_weights", params={"weights_path": str(v1_gpt)}).json() == {"message": "success"}
            assert c.get("/set_sovits_weights", params={"weights_path": str(v1_sovits)}).json() == {"message": "success"}
            after = c.get("/tts", params=tts_query()).content
            # a request naming its own weights is not affected by the new defaults
            named = c.get("/tts", params=tts_query(gpt_weights_path=str(v2_gpt), sovits_weights_path=str(v2_sovits)))
        finally:
            c.get("/set_gpt_weights", params={"weights_path": str(v2_gpt)})
            c.get("/set_sovits_weights", params={"weights_path": str(v2_sovits)})
    assert named.content == before
    assert np.array_equal(wav_pcm(after)[1], direct(studio, "Hi there.", refs / "ref_00.wav", 7, v1_gpt, v1_sovits)[1])
    assert after != before


def test_control_needs_the_serve_command_and_a_key_or_allow_control(server, studio) -> None:
    from studio.http.app import create_app
    from studio.http.auth import Access
    from studio.http.context import ServerSettings

    with httpx.Client(base_url=server) as c:
        assert c.get("/control").json()["message"] == "command is required"
        assert c.get("/control", params={"command": "reboot"}).status_code == 400
        assert c.get("/control", params={"command": "exit"}).status_code == 403  # embedded: no process control
    calls: list[str] = []
    with running_server(create_app(studio, on_control=calls.append)) as url:  # no key: control is off
        off = httpx.get(f"{url}/control", params={"command": "exit"})
        assert off.status_code == 403 and "--allow-control" in off.json()["message"]
    with running_server(create_app(studio, ServerSettings(allow_control=True), on_control=calls.append)) as url:
        assert httpx.get(f"{url}/control", params={"command": "restart"}).status_code == 200
        assert httpx.post(f"{url}/control", json={"command": "exit"}).status_code == 200
    key = "k" * 24
    keyed = ServerSettings(access=Access(api_keys=(key,)))
    with running_server(create_app(studio, keyed, on_control=calls.append)) as url:  # a key turns it on, and guards it
        assert httpx.get(f"{url}/control", params={"command": "exit"}).status_code == 401
        assert httpx.get(f"{url}/control", params={"command": "exit"},
                         headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert calls == ["restart", "exit", "exit"]


def test_set_refer_audio_checks_the_clip(server) -> None:
    with httpx.Client(base_url=server, timeout=TIMEOUT) as c:
        assert c.get("/set_refer_audio", params={"refer_audio_path": "ref_01.wav"}).json() == {"message": "success"}
        bad = c.get("/set_refer_audio", params={"refer_audio_path": "short.wav"})
        assert bad.status_code == 400 and "too short" in bad.json()["Exception"]


def test_a_client_leaving_a_stream_frees_the_worker(server) -> None:
    q = tts_query(text="One. Two. Three. Four. Five. Six.", streaming_mode=2, seed=3)
    with httpx.stream("POST", f"{server}/tts", json=q, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        next(r.iter_raw())  # the header, then leave
    with httpx.Client(base_url=server, timeout=TIMEOUT) as c:
        deadline = time.monotonic() + 60
        while (health := c.get("/health").json())["running"] and time.monotonic() < deadline:
            time.sleep(0.1)  # the producer notices at its next result, closes the pipeline and returns
        assert (health["running"], health["queued"]) == (0, 0)
        assert c.get("/tts", params=tts_query()).status_code == 200


# ---- OpenAI ---------------------------------------------------------------------------------


def test_openai_speech_with_a_saved_voice(server, studio, refs) -> None:
    with httpx.Client(base_url=server, timeout=TIMEOUT) as c:
        clip = (refs / "ref_03.wav").read_bytes()
        form = {"name": "alice", "prompt_text": "Hello.", "prompt_lang": "en"}
        made = c.post("/v1/voices", data=form, files={"audio": ("alice.wav", clip, "audio/wav")})
        assert made.status_code == 201, made.text
        assert c.post("/v1/voices", data=form, files={"audio": ("a.wav", clip)}).status_code == 409
        assert [v["name"] for v in c.get("/v1/voices").json()["voices"]] == ["alice"]
        body = {"model": "tts-1", "input": "Hi there.", "voice": "alice", "response_format": "wav", "language": "en",
                "seed": 5}
        r = c.post("/v1/audio/speech", json=body)
        assert r.status_code == 200 and r.headers["content-type"] == "audio/wav", r.text
        _, want = direct(studio, "Hi there.", refs / "ref_03.wav", 5)
        assert np.array_equal(wav_pcm(r.content)[1], want)
        pcm = c.post("/v1/audio/speech", json={**body, "response_format": "pcm"})
        assert pcm.headers["x-sample-rate"] == "24000"
        assert abs(len(pcm.content) // 2 - len(want) * 24000 // 32000) <= 1  # OpenAI's pcm is 24 kHz
        mp3 = c.post("/v1/audio/speech", json={**body, "response_format": "mp3", "voice": {"id": "alice"}})
        assert mp3.headers["content-type"] == "audio/mpeg" and sf.read(io.BytesIO(mp3.content))[1] == 32000
        missing = c.post("/v1/audio/speech", json={**body, "voice": "bob"})
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "voice"
        for change, param in (({"speed": 9}, "speed"), ({"response_format": "ogg"}, "response_format"),
                              ({"voice": "../alice"}, "voice"), ({"input": ""}, "input"),
                              ({"input": "x" * 5000}, "input"), ({"language": "xx"}, "language")):
            bad = c.post("/v1/audio/speech", json={**body, **change})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == param, (change, bad.text)
        assert c.delete("/v1/voices/alice").status_code == 200
        assert c.delete("/v1/voices/alice").status_code == 404


# ---- metrics --------------------------------------------------------------------------------


def test_metrics_report_latency_queue_caches_and_memory(server) -> None:
    with httpx.Client(base_url=server, timeout=TIMEOUT) as c:
        for _ in range(2):  # the second finds the first's prepared reference, whatever ran before this test
            assert c.get("/tts", params=tts_query()).status_code == 200
        text = c.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in text.text.splitlines() if line and not line.startswith("#")}
    assert samples['sovits_request_duration_seconds_count{endpoint="/tts"}'] >= 1
    assert samples['sovits_first_chunk_seconds_count{endpoint="/tts"}'] >= 1
    assert samples['sovits_requests_total{endpoint="/tts",status="200"}'] >= 1
    assert samples['sovits_cache_hits_total{cache="reference"}'] >= 1
    assert samples["sovits_queue_length"] == 0 and samples["sovits_requests_in_progress"] == 0
    assert samples['sovits_host_memory_bytes{kind="rss"}'] > 0
    assert samples["sovits_audio_seconds_total"] > 0
    # the engine's own work: the request's decode steps, its first chunk and the time they took
    assert samples['sovits_engine_work_total{kind="decode_steps"}'] >= 1
    assert samples['sovits_engine_work_total{kind="tokens"}'] >= samples['sovits_engine_work_total{kind="decode_steps"}']
    assert samples['sovits_engine_work_total{kind="first_chunks"}'] >= 1
    assert samples['sovits_engine_busy_seconds_total{stage="decode"}'] > 0
    assert samples['sovits_engine_busy_seconds_total{stage="first_chunk_tokens"}'] > 0
    assert samples['sovits_engine_occupancy_seconds_total{place="decoding"}'] > 0  # rows decoded a while
    assert samples['sovits_engine_occupancy_seconds_total{place="admitted"}'] > 0
    assert samples['sovits_engine_occupancy_seconds_total{place="reference"}'] > 0  # before the scheduler
    assert samples['sovits_engine_occupancy_seconds_total{place="first_sentence"}'] > 0
    setup = samples['sovits_engine_busy_seconds_total{stage="prefill_setup"}']
    assert 0 < setup <= samples['sovits_engine_busy_seconds_total{stage="prefill"}']  # a part of the prefills' time
    assert json.loads(httpx.get(f"{server}/health").text)["status"] == "ready"
