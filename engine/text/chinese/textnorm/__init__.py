"""Mandarin text normalisation (numbers, dates, times, units, currency, percentages, phone numbers, ranges).

`TextNormalizer().normalize(text)` returns the list of normalised sentences exactly as the official
`zh_normalization.TextNormalizer` (a PaddleSpeech port) does; the Chinese and Cantonese frontends both build on it.
"""

from __future__ import annotations

import re
import string
from functools import lru_cache
from types import MappingProxyType
from typing import Mapping

from engine.data import load_json

from . import chronology, numbers, phonecode, units

_CONSTANTS_FILE = "GPT_SoVITS/text/zh_normalization/text_normlization.py::"

# full-width Latin letters and digits -> ASCII (U+FF21.. = ord + 65248). The official table for the ideographic
# space is a str-keyed dict, which str.translate ignores, so U+3000 is deliberately NOT converted here.
_FULLWIDTH_TO_ASCII = {ord(c) + 65248: ord(c) for c in string.ascii_letters + string.digits}


@lru_cache(maxsize=1)
def traditional_to_simplified_map() -> Mapping[int, str]:
    """The official character-level traditional -> simplified table, as a str.translate mapping."""
    table = load_json("zh_traditional_to_simplified.json")["map"]
    return MappingProxyType({ord(t): s for t, s in table.items()})


def to_simplified(text: str) -> str:
    """Character-by-character traditional -> simplified conversion (no phrase-level conversion)."""
    return text.translate(traditional_to_simplified_map())


@lru_cache(maxsize=1)
def _patterns() -> tuple[re.Pattern, re.Pattern, re.Pattern, tuple[tuple[str, str], ...]]:
    c = load_json("frontend_constants.json")
    splitter = re.compile(c[_CONSTANTS_FILE + "TextNormalizer SENTENCE_SPLITOR regex"])
    split_filter = re.compile(c[_CONSTANTS_FILE + "_split special-char filter regex (zh only)"])
    post_filter = re.compile(c[_CONSTANTS_FILE + "_post_replace final filter regex"])
    post_pairs = tuple(
        tuple(p)
        for p in c[
            _CONSTANTS_FILE + "TextNormalizer._post_replace str.replace pairs "
            "(applied in this order, before the final special-character re.sub)"
        ]
    )
    return splitter, split_filter, post_filter, post_pairs


class TextNormalizer:
    """Mandarin sentence splitter and normaliser (stateless; cheap to construct)."""

    def split(self, text: str) -> list[str]:
        """Drop spaces and bracket/quote characters, then cut after each sentence-ending mark."""
        splitter, split_filter, _, _ = _patterns()
        text = text.replace(" ", "")
        text = split_filter.sub("", text)
        text = splitter.sub(r"\1\n", text).strip()
        return [s.strip() for s in re.split(r"\n+", text)]

    def normalize_sentence(self, sentence: str) -> str:
        """Verbalise every number-like span of one sentence, in the official order."""
        s = to_simplified(sentence).translate(_FULLWIDTH_TO_ASCII)
        s = chronology.RE_DATE.sub(chronology.replace_date, s)
        s = chronology.RE_DATE2.sub(chronology.replace_date2, s)
        s = chronology.RE_TIME_RANGE.sub(chronology.replace_time, s)  # ranges before single times
        s = chronology.RE_TIME.sub(chronology.replace_time, s)
        s = numbers.RE_TO_RANGE.sub(numbers.replace_to_range, s)
        s = units.RE_TEMPERATURE.sub(units.replace_temperature, s)
        s = units.replace_measure(s)
        while numbers.RE_ASMD.search(s):
            s = numbers.RE_ASMD.sub(numbers.replace_asmd, s)
        s = numbers.RE_POWER.sub(numbers.replace_power, s)
        s = numbers.RE_FRAC.sub(numbers.replace_frac, s)
        s = numbers.RE_PERCENTAGE.sub(numbers.replace_percentage, s)
        s = phonecode.RE_MOBILE_PHONE.sub(phonecode.replace_mobile, s)
        s = phonecode.RE_TELEPHONE.sub(phonecode.replace_phone, s)
        s = phonecode.RE_NATIONAL_UNIFORM_NUMBER.sub(phonecode.replace_phone, s)
        s = numbers.RE_RANGE.sub(numbers.replace_range, s)
        s = numbers.RE_NEGATIVE_INTEGER.sub(numbers.replace_negative_num, s)
        s = numbers.RE_VERSION_NUM.sub(numbers.replace_version_num, s)
        s = numbers.RE_DECIMAL_NUM.sub(numbers.replace_number, s)
        s = numbers.RE_POSITIVE_QUANTIFIERS.sub(numbers.replace_positive_quantifier, s)
        s = numbers.RE_DEFAULT_NUM.sub(numbers.replace_default_num, s)
        s = numbers.RE_NUMBER.sub(numbers.replace_number, s)
        return self._post_replace(s)

    def _post_replace(self, sentence: str) -> str:
        _, _, post_filter, post_pairs = _patterns()
        for old, new in post_pairs:
            sentence = sentence.replace(old, new)
        return post_filter.sub("", sentence)

    def normalize(self, text: str) -> list[str]:
        """Text -> normalised sentences (still with their punctuation)."""
        return [self.normalize_sentence(s) for s in self.split(text)]


__all__ = ["TextNormalizer", "to_simplified"]
