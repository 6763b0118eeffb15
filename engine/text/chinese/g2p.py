"""Mandarin grapheme-to-phoneme: jieba POS words -> pinyin (pypinyin, or G2PW when configured) -> tone sandhi
-> erhua (v2+) -> opencpop phones, one `word2ph` entry per character of the normalised text.

The two official variants: `text/chinese.py` (model v1: no erhua) and `text/chinese2.py` (v2 and later).
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

from pypinyin.contrib.tone_convert import to_finals_tone3, to_initials

from engine.data import load_json
from engine.errors import TextError
from engine.text.symbols import PUNCTUATION

from .tone_sandhi import ToneSandhi, initials_and_finals

if TYPE_CHECKING:
    from .g2pw import G2PWConverter

_C = "GPT_SoVITS/text/chinese2.py::"

# split after each g2p punctuation mark (and the spaces after it)
_SENTENCE_END = re.compile(r"(?<=[" + "".join(PUNCTUATION) + r"])\s*")
_LATIN = re.compile("[a-zA-Z]+")


@lru_cache(maxsize=1)
def _tables() -> dict:
    c = load_json("frontend_constants.json")
    return {
        "pinyin_to_phones": c["GPT_SoVITS/text/opencpop-strict.txt (pinyin -> 'initial final')"],
        "with_initial": c[_C + "_g2p.v_rep_map"],
        "whole_syllable": c[_C + "_g2p.pinyin_rep_map"],
        "first_letter": c[_C + "_g2p.single_rep_map"],
        "must_erhua": frozenset(c[_C + "must_erhua"]),
        "not_erhua": frozenset(c[_C + "not_erhua"]),
    }


def syllable_phones(initial: str, final: str) -> list[str]:
    """One (pypinyin initial, TONE3 final) pair -> ``[initial_phone, final_phone+tone]``, or ``[mark]``."""
    if initial == final:
        if initial not in PUNCTUATION:
            raise TextError(f"no Mandarin reading for {initial!r}; remove or replace this character")
        return [initial]
    t = _tables()
    body, tone = final[:-1], final[-1:]
    if tone not in ("1", "2", "3", "4", "5"):
        raise TextError(f"no toned Mandarin reading for {initial + final!r}; remove or replace this character")
    pinyin = initial + body
    if initial:
        if body in t["with_initial"]:
            pinyin = initial + t["with_initial"][body]  # uei -> ui, iou -> iu, uen -> un
    elif pinyin in t["whole_syllable"]:
        pinyin = t["whole_syllable"][pinyin]  # ing -> ying, i -> yi, in -> yin, u -> wu
    elif pinyin[:1] in t["first_letter"]:
        pinyin = t["first_letter"][pinyin[0]] + pinyin[1:]  # v -> yu, i -> y, u -> w
    phones = t["pinyin_to_phones"].get(pinyin)
    if phones is None:
        raise TextError(f"pinyin {pinyin!r} (from {initial + final!r}) has no phone mapping")
    new_initial, new_final = phones.split(" ")
    return [new_initial, new_final + tone]


def merge_erhua(initials: list[str], finals: list[str], word: str, pos: str) -> tuple[list[str], list[str]]:
    """Word-final 儿: er1 -> er2, then (outside the not-erhua lists) it takes the previous syllable's tone."""
    t = _tables()
    finals = list(finals)
    if finals and len(finals) <= len(word) and word[len(finals) - 1] == "儿" and finals[-1] == "er1":
        finals[-1] = "er2"
    if word not in t["must_erhua"] and (word in t["not_erhua"] or pos in {"a", "j", "nr"}):
        return initials, finals
    if len(finals) != len(word):
        return initials, finals
    if len(word) >= 2 and word[-1] == "儿" and finals[-1] in {"er2", "er5"} and word[-2:] not in t["not_erhua"]:
        finals[-1] = "er" + finals[-2][-1]
    return initials, finals


class ChineseG2P:
    """Mandarin g2p for one model generation (``erhua=True`` for v2+). Owns its jieba tokenizer (built lazily on
    first use, ~1 s) and an optional G2PW converter; safe to share between threads."""

    def __init__(self, erhua: bool = True, g2pw: "G2PWConverter | None" = None):
        self.erhua = erhua
        self.g2pw = g2pw
        self._lock = threading.Lock()
        self._jieba = None  # (Tokenizer, POSTokenizer), built on first use

    def _tokenizers(self):
        with self._lock:
            if self._jieba is None:
                import jieba
                import jieba.posseg

                tok = jieba.Tokenizer()
                self._jieba = (tok, jieba.posseg.POSTokenizer(tok))
            return self._jieba

    def pos_cut(self, text: str) -> list[tuple[str, str]]:
        """jieba POS segmentation (HMM on), as ``[(word, tag), ...]``."""
        return [(p.word, p.flag) for p in self._tokenizers()[1].lcut(text)]

    def search_cut(self, word: str) -> list[str]:
        return list(self._tokenizers()[0].cut_for_search(word))

    def __call__(self, norm_text: str) -> tuple[list[str], list[int]]:
        """Normalised text -> (phones, word2ph) with ``len(word2ph) == len(norm_text)``."""
        sentences = [_LATIN.sub("", s) for s in _SENTENCE_END.split(norm_text) if s.strip()]
        sandhi = ToneSandhi(self.search_cut)
        readings = self.g2pw.predict([s for s in sentences if s]) if self.g2pw is not None else None
        phones: list[str] = []
        word2ph: list[int] = []
        cursor = 0
        for sentence in sentences:
            pinyins = None
            if readings is not None and sentence:
                pinyins, cursor = readings[cursor], cursor + 1
            for initial, final in self._sentence_syllables(sentence, sandhi, pinyins):
                ph = syllable_phones(initial, final)
                phones += ph
                word2ph.append(len(ph))
        return phones, word2ph

    def _sentence_syllables(self, sentence: str, sandhi: ToneSandhi, pinyins: Sequence[str] | None):
        words = sandhi.pre_merge_for_modify(self.pos_cut(sentence))
        start = 0
        for word, pos in words:
            end = start + len(word)
            if pos == "eng":
                start = end
                continue
            if pinyins is None:
                initials, finals = initials_and_finals(word)
            else:
                initials, finals = _split_pinyins(self.g2pw.correct(word, pinyins[start:end]))
            start = end
            try:
                finals = sandhi.modified_tone(word, pos, finals)
                if self.erhua:
                    initials, finals = merge_erhua(initials, finals, word, pos)
            except IndexError as e:
                raise TextError(f"cannot read {word!r} in Mandarin (unusual characters?)") from e
            yield from zip(initials, finals)


def _split_pinyins(pinyins: Sequence[str]) -> tuple[list[str], list[str]]:
    initials, finals = [], []
    for p in pinyins:
        if not p:
            raise TextError("G2PW gave no reading for a character (its label has no pinyin mapping)")
        if p[:1].isalpha():
            initials.append(to_initials(p))
            finals.append(to_finals_tone3(p, neutral_tone_with_five=True))
        else:  # punctuation passes through as its own initial and final
            initials.append(p)
            finals.append(p)
    return initials, finals
