"""One request never freezes the server (issue 21), on tiny real v2 weights: hostile texts and paths are
answered with a 400 naming the field, and ``/health`` keeps answering while they are being refused or read.

Behaviour, not timing: a gate in the studio holds a request inside the engine (on a worker thread) while
``/health`` must answer, and a stream must deliver its first audio while the rest of its text is still
to come. How fast the refusals and ``/health`` answer is measured by ``benchmarks/adversarial_http.py``."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from tests.support.server import reference_wav, running_server

MAX_TOKENS = 4
PROMPT = {"prompt_text": "A calm reference clip for the test.", "prompt_lang": "en"}
GATE_S = 120  # a gate opens by itself after this long (a broken server fails the test, it does not hang it)
NUMBERS = {"en": "7" * 37, "zh": "我有" + "7" * 37 + "个", "ja": "私は" + "7" * 37 + "です", "yue": "我有" + "7" * 37 + "個",
           "ko": "나는 " + "7" * 17 + "개", "auto": "7" * 17}
MIXED = ("Hello world 12 apples. 你好世界，今天是2024年。こんにちは、元気ですか。안녕하세요 반갑습니다. " * 200)[:10_000]


class Gate:
    """Wraps ``studio.synthesize`` (called on the server's worker threads): a request whose text is
    ``hold`` waits at the gate (``entered`` is set) until ``release``; with ``after_first``, it waits after
    its first result instead. ``outcome`` says how the held request's call ended."""

    def __init__(self, studio) -> None:
        self._synthesize = studio.synthesize
        self.hold: str | None = None
        self.after_first = False
        self.entered, self.release = threading.Event(), threading.Event()
        self.outcome: list[str] = []
        self.results_before_release = 0
        self.calls = 0  # requests that reached the engine
        studio.synthesize = self

    def arm(self, text: str, after_first: bool = False) -> None:
        self.hold, self.after_first = text, after_first
        self.entered.clear()
        self.release.clear()
        self.outcome.clear()
        self.results_before_release = 0

    def __call__(self, text, *args, **kwargs):
        self.calls += 1
        if text != self.hold:
            return self._synthesize(text, *args, **kwargs)
        if not self.after_first:
            self.entered.set()
            self.release.wait(GATE_S)
            try:
                results = self._synthesize(text, *args, **kwargs)
            except Exception as e:
                self.outcome.append(type(e).__name__)
                raise
            self.outcome.append("started")
            return results
        return self._held_after_first(self._synthesize(text, *args, **kwargs))

    def _held_after_first(self, results):
        try:
            for n, result in enumerate(results):
                if not self.release.is_set():
                    self.results_before_release = n + 1
                yield result
                if n == 0:
                    self.entered.set()
                    self.release.wait(GATE_S)
        finally:
            results.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from engine.config import load_config
    from engine.pipeline import Studio
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
    gate = Gate(studio)
    limits = ServerLimits(workers=2, max_tokens_per_sentence=MAX_TOKENS)
    settings = ServerSettings(reference_roots=(str(refs),), weight_roots=(str(root),), limits=limits)
    with running_server(create_app(studio, settings)) as url:
        yield url, refs, gate


def health_answers(url: str) -> None:
    """``/health`` answers 200 now (on a connection of its own; generous timeout: a busy machine is slow,
    a frozen server does not answer at all)."""
    answer = httpx.get(f"{url}/health", timeout=GATE_S)
    assert answer.status_code == 200, answer.text


class Background:
    """Runs ``fn`` on a thread; ``result()`` joins it and returns its value (or raises its error)."""

    def __init__(self, fn) -> None:
        self._box: dict = {}
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._box["value"] = fn()
        except BaseException as e:  # handed to the test's thread by result()
            self._box["error"] = e

    def result(self):
        self._thread.join(GATE_S * 2)
        assert not self._thread.is_alive(), "the request did not end"
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]


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
    url, _, _ = server
    _refused(tts(url, text=NUMBERS[language], text_lang=language), "text", "the number 777777777777...", "digits")


def test_five_thousand_digits_are_refused_at_once_while_health_answers(server) -> None:
    url, _, gate = server
    digits = "1" * 5000
    for _ in range(3):
        gate.arm(digits)
        request = Background(lambda: tts(url, timeout=GATE_S * 2, text=digits))
        assert gate.entered.wait(GATE_S), "the request never reached the engine"
        health_answers(url)  # while the request is inside the engine, on a worker thread
        gate.release.set()
        _refused(request.result(), "text", "5000 digits")
        assert gate.outcome == ["TextLimitError"]  # refused by the engine's first check, before any model ran
    health_answers(url)


