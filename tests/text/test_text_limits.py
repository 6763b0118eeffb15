"""Text work with a budget: the English patterns run in linear time and match what the official ones match,
numbers too long to read and lone surrogates are refused up front (naming the field), and hostile texts in
every language finish within seconds."""

from __future__ import annotations

import random
import re
import time

import pytest

from engine.errors import TextError
from engine.text import en_normalize
from engine.text.limits import MAX_NUMERIC_RUN, check_user_text, max_number_digits

# The official patterns (GPT_SoVITS/text/en_normalization/expend.py) that en_normalize rewrote: the
# reference the rewritten ones must agree with on every text.
_OFFICIAL_OPERAND = r"((-?)((\d+)(\.\d+)?[⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*)|(\.\d+[⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*)|([A-Za-z][⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*))"
OFFICIAL = {
    "_ARITHMETIC_RE": re.compile(_OFFICIAL_OPERAND + r"\s+([\+\-\×÷=])\s+" + _OFFICIAL_OPERAND),
    "_NEGATIVE_RE": re.compile(r"(?:^|\s+)(-)(\d+)"),
    "_POUNDS_AFTER_RE": re.compile(r"([0-9\.\,]*[0-9]+)£"),
    "_DOLLARS_AFTER_RE": re.compile(r"([(0-9\.\,]*[0-9]+)\$"),
    "_DECIMAL_RE": re.compile(r"([0-9]+\.\s*[0-9]+)"),
    "_FRACTION_RE": re.compile(r"([0-9]+/[0-9]+)"),
    "_ORDINAL_RE": re.compile(r"[0-9]+(st|nd|rd|th)"),
}
ALPHABET = "0123456789" * 3 + ".,£$(-+×÷=/²ax st nd rd th  \t"


def _expand_or_error(text: str) -> str:
    try:
        return en_normalize.expand(text)
    except Exception as e:  # noqa: BLE001 - both pattern sets must fail alike too
        return f"<{type(e).__name__}>"


def test_linear_patterns_expand_like_the_official_ones(monkeypatch):
    rng = random.Random(21)
    texts = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 24))) for _ in range(3000)]
    texts += ["1 + 2 + 3 = 6", "-5 and  -7", "12.50$ 3£ 1.£ .5$", "(1,5$", "1/2 3/4", "21st 2nd", "1. 2.5 3.  4"]
    ours = [_expand_or_error(t) for t in texts]
    for name, pattern in OFFICIAL.items():
        monkeypatch.setattr(en_normalize, name, pattern)
    theirs = [_expand_or_error(t) for t in texts]
    differ = [(t, a, b) for t, a, b in zip(texts, ours, theirs) if a != b]
    assert not differ, differ[:5]


@pytest.mark.parametrize("text", [
    "1" * 36 + "$", "1" * 36 + "£", "7" * 36 + " apples", "3." + "1" * 36, " " * 9000 + "x",
    "a" + " " * 9000 + "b", "²" * 9000, "1²" + "²" * 9000, ("12 + 3 - 4 = 5 " * 600)[:9000], "1." * 4500,
    ("1 " * 4500), ("12,345$ " * 1100),
])
def test_hostile_english_is_normalised_quickly(text):
    en_normalize.normalize("warm up 12")  # inflect's import is not the pattern's time
    start = time.perf_counter()
    try:
        en_normalize.normalize(text)
    except TextError as e:  # a refusal is an answer too; it must say what to fix
        assert "at most" in str(e)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("text", ["1" * 5000, "1," * 3000, "9" * 37])
def test_numbers_english_cannot_read_are_a_text_error(text):
    start = time.perf_counter()
    with pytest.raises(TextError, match="digits; at most 36"):
        en_normalize.normalize(text)
    assert time.perf_counter() - start < 1


def test_the_longest_readable_number_is_read():
    words = en_normalize.normalize("9" * 36)
    assert "decillion" in words


@pytest.mark.parametrize("language, limit", [("en", 36), ("zh", 36), ("ja", 36), ("yue", 36), ("ko", 16),
                                             ("all_ko", 16), ("auto", 16), ("auto_yue", 16)])
def test_number_limits_per_language(language, limit):
    assert max_number_digits(language) == limit
    check_user_text("x " + "5" * limit + " y", language)
    with pytest.raises(TextError) as e:
        check_user_text("x " + "5" * (limit + 1) + " y", language, "text")
    assert e.value.field == "text"
    assert f"the number 555555555555... has {limit + 1} digits" in str(e.value)


def test_thousands_separators_join_one_number():
    check_user_text("1,000,000", "ko")
    with pytest.raises(TextError, match="has 18 digits"):
        check_user_text("100,000,000,000,000,000", "ko")


def test_long_runs_of_numbers_and_signs_are_refused():
    check_user_text("1.2." * (MAX_NUMERIC_RUN // 4), "zh")
    with pytest.raises(TextError, match="run of numbers and signs"):
        check_user_text("1.2." * (MAX_NUMERIC_RUN // 4 + 1), "zh")
    check_user_text("." * 5000, "zh")  # no digit: nothing to read as a number


@pytest.mark.parametrize("field", ["text", "reference.text"])
def test_a_lone_surrogate_is_refused_naming_the_field(field):
    with pytest.raises(TextError) as e:
        check_user_text("Hello \ud800 world", "en", field)
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}: holds a lone surrogate (U+D800) at character 7")
    check_user_text("Hello \U0001F600 world", "en", field)  # a real astral character is fine


@pytest.mark.slow
@pytest.mark.parametrize("language", ["zh", "ja", "yue", "ko", "auto", "en"])
def test_every_frontend_reads_the_longest_accepted_numbers_quickly(language):
    from engine.text.frontend import TextFrontend

    frontend = TextFrontend("v2")
    limit = max_number_digits(language)
    text = " ".join(["8" * limit, "1.2.3.4." * (MAX_NUMERIC_RUN // 8), "3+4=7"] * 60)
    check_user_text(text, language)
    try:
        frontend.phones_and_bert("warm up", language, with_bert=False)
    except TextError:
        pass
    start = time.perf_counter()
    frontend.phones_and_bert(text, language, with_bert=False)
    assert time.perf_counter() - start < 5
