"""The web UI served as `sovits-studio webui` serves it (page + HTTP API on one uvicorn port), driven
through gradio_client: synthesis, readable errors for bad input, concurrent tabs with different models,
login, and a page that opens when weights are missing."""

from __future__ import annotations

import base64
import json
import io
import threading
import time
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.support.paths import REPO
from tests.support.server import free_port
from tests.support.synth import model_config

pytest.importorskip("gradio_client")

from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

REF = REPO / "assets" / "en_slt_01.wav"
REF_TEXT = "A good reference clip should be clear and calm, with no music or noise in the background."
MAX_TOKENS = 8
UPLOAD_LIMIT = 1 << 20


@contextmanager
def running_server(app):
    """Serve ``app`` on 127.0.0.1:<free port> in a thread; yields the base URL. Open page connections
    (gradio_client's heartbeat stream) get one second at shutdown instead of holding it up."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, name="webui-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the web UI test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _weights(version: str):
    from engine.testweights import LAYOUT

    base = model_config(version).parent / "GPT_SoVITS" / "pretrained_models"
    return str(base / LAYOUT[version]["gpt"]), str(base / LAYOUT[version]["sovits"])


def _app(config_path, auth=None, workers=1, max_queue=32):
    from engine.config import load_config
    from engine.studio import Studio
    from studio.http.context import ServerSettings
    from studio.http.limits import ServerLimits
    from webui.app import UISettings
    from webui.models_list import ModelCatalog
    from webui.server import create_webui_app

    config = load_config(config_path, base_dir=config_path.parent)
    studio = Studio.from_config(config, device="cpu", precision="fp32")
    catalog = ModelCatalog(config_path.parent, extra_dirs=(model_config("v1").parent / "GPT_SoVITS" / "pretrained_models",))
    return create_webui_app(studio, config, UISettings(max_tokens_per_sentence=MAX_TOKENS),
                            ServerSettings(limits=ServerLimits(max_upload_bytes=UPLOAD_LIMIT, max_queue=max_queue,
                                                               max_tokens_per_sentence=MAX_TOKENS, workers=workers)),
                            auth=auth, catalog=catalog), studio


@pytest.fixture(scope="module")
def server():
    app, studio = _app(model_config("v2"))
    with running_server(app) as url:
        yield url, studio


def _request(client: Client, ref=REF, text="Hello there.", **extra):
    args = dict(ref_audio=handle_file(str(ref)), ref_text=REF_TEXT, ref_lang="en", aux_audio=[], text=text,
                text_lang="en", seed=7, api_name="/generate")
    return client.submit(**{**args, **extra})


def _final_clip(url: str, job) -> tuple[int, np.ndarray, str]:
    stream, full, status = job.result()
    assert stream["is_stream"]  # the streamed playlist, fed chunk by chunk
    data = httpx.get(full["url"], timeout=30).content
    audio, rate = sf.read(io.BytesIO(data), dtype="int16")
    return rate, audio, status


def test_generate_streams_then_offers_the_whole_clip(server) -> None:
    url, _ = server
    client = Client(url + "/", verbose=False, download_files=False)
    job = _request(client, text="Hello there. Nice to meet you!", text_split_method="cut5")
    rate, audio, status = _final_clip(url, job)
    updates = job.outputs()
    assert len(updates) >= 3  # two streamed sentences, then the full clip
    assert rate == 32000 and "Seed **7**" in status
    assert 2 * 0.3 <= audio.shape[0] / rate <= 2 * (MAX_TOKENS * 0.04 + 0.3) + 1e-3
    first = next(u[0] for u in updates if u[0] and u[0].get("url"))  # (the first update clears the last run)
    playlist = httpx.get(first["url"], timeout=30).text
    assert playlist.startswith("#EXTM3U") and ".aac" in playlist


def test_bad_input_is_a_readable_message_and_the_next_request_works(server, tmp_path) -> None:
    url, _ = server
    client = Client(url + "/", verbose=False, download_files=False)
    silent = tmp_path / "silent.wav"
    sf.write(silent, np.zeros(4 * 16000, np.float32), 16000)
    not_audio = tmp_path / "clip.wav"
    not_audio.write_text("this is not audio")
    notes = tmp_path / "notes.txt"
    notes.write_text("a text file among the extra clips")
    long = tmp_path / "long.wav"
    sf.write(long, 0.3 * np.sin(np.arange(12 * 16000) / 8.0).astype(np.float32), 16000)
    gpt, sovits = _weights("v2")
    cases = [
        (dict(text="  "), "text is empty"),
        (dict(ref=silent), "silent"),
        (dict(ref=not_audio), "“clip.wav” is not an audio file"),
        (dict(ref=long), "12.00 s long; a reference must be 3–10 s"),
        (dict(ref=silent, ui_language="zh-CN"), "这段音频是静音"),
        (dict(aux_audio=[handle_file(str(notes))]), "“notes.txt” is not an audio file"),  # not dropped silently
        (dict(gpt_weights=sovits), "GPT"),
        (dict(sovits_weights=gpt), "SoVITS"),
        (dict(top_p=0.0), "minimum value"),  # the slider refuses it before the engine
    ]
    for extra, expected in cases:
        with pytest.raises(AppError) as err:
            _request(client, **extra).result()
        message = str(err.value)
        assert expected in message and "Traceback" not in message and "object at 0x" not in message, extra
        assert str(tmp_path) not in message and "ReferenceRules" not in message and "dBFS" not in message, extra
    rate, audio, _ = _final_clip(url, _request(client))
    assert rate == 32000 and audio.shape[0] > 0


def test_uploads_over_the_limit_are_refused_with_a_message(server) -> None:
    url, _ = server
    big = io.BytesIO()
    sf.write(big, np.zeros(UPLOAD_LIMIT // 2 + 50_000, np.float32), 16000, format="WAV", subtype="PCM_16")
    answer = httpx.post(f"{url}/gradio_api/upload", files={"files": ("big.wav", big.getvalue(), "audio/wav")})
    assert answer.status_code == 413 and "the limit is 1048576 (max_upload_bytes)" in answer.text  # one limit, no slack


def test_two_tabs_with_different_models_each_get_their_own_voice(server) -> None:
    from engine.options import SynthesisOptions
    from webui import handlers

    url, studio = server
    gpt1, sovits1 = _weights("v1")
    jobs: dict[str, object] = {}

    def tab(name: str, **weights) -> None:
        client = Client(url + "/", verbose=False, download_files=False)
        jobs[name] = _final_clip(url, _request(client, text="Good morning.", **weights))[1]

    threads = [threading.Thread(target=tab, args=("v1",), kwargs=dict(gpt_weights=gpt1, sovits_weights=sovits1)),
               threading.Thread(target=tab, args=("v2",))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    reference = handlers.make_reference(str(REF), REF_TEXT, "en", None)
    for name, weights in (("v1", (gpt1, sovits1)), ("v2", (None, None))):
        alone = list(handlers.synthesize(studio, "Good morning.", "en", reference, SynthesisOptions(seed=7),
                                         *weights, max_tokens=MAX_TOKENS))[-1].pcm16
        np.testing.assert_array_equal(jobs[name], alone)
    assert not np.array_equal(jobs["v1"][: len(jobs["v2"])], jobs["v2"][: len(jobs["v1"])])


def test_long_texts_report_progress_per_sentence(server, monkeypatch) -> None:
    url, studio = server
    synthesize = studio.synthesize

    def slowly(*args, **kwargs):  # each sentence takes a noticeable time, so the progress updates are seen
        for result in synthesize(*args, **kwargs):
            time.sleep(0.4)
            yield result

    monkeypatch.setattr(studio, "synthesize", slowly)
    client = Client(url + "/", verbose=False, download_files=False)
    job = _request(client, text="Good morning, everyone. See you later, my friends.",
                   text_split_method="cut5", batch_size=1)
    seen = set()
    while not job.done():
        for unit in job.status().progress_data or []:
            seen.add((unit.index, unit.length, unit.unit))
        time.sleep(0.05)
    job.result()
    # "k/n sentences" while it runs (updates may coalesce, so not necessarily every k)
    assert any(unit == "sentences" and n >= 2 and 1 <= k < n for k, n, unit in seen), seen


def test_page_and_api_share_one_pool_of_synthesis_workers() -> None:
    app, _ = _app(model_config("v2"), workers=1, max_queue=0)
    busy = threading.Event()
    with running_server(app) as url:
        app.state.context.runner.submit(busy.wait, 60)  # an API request holds the only worker
        client = Client(url + "/", verbose=False, download_files=False)
        try:
            with pytest.raises(AppError, match="busy"):
                _request(client).result()
        finally:
            busy.set()
        time.sleep(0.2)
        rate, audio, _ = _final_clip(url, _request(client))
        assert rate == 32000 and audio.shape[0] > 0


def test_the_http_api_shares_the_port(server) -> None:
    url, _ = server
    assert httpx.get(f"{url}/health").json()["status"] == "ready"
    assert "sovits_requests_total" in httpx.get(f"{url}/metrics").text
    page = httpx.get(f"{url}/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    answer = httpx.get(f"{url}/tts", params={"text": "", "text_lang": "en"})
    assert answer.status_code == 400 and "message" in answer.json()


def test_login_protects_the_page_and_the_api() -> None:
    app, _ = _app(model_config("v2"), auth=[("ann", "s3cret")])
    with running_server(app) as url:
        assert httpx.get(f"{url}/health").status_code == 401
        token = base64.b64encode(b"ann:s3cret").decode()
        assert httpx.get(f"{url}/health", headers={"Authorization": f"Basic {token}"}).status_code == 200
        wrong = base64.b64encode(b"ann:nope").decode()
        assert httpx.get(f"{url}/health", headers={"Authorization": f"Basic {wrong}"}).status_code == 401
        assert httpx.get(f"{url}/config").status_code == 401  # the page's config needs the login
        assert httpx.post(f"{url}/login", data={"username": "ann", "password": "s3cret"}).status_code == 200
        Client(url + "/", verbose=False, auth=("ann", "s3cret"))  # the page itself accepts the login


def test_the_page_opens_when_weights_are_missing(tmp_path) -> None:
    config = tmp_path / "tts_infer.yaml"
    config.write_text((REPO / "configs" / "tts_infer.yaml").read_text().replace("device: cuda", "device: cpu")
                      .replace("is_half: true", "is_half: false"))
    app, _ = _app(config)
    with running_server(app) as url:
        page = httpx.get(f"{url}/config").json()
        text = " ".join(str(c["props"].get("value") or "") for c in page["components"] if c["type"] == "markdown")
        assert "Weights are missing" in text and "s2G2333k.pth" in text
        assert str(tmp_path) not in json.dumps(page) and str(tmp_path.resolve()) not in json.dumps(page)  # no path
        client = Client(url + "/", verbose=False, download_files=False)
        with pytest.raises(AppError, match="does not exist"):
            _request(client).result()


def test_the_readme_main_command_brings_the_page_up(tmp_path) -> None:
    """`sovits-studio webui` from the repository root: the shipped config (the device picked here, official
    weights, not here) still gives a page that says what is missing and which device runs; Ctrl+C stops it."""
    import os
    import signal
    import subprocess
    import sys

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRADIO_TEMP_DIR": str(tmp_path / "gradio")}

    def default_sigint() -> None:  # in the child: a background job starts its children with SIGINT ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, "-m", "studio.cli", "webui", "--port", str(port),
                             "--profiles-dir", str(tmp_path / "voices")], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not any("is running: http://127.0.0.1:" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            lines.append(proc.stdout.readline())
        assert f"http://127.0.0.1:{port}/" in lines[-1]
        page = httpx.get(f"http://127.0.0.1:{port}/config", timeout=30).json()
        text = " ".join(str(c["props"].get("value") or "") for c in page["components"] if c["type"] == "markdown")
        assert "Weights are missing" in text and "s2G2333k.pth" in text
        import torch

        if not torch.cuda.is_available():  # the shipped config picks the device: the page says which, no cuda
            assert "lacks" not in text and "`cpu`" in text
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()["status"] in ("starting", "ready")
    finally:
        proc.send_signal(signal.SIGINT)  # what Ctrl+C sends
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.terminate()  # leave no server behind; the assertion below reports the failure
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, "".join(lines) + proc.stdout.read()


def test_the_api_names_a_text_language_that_reads_almost_nothing(server) -> None:
    url, _ = server
    form = {"text_lang": "en", "prompt_text": REF_TEXT, "prompt_lang": "en", "seed": "7"}
    with open(REF, "rb") as clip:
        chinese = httpx.post(f"{url}/tts", data={**form, "text": "你好，欢迎使用语音合成系统。"},
                             files={"ref_audio": ("ref.wav", clip.read(), "audio/wav")}, timeout=300)
    assert chinese.status_code == 200, chinese.text
    warning = chinese.headers["X-Text-Language-Warning"]
    assert "text_lang=en" in warning and "all_zh" in warning  # synthesis still ran: a warning, not a refusal
    with open(REF, "rb") as clip:
        english = httpx.post(f"{url}/tts", data={**form, "text": "Hello there."},
                             files={"ref_audio": ("ref.wav", clip.read(), "audio/wav")}, timeout=300)
    assert english.status_code == 200 and "X-Text-Language-Warning" not in english.headers
