"""Does the chosen language read the text? A cheap check made before synthesis.

Each frontend reads only some scripts: the English one reads Latin letters, the Chinese one Han
characters, and so on. Chinese text sent as ``en`` leaves only punctuation to say, and the model
then makes a few seconds of noise. :func:`check_text_language` counts the letters that the chosen
language reads (digits and punctuation are neither counted nor held against it) and, when that share
is small, names the language the text looks like. Callers decide whether to warn or refuse.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from dataclasses import dataclass

MIN_READABLE = 0.2  # below this share of letters read, the language choice is probably wrong

# script -> the language code to suggest for text written mostly in it
SUGGESTION = {"han": "all_zh", "kana": "all_ja", "hangul": "all_ko", "latin": "en"}
# language code -> the scripts its frontend turns into phones (the mixed codes also read English words)
READS = {
    "en": {"latin"},
    "all_zh": {"han"}, "zh": {"han", "latin"},
    "all_yue": {"han"}, "yue": {"han", "latin"},
    "all_ja": {"han", "kana", "latin"}, "ja": {"han", "kana", "latin"},  # OpenJTalk spells Latin letters
    "all_ko": {"hangul", "latin"}, "ko": {"hangul", "latin"},  # g2pk reads English words in Hangul
}


@dataclass(frozen=True)
class LanguageCheck:
    """The outcome: ``readable`` is the share of letters the language reads (1.0 when there are none)."""

    language: str
    readable: float
    looks_like: str | None  # the language code the text looks like, when it is not the chosen one

    @property
    def mismatch(self) -> bool:
        return self.looks_like is not None

    def message(self) -> str:
        """One ASCII line (fit for an HTTP header), empty when the language reads the text."""
        if not self.mismatch:
            return ""
        return (f"text_lang={self.language} reads {self.readable:.0%} of the letters of the text; "
                f"it looks like {self.looks_like}")


def script_of(char: str) -> str | None:
    """"han" | "kana" | "hangul" | "latin" | "other" for a letter; None for anything else."""
    if not char.isalpha():
        return None
    code = ord(char)
    if 0x3040 <= code <= 0x30FF or 0x31F0 <= code <= 0x31FF or 0xFF66 <= code <= 0xFF9D:
        return "kana"
    if 0xAC00 <= code <= 0xD7A3 or 0x1100 <= code <= 0x11FF or 0x3130 <= code <= 0x318F:
        return "hangul"
    if 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0xF900 <= code <= 0xFAFF or 0x20000 <= code <= 0x2FA1F:
        return "han"
    if unicodedata.name(char, "").startswith(("LATIN", "FULLWIDTH LATIN")):
        return "latin"
    return "other"


def check_text_language(text: str, language: str, min_readable: float = MIN_READABLE) -> LanguageCheck:
    """How much of ``text`` the frontend of ``language`` reads; auto-detecting codes read everything."""
    scripts = Counter(s for s in map(script_of, text) if s is not None)
    letters = sum(scripts.values())
    reads = READS.get(language)
    if reads is None or letters == 0:  # auto, auto_yue, unknown codes (validated elsewhere), no letters
        return LanguageCheck(language, 1.0, None)
    readable = sum(n for s, n in scripts.items() if s in reads) / letters
    if readable >= min_readable:
        return LanguageCheck(language, readable, None)
    dominant = max((s for s in scripts if s in SUGGESTION), key=lambda s: scripts[s], default=None)
    if dominant == "han" and scripts.get("kana"):  # Japanese mixes kanji and kana
        dominant = "kana"
    return LanguageCheck(language, readable, SUGGESTION.get(dominant, "auto"))