@pytest.mark.parametrize("language", ["en", "zh", "ja", "ko", "yue", "auto"])
def test_a_lone_surrogate_is_a_400_naming_the_field(server, language) -> None:
    url, _, _ = server
    raw = ('{"text": "Hello \\ud800 world", "text_lang": "%s", "ref_audio_path": "ref.wav", '
           '"prompt_text": "A calm clip.", "prompt_lang": "en"}' % language)
    answer = httpx.post(f"{url}/tts", content=raw, headers={"content-type": "application/json"}, timeout=30)
    _refused(answer, "text", "lone surrogate")
    raw = raw.replace("Hello \\ud800 world", "Hi there.").replace("A calm clip.", "A \\udfff clip.")
    _refused(httpx.post(f"{url}/tts", content=raw, headers={"content-type": "application/json"}, timeout=30),
             "prompt_text", "lone surrogate")


def test_ten_thousand_characters_of_mixed_scripts_stream_their_first_audio_before_the_rest(server) -> None:
    url, _, gate = server
    gate.arm(MIXED, after_first=True)  # the engine stops after the first piece until the client has heard it
    try:
        with httpx.stream("POST", f"{url}/tts", timeout=GATE_S * 2, json={
                "text": MIXED, "text_lang": "auto", "ref_audio_path": "ref.wav", **PROMPT, "text_split_method": "cut5",
                "media_type": "wav", "streaming_mode": True}) as answer:
            assert answer.status_code == 200
            received = 0
            for piece in answer.iter_bytes():
                received += len(piece)
                if received > 44:  # the WAV header and audio: the first piece, while the rest is held back
                    break
            assert received > 44 and not gate.release.is_set()
            assert gate.results_before_release == 1
            health_answers(url)  # while the long text is under way
    finally:
        gate.release.set()
    health_answers(url)


def test_long_paths_are_refused_before_the_file_system_while_health_answers(server) -> None:
    url, _, gate = server
    for field, value in (("ref_audio_path", "a/" * 80_000), ("gpt_weights_path", "b/" * 20_000),
                         ("aux_ref_audio_paths", ["a/" * 3000])):
        calls = gate.calls
        answer = tts(url, **{field: value})
        name = field if field != "aux_ref_audio_paths" else "aux_ref_audio_paths[0]"
        assert answer.status_code == 400 and answer.json()["message"].startswith(name), answer.text
        assert gate.calls == calls  # refused by the server's checks: the engine never saw it
        health_answers(url)


def test_symlink_loops_and_names_the_file_system_refuses_are_400s_naming_the_field(server) -> None:
    url, refs, _ = server
    for value in ("loop.wav", str(refs / "loop.wav"), "x" * 300 + ".wav", "bad\ud800.wav"):
        _refused(tts(url, ref_audio_path=value), "ref_audio_path", "not a file")
        _refused(tts(url, aux_ref_audio_paths=["ref.wav", value]), "aux_ref_audio_paths[1]", "not a file")
        query = {"refer_audio_path": value} if value.isascii() else None
        raw = None if query else f"{url}/set_refer_audio?refer_audio_path=bad%ED%A0%80.wav"  # the surrogate's bytes
        answer = httpx.get(raw or f"{url}/set_refer_audio", params=query, timeout=30)
        assert answer.status_code == 400 and "refer_audio_path" in answer.json()["Exception"], answer.text
        _refused(tts(url, gpt_weights_path=value), "gpt_weights_path", "not a weight file")


def test_a_normal_request_is_served_after_all_of_it(server) -> None:
    url, _, _ = server
    answer = tts(url, text="Hello there, 12 apples.")
    assert answer.status_code == 200 and answer.content[:4] == b"RIFF"


def test_error_messages_name_no_server_folder(server, tmp_path) -> None:
    import numpy as np
    import soundfile as sf

    url, refs, _ = server
    sf.write(refs / "many.wav", np.zeros((16000, 12), np.float32), 16000)  # 12 channels: refused by its header
    for answer in (tts(url, ref_audio_path="many.wav"), tts(url, ref_audio_path=str(refs / "many.wav")),
                   httpx.get(f"{url}/set_refer_audio", params={"refer_audio_path": "many.wav"}, timeout=30)):
        assert answer.status_code == 400 and "12 channels" in answer.text, answer.text
        assert str(refs) not in answer.text and str(Path.cwd()) not in answer.text, answer.text
