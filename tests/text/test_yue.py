"""Cantonese frontend against the official fixtures (clean_text, all_yue / auto_yue segments) and bad input."""

from __future__ import annotations

import json

import pytest

from engine.errors import TextError
from engine.text import cantonese
from tests.support.paths import fixture_folders

MAIN = "text_frontend_v2.json"
SEGMENTED = "text_frontend_v2_segmented.json"


def _to_ids(phones, symbols):
    unk = symbols.index("UNK")
    return [symbols.index(p) if p in symbols else unk for p in phones]


def _sentence_params():
    params = []
    for folder in fixture_folders("text", MAIN):
        data = json.loads((folder / MAIN).read_text(encoding="utf-8"))
        for s in data["sentences"]:
            if s["language"] == "yue" and s["clean_text"].get("ok"):
                params.append(pytest.param(s, data["symbols_v2"], id=f"{folder.name}/{s['id']}"))
    return params or [pytest.param(None, None, marks=pytest.mark.skip(reason="no text fixtures"))]


def _segment_params():
    params = []
    for folder in fixture_folders("text", SEGMENTED):
        data = json.loads((folder / SEGMENTED).read_text(encoding="utf-8"))
        for s in data["sentences"]:
            for key, result in s.items():
                if key.startswith("get_phones_and_bert[") and result.get("ok"):
                    for i, seg in enumerate(result["segments"]):
                        if seg["language"] == "yue":
                            params.append(pytest.param(seg, data["symbols_v2"], id=f"{folder.name}/{s['id']}/{key}/seg{i}"))
    return params or [pytest.param(None, None, marks=pytest.mark.skip(reason="no text fixtures"))]


@pytest.mark.parametrize("case, symbols", _sentence_params())
def test_clean_text(case, symbols):
    expected = case["clean_text"]
    norm = cantonese.normalize(case["text"])
    assert norm == expected["norm_text"]
    phones, word2ph = cantonese.g2p(norm)
    assert phones == expected["phones"]
    assert _to_ids(phones, symbols) == expected["phone_ids"]
    assert word2ph == expected["word2ph"]
    assert len(word2ph) == len(norm) and sum(word2ph) == len(phones)


@pytest.mark.parametrize("seg, symbols", _segment_params())
def test_segments(seg, symbols):
    norm = cantonese.normalize(seg["text"])
    assert norm == seg["norm_text"]
    phones, word2ph = cantonese.g2p(norm)
    assert _to_ids(phones, symbols) == seg["phone_ids"]
    assert len(word2ph) == len(norm)


def test_initial_split_rules():
    # first match in INITIALS order; empty final repeats the initial's last letter; "nga" splits after "ng"
    phones, word2ph = cantonese.jyutping_to_phones(["m4", "ng5", "ngaa4", "aa3", ",", "_"])
    assert phones == ["Ym", "Ym4", "Yng", "Yg5", "Yng", "Yaa4", "Yaa", "Ya3", ",", "Y_"]
    assert word2ph == [2, 2, 2, 2, 1, 1]


def test_normalize_drops_latin_and_emoji_and_maps_brackets():
    # 《》 are deleted by the Mandarin normaliser, ～ becomes "-", Latin letters and emoji are dropped
    assert cantonese.normalize("《你好》abc😀～") == "你好-"
    assert cantonese.normalize("你好abc😀！") == "你好!"


@pytest.mark.parametrize("text", ["", " ", "。。。", "！？", "😀", "\x00\x07", "abc", "こんにちは", "안녕"])
def test_bad_input_gives_empty_or_marks(text):
    norm = cantonese.normalize(text)
    phones, word2ph = cantonese.g2p(norm)
    assert len(word2ph) == len(norm) and sum(word2ph) == len(phones)


def test_unreadable_text_is_a_text_error():
    with pytest.raises(TextError, match="no Cantonese reading"):
        cantonese.g2p("abc")  # g2p expects normalised text


def test_long_input():
    import time

    start = time.perf_counter()
    norm = cantonese.normalize("我哋今日去咗公园，买咗3个橙。" * 6000)  # 90,000 characters
    phones, word2ph = cantonese.g2p(norm)
    assert len(word2ph) == len(norm) and sum(word2ph) == len(phones)
    assert time.perf_counter() - start < 60
