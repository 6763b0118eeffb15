"""Cantonese frontend: Chinese text normalisation + Jyutping -> ``Y``-prefixed phones (official v2 ``cantonese.py``).

Responsibilities: normalise with the Mandarin ``TextNormalizer`` followed by the Cantonese punctuation
map (no consecutive-punctuation collapse, unlike Mandarin), read each character's Jyutping with
ToJyutping, split every syllable into an initial and a toned final by the official first-match rule
over ``INITIALS`` (list order matters), and prefix ``Y`` to keep Cantonese phones apart from Mandarin
ones. ``word2ph`` is 2 per syllable and 1 per punctuation mark.
"""

from __future__ import annotations

import re
from functools import lru_cache

from engine.data import load_json
from engine.errors import TextError

__all__ = ["normalize", "g2p", "jyutping_to_phones", "replace_punctuation"]

_CONSTANTS = "GPT_SoVITS/text/cantonese.py::"
_PUNCT = ("!", "?", "…", ",", ".", "-")  # official `text.symbols.punctuation`
_PUNCT_SET = frozenset(_PUNCT)
_KEEP_RE = re.compile(r"[^\u4e00-\u9fa5" + "".join(_PUNCT) + r"]+")
_ALL_PUNCT_RE = re.compile(r"^[{}]+$".format(re.escape("".join(_PUNCT))))
_JYUTPING_RE = re.compile(r"^([a-z]+[1-6]+[ ]?)+$")
# The official code appends these pseudo-initials after the table's list.
_EXTRA_INITIALS = ("sp", "spl", "spn", "sil")


@lru_cache(maxsize=1)
def _tables() -> tuple[re.Pattern, dict[str, str], tuple[str, ...]]:
    c = load_json("frontend_constants.json")
    rep_map = dict(c[_CONSTANTS + "rep_map"])
    pattern = re.compile("|".join(re.escape(k) for k in rep_map))
    initials = tuple(c[_CONSTANTS + "INITIALS"]) + _EXTRA_INITIALS
    return pattern, rep_map, initials


def replace_punctuation(text: str) -> str:
    """Map quotes/brackets/dashes to ``' -`` etc., then keep only CJK and ``! ? … , . -``."""
    pattern, rep_map, _ = _tables()
    text = pattern.sub(lambda m: rep_map[m.group()], text)
    return _KEEP_RE.sub("", text)


def normalize(text: str) -> str:
    """Cantonese ``norm_text``: each normalised Mandarin sentence with Cantonese punctuation, concatenated."""
    from engine.text.chinese.textnorm import TextNormalizer

    return "".join(replace_punctuation(s) for s in TextNormalizer().normalize(text))


def _jyutping(norm_text: str) -> list[str]:
    import ToJyutping

    out: list[str] = []
    for word, syllable in ToJyutping.get_jyutping_list(norm_text):
        if _ALL_PUNCT_RE.match(word):
            out.extend(ch for ch in re.split(r"([{}])".format(re.escape("".join(_PUNCT))), word) if ch)
        elif syllable is None or not _JYUTPING_RE.search(syllable):
            raise TextError(
                f"no Cantonese reading for {word!r}: Cantonese text must be normalised Chinese characters "
                "and ! ? … , . - (run normalize first)"
            )
        else:
            out.append(syllable)
    return out


def jyutping_to_phones(syllables: list[str]) -> tuple[list[str], list[int]]:
    """Jyutping syllables / marks -> (phones, word2ph), the official ``jyuping_to_initials_finals_tones``."""
    _, _, initials = _tables()
    units: list[tuple[str, int]] = []  # (initial or final or mark, tone); tone -1 initial, 0 mark/toneless
    word2ph: list[int] = []
    for syllable in syllables:
        if syllable in _PUNCT or syllable == "_":
            units.append((syllable, 0))
            word2ph.append(1)
            continue
        try:
            tone = int(syllable[-1])
            base = syllable[:-1]
        except ValueError:
            tone, base = 0, syllable
        for initial in initials:
            if base.startswith(initial):
                if base.startswith("nga"):
                    units += [(base[:2], -1), (base[2:] or base[-1], tone)]
                else:
                    units += [(initial, -1), (base[len(initial):] or initial[-1], tone)]
                word2ph.append(2)
                break
        else:
            raise TextError(f"Jyutping syllable {syllable!r} has no known initial")
    phones = []
    for unit, tone in units:
        ph = unit if tone in (-1, 0) else f"{unit}{tone}"
        phones.append(ph if ph in _PUNCT_SET else "Y" + ph)
    return phones, word2ph


def g2p(norm_text: str) -> tuple[list[str], list[int]]:
    """Phones (``Y``-prefixed initials and toned finals, marks as is) and word2ph (one entry per character)."""
    return jyutping_to_phones(_jyutping(norm_text))
