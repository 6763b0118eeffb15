"""Korean frontend: Hangul -> pronounced compatibility jamo, as the official v2 ``korean.py`` does.

Responsibilities: spell Latin letters as Hangul letter names, run the g2pk2 pronunciation rules (with
python-mecab-ko for POS tags), split syllables into jamo with compound vowels divided, and map every
character to a v2 symbol (space -> 空, anything unknown -> 停). There is no normalisation step: the
official ``norm_text`` is the input text.

g2pk2's package import checks NLTK's cmudict and calls ``nltk.download`` when it is missing; we import
it with that call disabled (the dictionary only serves Latin words, which never reach g2pk2 here because
they are spelled as Hangul first) and never construct ``g2pk2.G2p``, which would read the missing corpus.
"""

from __future__ import annotations

import importlib
import re
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from engine.data import load_json
from engine.errors import TextError

__all__ = ["normalize", "g2p", "KoreanG2p", "default_g2p"]

_CONSTANTS = "GPT_SoVITS/text/korean.py::"
_MARK_MAP = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ",", "...": "…", " ": "空"}
_TRAILING_JAMO_RE = re.compile(r"([\u3131-\u3163])$")
_IMPORT_LOCK = threading.Lock()


def normalize(text: str) -> str:
    """Korean ``norm_text``: the official frontend has no normalisation, so the text itself."""
    return text


@contextmanager
def _nltk_downloads_disabled():
    import nltk

    original = nltk.download
    nltk.download = lambda *args, **kwargs: False  # restored below; only g2pk2's import-time check sees it
    try:
        yield
    finally:
        nltk.download = original


def _import_g2pk2():
    """g2pk2's rule modules, imported without letting the package reach the network."""
    with _IMPORT_LOCK, _nltk_downloads_disabled():
        try:
            names = ("special", "regular", "utils", "english", "numerals")
            return {name: importlib.import_module(f"g2pk2.{name}") for name in names}
        except ImportError as e:
            raise TextError("Korean needs g2pk2 and python-mecab-ko: `pip install g2pk2 python-mecab-ko jamo`") from e


def _fix_g2pk2_error(text: str) -> str:
    # "ㅇㅡㄹ"/"ㄹㅡㄹ" + " " + "ㄹ" -> ... + " " + "ㄴ" (the official fix_g2pk2_error)
    out = []
    i = 0
    while i < len(text) - 4:
        if text[i : i + 3] in ("ㅇㅡㄹ", "ㄹㅡㄹ") and text[i + 3] == " " and text[i + 4] == "ㄹ":
            out.append(text[i : i + 3] + " ㄴ")
            i += 5
        else:
            out.append(text[i])
            i += 1
    out.append(text[i:])
    return "".join(out)


class KoreanG2p:
    """Owns the MeCab tagger and g2pk2's rule tables; ``__call__(text) -> phones``."""

    def __init__(self):
        self._g2pk2 = _import_g2pk2()
        try:
            import mecab
            from jamo import h2j, j2hcj
        except ImportError as e:
            raise TextError("Korean needs python-mecab-ko and jamo: `pip install python-mecab-ko jamo`") from e
        self._h2j, self._j2hcj = h2j, j2hcj
        self._lock = threading.Lock()  # MeCab objects are not re-entrant
        self._mecab = mecab.MeCab()
        utils = self._g2pk2["utils"]
        self._table = utils.parse_table()
        idioms_path = Path(utils.__file__).with_name("idioms.txt")
        self._idioms = []
        for line in idioms_path.read_text(encoding="utf-8").splitlines():
            line = line.split("#")[0].strip()
            if "===" in line:
                pattern, replacement = line.split("===")
                self._idioms.append((pattern, replacement))
        constants = load_json("frontend_constants.json")
        self._latin = [
            (re.compile(letter, re.IGNORECASE), name)
            for letter, name in constants[_CONSTANTS + "_latin_to_hangul (regex,replacement) pairs"]
        ]
        self._divided = constants[_CONSTANTS + "_hangul_divided (regex,replacement) pairs"]
        from engine.text.symbols import symbols

        self._symbols = frozenset(symbols("v2"))

    def pronounce(self, text: str) -> str:
        """g2pk2's ``G2p.__call__`` (default options) with an empty English dictionary."""
        g = self._g2pk2
        for pattern, replacement in self._idioms:
            text = re.sub(pattern, replacement, text)
        text = g["english"].convert_eng(text, {})
        with self._lock:
            text = g["utils"].annotate(text, self._mecab)
        text = g["numerals"].convert_num(text)
        inp = self._h2j(text)
        special = g["special"]
        for rule in (
            special.jyeo, special.ye, special.consonant_ui, special.josa_ui, special.vowel_ui, special.jamo,
            special.rieulgiyeok, special.rieulbieub, special.verb_nieun, special.balb, special.palatalize,
            special.modifying_rieul,
        ):
            inp = rule(inp, False, False)
        inp = re.sub("/[PJEB]", "", inp)
        for pattern, replacement, _ in self._table:
            inp = re.sub(pattern, replacement, inp)
        regular = g["regular"]
        for rule in (regular.link1, regular.link2, regular.link3, regular.link4):
            inp = rule(inp, False, False)
        return g["utils"].compose(inp)

    def __call__(self, text: str) -> list[str]:
        for regex, name in self._latin:
            text = regex.sub(name, text)
        text = self.pronounce(text)
        text = self._j2hcj(self._h2j(text))
        for compound, parts in self._divided:
            text = text.replace(compound, parts)
        text = _fix_g2pk2_error(text)
        text = _TRAILING_JAMO_RE.sub(r"\1.", text)
        phones = []
        for ch in text:
            ph = _MARK_MAP.get(ch, ch)
            phones.append(ph if ph in self._symbols else "停")
        return phones


_DEFAULT_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _default_g2p() -> KoreanG2p:
    return KoreanG2p()


def default_g2p() -> KoreanG2p:
    """The shared Korean g2p (built on first use)."""
    with _DEFAULT_LOCK:
        return _default_g2p()


def g2p(norm_text: str) -> tuple[list[str], None]:
    """Phones (compatibility jamo, 空 for spaces, 停 for anything unknown) and ``None`` for word2ph."""
    return default_g2p()(norm_text), None
