"""English text normalisation, rule for rule what the official v2 frontend does before g2p.

The official ``GPT_SoVITS/text/english.py`` ``text_normalize`` does three things:

1. maps the fullwidth sentence marks ``。！？`` to ``.!?`` (its other two replacement keys are
   regex-escaped bracket expressions that never match real text, so nothing else is mapped);
2. expands numbers, money, times, units, fractions, ordinals and a few abbreviations into words
   (``en_normalization/expend.py``), strips accents and deletes every character outside
   ``[ A-Za-z'.,?!-]``, then spaces out capital letters that follow a non-space (``NASA`` ->
   ``N A S A``);
3. collapses a run of punctuation that follows a mark *or whitespace* to its first character.

The quirks are kept on purpose: they decide the phones the models were trained on.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from engine.errors import TextError
from engine.text.limits import MAX_NUMBER_DIGITS, check_user_text

# The official `punctuation` list of text/symbols.py; used by the collapse rule below.
_PUNCTUATION = "!?…,.-"
_COLLAPSE_RE = re.compile("([" + re.escape(_PUNCTUATION) + r"\s])([" + re.escape(_PUNCTUATION) + "])+")

# Only these three keys of the official rep_map can ever match (see module docstring).
_FULLWIDTH_MARKS = {"。": ".", "！": "!", "？": "?"}

# unit suffix -> (singular, plural); expend.py::measurement_map
_UNITS = {
    "m": ("meter", "meters"),
    "km": ("kilometer", "kilometers"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "ft": ("feet", "feet"),
    "L": ("liter", "liters"),
    "tbsp": ("tablespoon", "tablespoons"),
    "tsp": ("teaspoon", "teaspoons"),
    "h": ("hour", "hours"),
    "min": ("minute", "minutes"),
    "s": ("second", "seconds"),
    "°C": ("degree celsius", "degrees celsius"),
    "°F": ("degree fahrenheit", "degrees fahrenheit"),
}
_OPERATORS = {"+": " plus ", "-": " minus ", "×": " times ", "÷": " divided by ", "=": " Equals "}

# Every pattern below runs in linear time on any text: a pattern that can start inside a run of digits
# (or of blanks) is anchored to the run's start with a lookbehind, and runs that nothing after them can
# match again are possessive. The official patterns retried every start inside a run and backtracked
# through it (cubic for "123...9" with no "$" or "£" after it). Each change keeps the matches the same:
# a match can only begin at the run's start, and a later start inside the run would meet the same text
# after the run (tests/text/test_text_limits.py checks the two sets of patterns against each other).
_LIST_ORDINAL_RE = re.compile(r"\b([0-9]+)\. ")
_OPERAND = r"((-?)((?<!\d)(\d++)(\.\d++)?[⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*)|(\.\d+[⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*)|([A-Za-z][⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*))"
_ARITHMETIC_RE = re.compile(_OPERAND + r"\s+([\+\-\×÷=])\s+" + _OPERAND)
_NEGATIVE_RE = re.compile(r"(?:^|(?<!\s)\s++)(-)(\d+)")
_THOUSANDS_RE = re.compile(r"([0-9][0-9\,]+[0-9])")
_TIME_RE = re.compile(r"\b([01]?[0-9]|2[0-3]):([0-5][0-9])\b")
_UNIT_RE = re.compile(r"\b([0-9]+(\.[0-9]+)?(m|km|km/h|ft|L|tbsp|tsp|h|min|s|°C|°F))\b")
_POUNDS_BEFORE_RE = re.compile(r"£([0-9\.\,]*[0-9]+)")
_POUNDS_AFTER_RE = re.compile(r"(?<![0-9\.\,])([0-9\.\,]*+)£")
_DOLLARS_BEFORE_RE = re.compile(r"\$([0-9\.\,]*[0-9]+)")
_DOLLARS_AFTER_RE = re.compile(r"(?<![(0-9\.\,])([(0-9\.\,]*+)\$")
_DECIMAL_RE = re.compile(r"(?<![0-9])([0-9]+\.\s*[0-9]+)")
_FRACTION_RE = re.compile(r"(?<![0-9])([0-9]+/[0-9]+)")
_ORDINAL_RE = re.compile(r"(?<![0-9])[0-9]+(st|nd|rd|th)")
_NUMBER_RE = re.compile(r"[0-9]+")
_NOT_KEPT_RE = re.compile(r"[^ A-Za-z'.,?!\-]")
_IE_RE = re.compile(r"(?i)i\.e\.")
_EG_RE = re.compile(r"(?i)e\.g\.")
_CAPITAL_RE = re.compile(r"(?<!^)(?<![\s])([A-Z])")


@lru_cache(maxsize=1)
def _inflect_engine():
    import inflect  # deferred: inflect builds large tables at import

    return inflect.engine()


def _say(number, **kwargs) -> str:
    import inflect

    try:
        return _inflect_engine().number_to_words(number, **kwargs)
    except inflect.NumOutOfRangeError:  # more digits than inflect has names for (a number joined by "1,000,...")
        raise TextError(f"text: the number {str(number)[:12]}... is too long to read; at most "
                        f"{MAX_NUMBER_DIGITS['en']} digits can be read as one number in English", field="text") from None


def _list_ordinal(m: re.Match) -> str:
    return _inflect_engine().ordinal(m.group(1)) + ", "


def _arithmetic(m: re.Match) -> str:
    return m.group(1) + _OPERATORS[m.group(8)] + m.group(9)


def _negative(m: re.Match) -> str:
    return ("negative " if m.group(1) else "") + m.group(2)


def _time(m: re.Match) -> str:
    hours, minutes = int(m.group(1)), int(m.group(2))
    period = "a.m." if hours < 12 else "p.m."
    if hours > 12:
        hours -= 12
    if minutes == 0:
        return f"{_say(hours)} o'clock {period}"
    return f"{_say(hours)} {_say(minutes)} {period}"


def _unit(m: re.Match) -> str:
    unit = m.group(3)
    # The official code drops the unit and the decimal point to get a number; only a bare "1"
    # takes the singular.
    value = int(m.group(1).replace(unit, "").replace(".", ""))
    plural = not (m.group(2) is None and value == 1)
    return m.group(1).replace(unit, " " + _UNITS[unit][int(plural)])


def _money(amount: str, major: tuple[str, str], minor: tuple[str, str], fallback: str) -> str:
    parts = amount.split(".")
    if len(parts) > 2:
        return amount + " " + fallback
    whole = int(parts[0]) if parts[0] else 0
    cents = int(parts[1].ljust(2, "0")) if len(parts) > 1 and parts[1] else 0
    whole_unit = major[0] if whole == 1 else major[1]
    cents_unit = minor[0] if cents == 1 else minor[1]
    if whole and cents:
        return f"{whole} {whole_unit} and {cents} {cents_unit}"
    if whole:
        return f"{whole} {whole_unit}"
    if cents:
        return f"{cents} {cents_unit}"
    return "zero " + fallback


def _pounds(m: re.Match) -> str:
    if not m.group(1)[-1:].isdigit():  # the "...£" patterns match a whole run; the official one needs a digit last
        return m.group(0)
    return _money(m.group(1), ("pound", "pounds"), ("penny", "pence"), "pounds")


def _dollars(m: re.Match) -> str:
    if not m.group(1)[-1:].isdigit():
        return m.group(0)
    return _money(m.group(1), ("dollar", "dollars"), ("cent", "cents"), "dollars")


def _decimal(m: re.Match) -> str:
    whole, digits = m.group(1).split(".")[:2]
    return whole + " point " + " ".join(digits)


def _fraction(m: re.Match) -> str:
    numerator, denominator = (int(x) for x in m.group(0).split("/"))
    head = _say(numerator)
    if denominator == 2:
        return f"{head} {'half' if numerator == 1 else 'halves'}"
    if denominator == 1:
        return head
    tail = _inflect_engine().ordinal(_say(denominator))
    if numerator > 1:
        tail += "s"
    return f"{head} {tail}"


def _ordinal(m: re.Match) -> str:
    return _say(m.group(0))


def _number(m: re.Match) -> str:
    return _number_words(m.group(0))


@lru_cache(maxsize=4096)  # pure; inflect takes about a millisecond per number, and texts repeat numbers
def _number_words(digits: str) -> str:
    num = int(digits)
    if 1000 < num < 3000:  # years are read in pairs: 1999 -> nineteen ninety-nine
        if num == 2000:
            return "two thousand"
        if 2000 < num < 2010:
            return "two thousand " + _say(num % 100)
        if num % 100 == 0:
            return _say(num // 100) + " hundred"
        return _say(num, andword="", zero="oh", group=2).replace(", ", " ")
    return _say(num, andword="")


def expand(text: str) -> str:
    """The official ``en_normalization.expend.normalize`` rules, in their order."""
    text = _LIST_ORDINAL_RE.sub(_list_ordinal, text)
    while _ARITHMETIC_RE.search(text):
        text = _ARITHMETIC_RE.sub(_arithmetic, text)
    text = _NEGATIVE_RE.sub(_negative, text)
    text = _THOUSANDS_RE.sub(lambda m: m.group(1).replace(",", ""), text)
    text = _TIME_RE.sub(_time, text)
    text = _UNIT_RE.sub(_unit, text)
    text = _POUNDS_BEFORE_RE.sub(_pounds, text)
    text = _POUNDS_AFTER_RE.sub(_pounds, text)
    text = _DOLLARS_BEFORE_RE.sub(_dollars, text)
    text = _DOLLARS_AFTER_RE.sub(_dollars, text)
    text = _DECIMAL_RE.sub(_decimal, text)
    text = _FRACTION_RE.sub(_fraction, text)
    text = _ORDINAL_RE.sub(_ordinal, text)
    text = _NUMBER_RE.sub(_number, text)
    text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    text = text.replace("%", " percent")
    text = _NOT_KEPT_RE.sub("", text)
    text = _IE_RE.sub("that is", text)
    text = _EG_RE.sub("for example", text)
    return _CAPITAL_RE.sub(r" \1", text)


def normalize(text: str) -> str:
    """English ``norm_text`` exactly as the official ``english.text_normalize`` returns it.

    A number of more digits than English can read is a TextError before any rule runs."""
    check_user_text(text, "en")
    for mark, ascii_mark in _FULLWIDTH_MARKS.items():
        text = text.replace(mark, ascii_mark)
    text = expand(text)
    return _COLLAPSE_RE.sub(r"\1", text)
