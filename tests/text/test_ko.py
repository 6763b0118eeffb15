"""Korean frontend against the official fixtures and bad input."""

from __future__ import annotations

import json

import pytest

from engine.text import korean
from tests.support.paths import fixture_folders

MAIN = "text_frontend_v2.json"
SEGMENTED = "text_frontend_v2_segmented.json"


def _to_ids(phones, symbols):
    unk = symbols.index("UNK")
    return [symbols.index(p) if p in symbols else unk for p in phones]


def _params():
    params = []
    for folder in fixture_folders("text", MAIN):
        data = json.loads((folder / MAIN).read_text(encoding="utf-8"))
        for s in data["sentences"]:
            if s["language"] == "ko" and s["clean_text"].get("ok"):
                c = s["clean_text"]
                params.append(pytest.param(s["text"], c["norm_text"], c["phone_ids"], data["symbols_v2"],
                                           id=f"{folder.name}/{s['id']}"))
    for folder in fixture_folders("text", SEGMENTED):
        data = json.loads((folder / SEGMENTED).read_text(encoding="utf-8"))
        for s in data["sentences"]:
            for key, result in s.items():
                if key.startswith("get_phones_and_bert[") and result.get("ok"):
                    for i, seg in enumerate(result["segments"]):
                        if seg["language"] == "ko":
                            params.append(pytest.param(seg["text"], seg["norm_text"], seg["phone_ids"], data["symbols_v2"],
                                                       id=f"{folder.name}/{s['id']}/{key}/seg{i}"))
    return params or [pytest.param(None, None, None, None, marks=pytest.mark.skip(reason="no text fixtures"))]


@pytest.mark.parametrize("text, norm_text, phone_ids, symbols", _params())
def test_fixture(text, norm_text, phone_ids, symbols):
    norm = korean.normalize(text)
    assert norm == norm_text
    phones, word2ph = korean.g2p(norm)
    assert word2ph is None
    assert _to_ids(phones, symbols) == phone_ids


def test_latin_letters_are_spelled():
    # "ab" -> 에이비 (letter names), read by g2pk2, then divided into jamo and closed with "."
    phones, _ = korean.g2p("ab")
    assert phones == ["ㅇ", "ㅔ", "ㅇ", "ㅣ", "ㅂ", "ㅣ", "."]


def test_build_never_downloads():
    """In a fresh interpreter (g2pk2 not yet imported) nltk.download is never called, and is restored."""
    import subprocess
    import sys

    from tests.support.paths import REPO

    code = (
        "import nltk\n"
        "def refuse(*a, **k): raise SystemExit('nltk.download was called')\n"
        "nltk.download = refuse\n"
        "from engine.text import korean\n"
        "assert korean.g2p('안녕')[0][:2] == ['ㅇ', 'ㅏ']\n"
        "assert nltk.download is refuse\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout


@pytest.mark.parametrize("text", ["", " ", "...", "!?", "😀", "\x00\x07", "中文", "こんにちは", "ㅋㅋㅋ"])
def test_bad_input_maps_to_known_symbols(text):
    phones, _ = korean.g2p(korean.normalize(text))
    symbols = set(json.loads(json.dumps(list(korean.default_g2p()._symbols))))
    assert all(p in symbols for p in phones)


def test_unknown_characters_become_pause():
    phones, _ = korean.g2p("😀 안녕")
    assert phones[0] == "停" and phones[1] == "空"


def test_long_input():
    import time

    start = time.perf_counter()
    phones, _ = korean.g2p("안녕하세요. 만나서 반갑습니다. " * 1000)  # 18,000 characters
    assert len(phones) > 30_000
    assert time.perf_counter() - start < 60


def test_pronounce_equals_g2pk2(monkeypatch):
    """Our replay of g2pk2.G2p.__call__ equals the library's own call on varied Korean text."""
    import nltk

    monkeypatch.setattr(nltk, "download", lambda *a, **k: False)
    import mecab
    from g2pk2 import G2p
    from g2pk2.utils import get_rule_id2text, parse_table

    reference = G2p.__new__(G2p)  # __init__ would read the missing nltk cmudict corpus
    reference.mecab, reference.table, reference.cmu = mecab.MeCab(), parse_table(), {}
    reference.rule2text = get_rule_id2text()
    import os

    import g2pk2

    reference.idioms_path = os.path.join(os.path.dirname(g2pk2.g2pk2.__file__), "idioms.txt")
    ours = korean.default_g2p()
    for text in ["안녕하세요. 만나서 반갑습니다.", "값이 1,500원이에요?", "저는 스물다섯 살입니다.", "닭이 밟고 읽는다",
                 "의사의 희망은 무늬", "3개를 샀어요", "같이 굳이 해돋이", "신라 광한루 물난리", "엠피쓰리 파일을 다운받고 있다"]:
        assert ours.pronounce(text) == reference(text), text
