"""The server under the failures of issue 20, through a real uvicorn server on loopback (tiny v2 weights, CPU):

* the server's warm-up captures every decode-step graph before ``/health`` says ready, and concurrent
  requests afterwards capture none (``sovits_graph_captures_total``; a fake graph decoder gives the CPU
  CUDA-graph behaviour);
* a decode step that fails answers the request in it with a 503 + Retry-After, ``/metrics`` counts the
  rebuild, and the next request is answered 200;
* admission is sized from the engine's slots once it has them (not a fixed 33).
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import engine.serving.scheduler as scheduler_module
from engine.options import EngineSettings
from engine.studio import Studio
from engine.readiness import Readiness
from engine.warmup import WarmupSettings, warm_up_in_background
from tests.serving.test_recovery import FakeGraphDecoder, _fail_once, hold_rebuild
from tests.support.server import reference_wav, running_server
from tests.support.synth import studio as shared_studio

FORM = {"text": "Hello there. How are you?", "text_lang": "en", "prompt_text": "Hello.", "prompt_lang": "en",
        "media_type": "wav", "seed": "1", "text_split_method": "cut5"}


def _metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    assert match, f"{name}{labels} not in /metrics"
    return float(match.group(1))


@pytest.fixture
def served(monkeypatch):
    from studio.http.app import create_app
    from studio.http.context import ServerSettings
    from studio.http.limits import ServerLimits

    FakeGraphDecoder.log = []
    monkeypatch.setattr(scheduler_module, "SlotDecoder", FakeGraphDecoder)
    shared = shared_studio("v2")
    studio = Studio(shared.default_weights, shared.runtime, EngineSettings(scheduler_slots=8), pool=shared.pool)
    FakeGraphDecoder.gate = studio.gate
    app = create_app(studio, ServerSettings(limits=ServerLimits(max_tokens_per_sentence=12)))
    studio.readiness = Readiness()
    warm_up_in_background(studio, studio.readiness, settings=WarmupSettings(languages=("en",), max_tokens=6),
                          submit=app.state.context.runner.submit)
    try:
        with running_server(app) as url:
            yield studio, url
    finally:
        studio.close()


def _tts(client: httpx.Client, url: str, seed: int, **extra) -> httpx.Response:
    return client.post(f"{url}/tts", data={**FORM, "seed": str(seed), **extra},
                       files={"ref_audio": ("ref.wav", reference_wav(3), "audio/wav")})


def test_the_server_captures_graphs_before_ready_and_none_while_serving(served) -> None:
    studio, url = served
    with httpx.Client(timeout=120) as client:
        deadline = time.monotonic() + 120
        while client.get(f"{url}/health").json()["status"] != "ready":
            assert time.monotonic() < deadline, "the warm-up did not end"
            time.sleep(0.05)
        before = len(FakeGraphDecoder.log)
        assert sorted(b for b, *_ in FakeGraphDecoder.log) == [1, 2, 4, 8]  # every bucket, before ready
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: _tts(client, url, 20 + i, streaming_mode="2" if i % 2 else "0"),
                                    range(8)))
        assert [a.status_code for a in answers] == [200] * 8
        metrics = client.get(f"{url}/metrics").text
        assert _metric(metrics, "sovits_graph_captures_total", '{phase="warmup"}') == 4
        assert _metric(metrics, "sovits_graph_captures_total", '{phase="serving"}') == 0
        assert len(FakeGraphDecoder.log) == before
        health = client.get(f"{url}/health").json()
        assert health["status"] == "ready"
        assert health["capacity"] == 1 + studio.capacity() and studio.capacity() == 8 + 64  # from the slots


def test_a_failed_step_is_a_503_and_the_server_serves_on(served) -> None:
    studio, url = served
    with httpx.Client(timeout=120) as client:
        assert studio.readiness.wait(120)
        sched = studio.scheduler(studio.cloner().models)
        _fail_once(sched.decoder, at_call=2)
        failed = _tts(client, url, 5)
        assert failed.status_code == 503 and "retry-after" in failed.headers
        assert "send the request again" in failed.json()["message"]
        ok = _tts(client, url, 5)
        assert ok.status_code == 200 and len(ok.content) > 1000
        metrics = client.get(f"{url}/metrics").text
        assert _metric(metrics, "sovits_scheduler_rebuilds_total") == 1
        assert client.get(f"{url}/health").json()["status"] == "ready"


def test_health_reports_degraded_while_rebuilding(served) -> None:
    studio, url = served
    with httpx.Client(timeout=120) as client:
        assert studio.readiness.wait(120)
        sched = studio.scheduler(studio.cloner().models)
        _fail_once(sched.decoder, at_call=2)
        release, building = hold_rebuild(sched)
        with ThreadPoolExecutor(1) as pool:
            failing = pool.submit(_tts, client, url, 9)
            assert building.wait(60)
            health = client.get(f"{url}/health")
            assert health.status_code == 200 and health.json()["status"] == "degraded"
            release.set()
            assert failing.result().status_code == 503
        deadline = time.monotonic() + 30
        while client.get(f"{url}/health").json()["status"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.02)
