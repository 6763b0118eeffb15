"""What user text must be before any language work starts: valid Unicode, and numbers short enough to read.

Both checks are one linear scan, so they are safe on the longest text a server accepts. A lone surrogate
(``"\\ud800"``, which JSON can carry) cannot be encoded for any tokenizer or dictionary; a run of digits
longer than the frontends can put into words would fail deep inside a g2p library (inflect reads at most
36 digits, g2pk2 at most 16) or, before this check, feed super-linear work on the whole run. Both are
refused up front with a :class:`~engine.errors.TextError` that names the field and quotes the number.
"""

from __future__ import annotations

import re

from engine.errors import TextError

__all__ = ["TextLimitError", "MAX_NUMBER_DIGITS", "MAX_NUMERIC_RUN", "max_number_digits", "check_user_text",
           "long_number", "long_numeric_run"]

# The longest number (its digits; "1,000,000" counts 7) each language's frontend turns into words: inflect
# names numbers up to 36 digits, g2pk2 up to 16; the Mandarin, Cantonese and Japanese normalisers read longer
# ones digit by digit, but their patterns retry every start inside a number, so they get the same bound. A
# routing code reaches English too (Latin runs and bare numbers go to the English frontend).
MAX_NUMBER_DIGITS = {"en": 36, "zh": 36, "ja": 36, "ko": 16, "yue": 36}
# The longest run of digits and the signs the normalisers read between them (1.2.3, 1/2, 3+4=7, 10:30...).
MAX_NUMERIC_RUN = 64

_ROUTES = {  # routing code -> the frontends its text can reach (engine.text.frontend.route)
    "en": ("en",), "zh": ("zh", "en"), "all_zh": ("zh", "en"), "ja": ("ja", "en"), "all_ja": ("ja", "en"),
    "ko": ("ko", "en"), "all_ko": ("ko", "en"), "yue": ("yue", "en"), "all_yue": ("yue", "en"),
}
_RUN_RE = re.compile(r"[\d.,:/~+\-×÷=%]++")  # possessive: one pass over each run, whatever its length
_NUMBER_RE = re.compile(r"\d[\d,]*+")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_SHOWN = 12


class TextLimitError(TextError):
    """The text holds something no frontend reads: a lone surrogate, a number or a run of signs too long."""


def max_number_digits(language: str) -> int:
    """The most digits one number may have in text of this routing code ("auto": every frontend)."""
    reached = _ROUTES.get(language, tuple(MAX_NUMBER_DIGITS))
    return min(MAX_NUMBER_DIGITS[lang] for lang in reached)


def _head(text: str) -> str:
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def long_number(text: str, limit: int) -> tuple[str, int] | None:
    """(the number as written, its digit count) of the first number in ``text`` with more than ``limit``
    digits, or None."""
    for m in _NUMBER_RE.finditer(text):
        number = m.group(0).rstrip(",")
        digits = len(number) - number.count(",")
        if digits > limit:
            return number, digits
    return None


def long_numeric_run(text: str, limit: int = MAX_NUMERIC_RUN) -> str | None:
    """The first run of digits and signs (``1.2.3.4``...) longer than ``limit`` characters, or None."""
    for m in _RUN_RE.finditer(text):
        if len(m.group(0)) > limit and any(c.isdecimal() for c in m.group(0)):
            return m.group(0)
    return None


def check_user_text(text: str, language: str, field: str = "text") -> None:
    """Refuse (TextError naming ``field``) a lone surrogate or a number too long for ``language``'s frontends."""
    bad = _SURROGATE_RE.search(text)
    if bad is not None:
        code = ord(bad.group(0))
        raise TextLimitError(f"{field}: holds a lone surrogate (U+{code:04X}) at character {bad.start() + 1}, "
                             "which is not valid Unicode text; send the text as valid UTF-8", field=field)
    limit = max_number_digits(language)
    found = long_number(text, limit)
    if found is not None:
        number, digits = found
        raise TextLimitError(f"{field}: the number {_head(number)} has {digits} digits; at most {limit} can be "
                             "read as one number in this language: write it in words, or separate the digits "
                             "with spaces", field=field)
    run = long_numeric_run(text)
    if run is not None:
        raise TextLimitError(f"{field}: the run of numbers and signs {_head(run)} is {len(run)} characters "
                             f"long; at most {MAX_NUMERIC_RUN} are read as one expression: separate its parts with "
                             "spaces", field=field)
