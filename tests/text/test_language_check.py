"""The text-language check: the share of letters a language's frontend reads, and a suggestion."""

from __future__ import annotations

import pytest

from engine.text.language_check import check_text_language


@pytest.mark.parametrize(("text", "language", "looks_like"), [
    ("你好，欢迎使用语音合成系统。", "en", "all_zh"),
    ("今日はいい天気ですね。", "en", "all_ja"),
    ("東京は大きい都市です", "all_zh", None),  # kanji alone reads as Chinese: not a mismatch
    ("東京は大きい都市です", "en", "all_ja"),  # kanji with kana looks Japanese
    ("안녕하세요, 반갑습니다.", "all_zh", "all_ko"),
    ("Hello there, nice to meet you.", "all_zh", "en"),
    ("Hello there, nice to meet you.", "all_ja", None),  # OpenJTalk spells Latin letters
])
def test_a_language_that_reads_almost_nothing_names_the_one_the_text_looks_like(text, language, looks_like):
    check = check_text_language(text, language)
    assert check.looks_like == looks_like and check.mismatch == (looks_like is not None)
    if looks_like:
        assert check.readable < 0.2 and looks_like in check.message() and check.message().isascii()
    else:
        assert check.message() == ""


def test_mixed_text_passes_when_enough_of_it_is_read() -> None:
    assert not check_text_language("我喜欢用Python写代码。", "zh").mismatch
    assert check_text_language("我喜欢用Python写代码。", "en").readable == pytest.approx(6 / 13)
    # a few English words in a Chinese sentence do not make it English
    assert check_text_language("这是一个很长的中文句子，里面只有 AI 两个字母。", "en").looks_like == "all_zh"


def test_auto_digits_and_punctuation_never_warn() -> None:
    assert not check_text_language("你好 Hello", "auto").mismatch
    assert not check_text_language("12345, 67.", "en").mismatch
    assert check_text_language("", "en").readable == 1.0
    assert check_text_language("12 345", "all_zh").readable == 1.0
