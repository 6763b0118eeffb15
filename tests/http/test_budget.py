"""One request never freezes the server (issue 21), on tiny real v2 weights: hostile texts and paths are
answered within seconds with a 400 naming the field, and ``/health`` keeps answering within 100 ms while
they are being refused or read."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.server import reference_wav, running_server

MAX_TOKENS = 4
PROMPT = {"prompt_text": "A calm reference clip for the test.", "prompt_lang": "en"}
HEALTH_MS = 100
NUMBERS = {"en": "7" * 37, "zh": "我有" + "7" * 37 + "个", "ja": "私は" + "7" * 37 + "です", "yue": "我有" + "7" * 37 + "個",
           "ko": "나는 " + "7" * 17 + "개", "auto": "7" * 17}
MIXED = ("Hello world 12 apples. 你好世界，今天是2024年。こんにちは、元気ですか。안녕하세요 반갑습니다. " * 200)[:10_000]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from engine.config import load_config
    from engine.studio import Studio
    from engine.testweights import LAYOUT, PRETRAINED, make_test_weights
    from studio.http.app import create_app
    from studio.http.context import ServerSettings
    from studio.http.limits import ServerLimits

    root = tmp_path_factory.mktemp("weights")
    make_test_weights(root, "v2")
    base = root / PRETRAINED
    import yaml

    section = {"device": "cpu", "is_half": False, "version": "v2",
               "t2s_weights_path": str(base / LAYOUT["v2"]["gpt"]),
               "vits_weights_path": str(base / LAYOUT["v2"]["sovits"]),
               "bert_base_path": str(base / "chinese-roberta-wwm-ext-large"),
               "cnhuhbert_base_path": str(base / "chinese-hubert-base")}
    (root / "tts_infer.yaml").write_text(yaml.safe_dump({"custom": section}), encoding="utf-8")
    refs = tmp_path_factory.mktemp("refs")
    (refs / "ref.wav").write_bytes(reference_wav(0))
    (refs / "loop.wav").symlink_to(refs / "loop.wav")
    studio = Studio.from_config(load_config(root / "tts_infer.yaml", base_dir=root))
    limits = ServerLimits(workers=2, max_tokens_per_sentence=MAX_TOKENS)
    settings = ServerSettings(reference_roots=(str(refs),), weight_roots=(str(root),), limits=limits)
    with running_server(create_app(studio, settings)) as url:
        yield url, refs


class HealthWatch:
    """Polls /health on its own connection while a block runs; ``worst_ms`` is the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url, self.times, self._stop = url, [], threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with httpx.Client(timeout=10) as client:
            client.get(f"{self.url}/health")  # the connection is open before the clock starts
            while not self._stop.is_set():
                start = time.perf_counter()
                assert client.get(f"{self.url}/health").status_code == 200
                self.times.append((time.perf_counter() - start) * 1000)
                time.sleep(0.02)

    def __enter__(self) -> "HealthWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def worst_ms(self) -> float:
        return max(self.times)


def tts(url: str, timeout: float = 30, **fields) -> httpx.Response:
    body = {"text": "Hi there.", "text_lang": "en", "ref_audio_path": "ref.wav", **PROMPT,
            "text_split_method": "cut5", "media_type": "wav", **fields}
    return httpx.post(f"{url}/tts", content=json.dumps(body), timeout=timeout,  # ASCII: a surrogate travels as \ud800
                      headers={"content-type": "application/json"})


def _refused(answer: httpx.Response, field: str, *words: str) -> None:
    message = answer.json()["message"]
    assert answer.status_code == 400, (answer.status_code, message)
    assert message.startswith(field), message
    assert all(w in message for w in words), message


@pytest.mark.parametrize("language", sorted(NUMBERS))
def test_numbers_too_long_to_read_are_a_400_naming_them(server, language) -> None:
    url, _ = server
    start = time.perf_counter()
    _refused(tts(url, text=NUMBERS[language], text_lang=language), "text", "the number 777777777777...", "digits")
    assert time.perf_counter() - start < 5


def test_five_thousand_digits_are_refused_at_once_while_health_answers(server) -> None:
    url, _ = server
    with HealthWatch(url) as watch:
        for _ in range(3):
            start = time.perf_counter()
            _refused(tts(url, text="1" * 5000), "text", "5000 digits")
            assert time.perf_counter() - start < 5
    assert watch.worst_ms < HEALTH_MS, watch.times


