"""Mandarin frontend: normalisation + g2p (v1 and v2) against outputs of the official code, and bad input."""

from __future__ import annotations

import json

import pytest

from engine.errors import TextError
from engine.text import chinese
from engine.text.chinese.g2p import syllable_phones
from engine.text.chinese.textnorm import TextNormalizer
from engine.text.cleaner import clean_text
from engine.text.symbols import symbol_to_id
from tests.support.paths import ASSETS

ORACLE = json.loads((ASSETS / "text_zh_official.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("case", ORACLE["cases"], ids=lambda c: c["text"][:14])
def test_normalize_and_g2p_match_official(case, version):
    expected = case[version]
    norm = chinese.normalize(case["text"])
    assert norm == expected["norm_text"]
    phones, word2ph = chinese.g2p(norm, version)
    assert phones == expected["phones"]
    assert word2ph == expected["word2ph"]


def test_v1_has_no_erhua_merge():
    # 玩儿 / 花儿: v2 gives 儿 the previous tone (er2 -> er<tone>), v1 keeps pypinyin's tone
    case = next(c for c in ORACLE["cases"] if "胡同儿" in c["text"])
    assert case["v1"]["phones"] != case["v2"]["phones"]
    assert chinese.g2p(case["v1"]["norm_text"], "v1")[0] == case["v1"]["phones"]


def test_text_normalizer_is_usable_alone():
    # the Cantonese frontend builds on it: sentences keep their own punctuation
    sentences = TextNormalizer().normalize("气温-3.5℃，比昨天低了12%。")
    assert len(sentences) == 2 and sentences[0].endswith("，")
    assert "".join(sentences) == "气温零下三点五度，比昨天低了百分之十二。"


def test_special_pause_marks_become_sp2_sp3():
    for mark, pause in (("￥", "SP2"), ("^", "SP3")):
        phones, word2ph, norm = clean_text(f"停顿{mark}一下。", "zh")
        with_comma, _, norm_comma = clean_text("停顿,一下。", "zh")
        assert norm == norm_comma
        assert phones == [pause if p == "," else p for p in with_comma]
        assert pause in phones


@pytest.mark.parametrize("text", ["😀😀", "\x00\x07\x1b", "\u200b", "   ", "！？。", "abc def"])
def test_nothing_speakable_gives_empty_or_marks(text):
    # everything outside U+4E00..U+9FA5 and ! ? … , . - is dropped by the normaliser (official behaviour)
    phones, word2ph, norm = clean_text(text, "zh")
    assert set(norm) <= set("!?…,.-")
    assert phones == list(norm) and word2ph == [1] * len(norm)


def test_emoji_and_control_characters_inside_text_are_dropped():
    phones, word2ph, norm = clean_text("你\x07好😀，世界\u200b。", "zh")
    assert norm == chinese.normalize("你好，世界。")
    assert len(word2ph) == len(norm) and sum(word2ph) == len(phones)


def test_non_ascii_digits_do_not_crash():
    # Python's \d matches them; the official code raises KeyError, here they are read by value
    assert chinese.normalize("٣٤٥") == chinese.normalize("345")


def test_long_text_is_linear_and_consistent():
    unit = "我们一起去银行，看看行长在不在。"
    text = unit * (100_000 // len(unit))
    assert len(text) == 100_000
    phones, word2ph, norm = clean_text(text, "zh")
    one, one_w2p, one_norm = clean_text(unit, "zh")
    assert norm == one_norm * (100_000 // len(unit))
    assert phones == one * (100_000 // len(unit)) and word2ph == one_w2p * (100_000 // len(unit))


def test_unreadable_syllable_is_a_text_error():
    with pytest.raises(TextError, match="remove or replace"):
        syllable_phones("㐀", "㐀")
    with pytest.raises(TextError):
        syllable_phones("h", "m")  # no tone digit


def test_every_phone_is_in_the_v1_table():
    ids = symbol_to_id("v1")
    for case in ORACLE["cases"]:
        assert all(p in ids for p in case["v1"]["phones"])
