"""Japanese frontend against the official fixtures (the original pyopenjtalk 0.4.1 with the pyopenjtalk-plus
dictionary, see the fixture README) and bad input. Every fixture sentence must be phone-exact, accent marks
included: an install with another OpenJTalk build or dictionary fails here on purpose."""

from __future__ import annotations

import json

import pytest

from engine.text import japanese
from tests.support.paths import fixture_folders

MARKERS = ("text_frontend_v2_ja.json", "text_frontend_v2_segmented.json")

PROSODY_MARKS = {"[", "]", "#", "UNK"}
# sys.dic of pyopenjtalk-plus 0.4.1.post10, the dictionary the ja fixtures were made with (fixture README, shim 6)
FIXTURE_DICTIONARY_SHA256 = "23287ce5d518164b8b97683b1d9534df095556e446f3470a6c52bd737be74527"


def _sys_dic_sha256(folder) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(folder / "sys.dic", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _to_ids(phones, symbols):
    unk = symbols.index("UNK")
    return [symbols.index(p) if p in symbols else unk for p in phones]


def _sentence_params():
    """Japanese clean_text entries of the ja file and of the main file (whose ja entries could not run offline)."""
    params = []
    for marker in (MARKERS[0], "text_frontend_v2.json"):
        for folder in fixture_folders("text", marker):
            data = json.loads((folder / marker).read_text(encoding="utf-8"))
            for s in data["sentences"]:
                if s.get("language") != "ja":
                    continue
                marks = [] if s["clean_text"].get("ok") else [
                    pytest.mark.skip(reason=f"official code could not produce this offline: {s['clean_text'].get('error_type')}")
                ]
                params.append(pytest.param(s, data["symbols_v2"], id=f"{folder.name}/{marker}/{s['id']}", marks=marks))
    return params or [pytest.param(None, None, marks=pytest.mark.skip(reason="no text fixtures"))]


def _segment_params():
    params = []
    for folder in fixture_folders("text", MARKERS[1]):
        data = json.loads((folder / MARKERS[1]).read_text(encoding="utf-8"))
        for s in data["sentences"]:
            for key, result in s.items():
                if key.startswith("get_phones_and_bert[") and result.get("ok"):
                    for i, seg in enumerate(result["segments"]):
                        if seg["language"] == "ja":
                            params.append(pytest.param(seg, data["symbols_v2"], id=f"{folder.name}/{s['id']}/{key}/seg{i}"))
    return params or [pytest.param(None, None, marks=pytest.mark.skip(reason="no text fixtures"))]


@pytest.mark.parametrize("case, symbols", _sentence_params())
def test_norm_text_and_phonemes(case, symbols):
    expected = case["clean_text"]
    norm = japanese.normalize(case["text"])
    assert norm == expected["norm_text"]
    phones, word2ph = japanese.g2p(norm)
    assert word2ph is None
    strip = lambda ps: [p for p in ps if p not in PROSODY_MARKS]  # noqa: E731
    got = [p if p in symbols else "UNK" for p in phones]
    assert strip(got) == strip(expected["phones"])


def test_installed_openjtalk_is_the_official_library_with_the_fixture_dictionary():
    g2p = japanese.default_g2p()
    assert g2p.library == "pyopenjtalk", "pyopenjtalk-plus's modified OpenJTalk moves accent marks"
    assert _sys_dic_sha256(g2p.dictionary_dir) == FIXTURE_DICTIONARY_SHA256, g2p.dictionary_dir


@pytest.mark.parametrize("case, symbols", _sentence_params())
def test_phones_with_prosody(case, symbols):
    phones, _ = japanese.g2p(case["clean_text"]["norm_text"])
    assert _to_ids(phones, symbols) == case["clean_text"]["phone_ids"]


@pytest.mark.parametrize("seg, symbols", _segment_params())
def test_segments(seg, symbols):
    norm = japanese.normalize(seg["text"])
    assert norm == seg["norm_text"]
    assert _to_ids(japanese.g2p(norm)[0], symbols) == seg["phone_ids"]


def test_prosody_marks_from_labels():
    # Hand-made labels for "^ a [ a ] $"-like contours: a2 goes 1 -> 2 (rise), then accent at a1 == 0 (fall).
    def lab(p, a1, a2, a3, f1=3):
        return f"x^x-{p}+x=x/A:{a1}+{a2}+{a3}/B:x/F:{f1}_x!0_x"

    labels = [
        "x^x-sil+x=x/A:xx+xx+xx/F:xx_x!xx_x",
        lab("a", -1, 1, 3),
        lab("a", 0, 2, 2),
        lab("a", 1, 3, 1),
        "x^x-sil+x=x/A:xx+xx+xx/F:xx_x!0_x",
    ]
    assert japanese.prosody_phones(labels) == ["^", "a", "[", "a", "]", "a", "$"]


def test_user_dictionary(tmp_path):
    # one entry in OpenJTalk's user-dictionary CSV format (the official ja_userdic/userdict.csv layout)
    csv = tmp_path / "userdict.csv"
    csv.write_text("主殿,,,1,名詞,一般,*,*,*,*,主殿,トノ,トノ,1/2,*\n", encoding="utf-8")
    plain = japanese.JapaneseG2p()("主殿です")
    custom = japanese.JapaneseG2p(csv)("主殿です")
    assert custom[:4] == ["t", "o", "]", "n"] and plain != custom


def test_marks_are_kept_and_mapped():
    phones, _ = japanese.g2p("はい、そう。ええ！")
    assert phones.count(",") == 1 and phones.count(".") == 1 and phones[-1] == "!"


@pytest.mark.parametrize("text", ["", " ", "。。。", "！？", "😀", "\x00\x07", "abc", "ｶﾀｶﾅ", "안녕", "你好吗"])
def test_bad_input_never_crashes(text):
    phones, word2ph = japanese.g2p(japanese.normalize(text))
    assert isinstance(phones, list) and word2ph is None


def test_long_input():
    import time

    start = time.perf_counter()
    phones, _ = japanese.g2p("今日はいい天気ですね。" * 3000)  # 33,000 characters
    assert len(phones) > 50_000
    assert time.perf_counter() - start < 60


def test_stdout_stays_clean():
    """pyopenjtalk-plus prints a notice on import; building the frontend must not write to stdout (CLI JSON)."""
    import subprocess
    import sys

    from tests.support.paths import REPO

    code = "from engine.text import japanese\njapanese.g2p('こんにちは')\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


def test_long_run_without_punctuation():
    """OpenJTalk 0.4.1 copies a run into a fixed 8 KiB buffer unchecked; long runs must go through in pieces."""
    phones, _ = japanese.g2p("あいうえお" * 1000 + "ｱｲｳｴｵ" * 600)
    assert [p for p in phones if p not in PROSODY_MARKS] == ["a", "i", "u", "e", "o"] * 1600


def test_dictionary_choice(tmp_path, monkeypatch):
    monkeypatch.setenv(japanese.DICTIONARY_ENV, str(tmp_path))
    with pytest.raises(japanese.TextError, match="no sys.dic"):
        japanese.dictionary_dir()
    monkeypatch.delenv(japanese.DICTIONARY_ENV)
    monkeypatch.setattr(japanese, "PACKAGED_DICTIONARY", tmp_path / "missing")
    with pytest.raises(japanese.TextError, match="reinstall"):
        japanese.dictionary_dir(None)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "sys.dic").write_bytes(b"")
    assert japanese.dictionary_dir(str(tmp_path / "lib").encode()) == tmp_path / "lib"