@pytest.mark.parametrize("language", ["en", "zh", "ja", "ko", "yue", "auto"])
def test_a_lone_surrogate_is_a_400_naming_the_field(server, language) -> None:
    url, _ = server
    raw = ('{"text": "Hello \\ud800 world", "text_lang": "%s", "ref_audio_path": "ref.wav", '
           '"prompt_text": "A calm clip.", "prompt_lang": "en"}' % language)
    answer = httpx.post(f"{url}/tts", content=raw, headers={"content-type": "application/json"}, timeout=30)
    _refused(answer, "text", "lone surrogate")
    raw = raw.replace("Hello \\ud800 world", "Hi there.").replace("A calm clip.", "A \\udfff clip.")
    _refused(httpx.post(f"{url}/tts", content=raw, headers={"content-type": "application/json"}, timeout=30),
             "prompt_text", "lone surrogate")


def test_ten_thousand_characters_of_mixed_scripts_start_within_seconds(server) -> None:
    url, _ = server
    # the models' and each language's dictionaries' first use (loading) is not the text's time
    assert tts(url, timeout=600, text=MIXED[:120], text_lang="auto").status_code == 200
    with HealthWatch(url) as watch:
        start = time.perf_counter()
        with httpx.stream("POST", f"{url}/tts", timeout=30, json={
                "text": MIXED, "text_lang": "auto", "ref_audio_path": "ref.wav", **PROMPT, "text_split_method": "cut5",
                "media_type": "wav", "streaming_mode": True}) as answer:
            assert answer.status_code == 200
            next(answer.iter_bytes())
            assert time.perf_counter() - start < 5
    assert watch.worst_ms < HEALTH_MS, watch.times


def test_long_paths_are_refused_before_the_file_system_while_health_answers(server) -> None:
    url, _ = server
    with HealthWatch(url) as watch:
        for field, value in (("ref_audio_path", "a/" * 80_000), ("gpt_weights_path", "b/" * 20_000),
                             ("aux_ref_audio_paths", ["a/" * 3000])):
            start = time.perf_counter()
            answer = tts(url, **{field: value})
            name = field if field != "aux_ref_audio_paths" else "aux_ref_audio_paths[0]"
            assert answer.status_code == 400 and answer.json()["message"].startswith(name), answer.text
            assert time.perf_counter() - start < 5
    assert watch.worst_ms < HEALTH_MS, watch.times


def test_symlink_loops_and_names_the_file_system_refuses_are_400s_naming_the_field(server) -> None:
    url, refs = server
    for value in ("loop.wav", str(refs / "loop.wav"), "x" * 300 + ".wav", "bad\ud800.wav"):
        _refused(tts(url, ref_audio_path=value), "ref_audio_path", "not a file")
        _refused(tts(url, aux_ref_audio_paths=["ref.wav", value]), "aux_ref_audio_paths[1]", "not a file")
        query = {"refer_audio_path": value} if value.isascii() else None
        raw = None if query else f"{url}/set_refer_audio?refer_audio_path=bad%ED%A0%80.wav"  # the surrogate's bytes
        answer = httpx.get(raw or f"{url}/set_refer_audio", params=query, timeout=30)
        assert answer.status_code == 400 and "refer_audio_path" in answer.json()["Exception"], answer.text
        _refused(tts(url, gpt_weights_path=value), "gpt_weights_path", "not a weight file")


def test_a_normal_request_is_served_after_all_of_it(server) -> None:
    url, _ = server
    answer = tts(url, text="Hello there, 12 apples.")
    assert answer.status_code == 200 and answer.content[:4] == b"RIFF"


def test_error_messages_name_no_server_folder(server, tmp_path) -> None:
    import numpy as np
    import soundfile as sf

    url, refs = server
    sf.write(refs / "many.wav", np.zeros((16000, 12), np.float32), 16000)  # 12 channels: refused by its header
    for answer in (tts(url, ref_audio_path="many.wav"), tts(url, ref_audio_path=str(refs / "many.wav")),
                   httpx.get(f"{url}/set_refer_audio", params={"refer_audio_path": "many.wav"}, timeout=30)):
        assert answer.status_code == 400 and "12 channels" in answer.text, answer.text
        assert str(refs) not in answer.text and str(Path.cwd()) not in answer.text, answer.text
