"""Sentence splitting of the target text: the official `cut0`..`cut5` methods, the long-sentence splitter and
`TextPreprocessor.pre_seg_text` (official `GPT_SoVITS/TTS_infer_pack/text_segmentation_method.py` and
`TextPreprocessor.py`). Pure functions on strings.

Where the official code crashes (IndexError on empty pieces), these functions return an empty result instead;
`pre_seg_text` raises TextError when nothing speakable is left.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable

from engine.data import load_json
from engine.errors import OptionsError, TextError
from engine.text.chinese.punctuation import replace_consecutive_punctuation

_SEG = "GPT_SoVITS/TTS_infer_pack/text_segmentation_method.py::"

MAX_SENTENCE_CHARS = 510  # BERT's limit; longer sentences are split by `split_big_text`
MIN_CHUNK_CHARS = 5  # pre_seg_text merges shorter chunks into their neighbours


@lru_cache(maxsize=1)
def _constants() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    c = load_json("frontend_constants.json")
    splits = frozenset(c[_SEG + "splits"])
    punds = frozenset(c[_SEG + "cut5.punds"])
    only_punct = frozenset(c[_SEG + "punctuation (set; 'is this chunk only punctuation' test in cut0..cut4)"])
    return splits, punds, only_punct


def splits() -> frozenset[str]:
    """The sentence-ending marks: ， 。 ？ ！ , . ? ! ~ : ： — …"""
    return _constants()[0]


def _only_punctuation(s: str) -> bool:
    # also true for "" (empty pieces are dropped, as in the official set-subset test)
    return set(s) <= _constants()[2]


def split(text: str) -> list[str]:
    """Sentences, each keeping its closing mark ("……" -> "。", "——" -> "，"; a final "。" is added if missing)."""
    text = text.replace("……", "。").replace("——", "，")
    if not text:
        return []
    if text[-1] not in splits():
        text += "。"
    out, start = [], 0
    for i, ch in enumerate(text):
        if ch in splits():
            out.append(text[start : i + 1])
            start = i + 1
    return out


def cut0(text: str) -> str:
    """No split ("不切"); a text of only punctuation becomes a newline."""
    return "\n" if _only_punctuation(text) else text


def cut1(text: str) -> str:
    """Four sentences per chunk ("凑四句一切"); the last chunk takes the remainder (5 to 8 sentences)."""
    text = text.strip("\n")
    sentences = split(text)
    starts: list[int | None] = list(range(0, len(sentences), 4))
    if len(starts) > 1:
        starts[-1] = None
        chunks = ["".join(sentences[a:b]) for a, b in zip(starts[:-1], starts[1:])]
    else:
        chunks = [text]
    return "\n".join(c for c in chunks if not _only_punctuation(c))


def cut2(text: str, max_chars: int = 50) -> str:
    """About 50 characters per chunk ("凑50字一切"): a chunk closes once it exceeds 50 characters; a short last
    chunk joins the previous one."""
    text = text.strip("\n")
    sentences = split(text)
    if len(sentences) < 2:
        return text
    chunks, buf = [], ""
    for s in sentences:
        buf += s
        if len(buf) > max_chars:
            chunks.append(buf)
            buf = ""
    if buf:
        chunks.append(buf)
    if len(chunks) > 1 and len(chunks[-1]) < max_chars:
        chunks[-2:] = [chunks[-2] + chunks[-1]]
    return "\n".join(c for c in chunks if not _only_punctuation(c))


def cut3(text: str) -> str:
    """Split at "。" ("按中文句号。切"), dropping the marks."""
    pieces = text.strip("\n").strip("。").split("。")
    return "\n".join(p for p in pieces if not _only_punctuation(p))


def cut4(text: str) -> str:
    """Split at "." not between digits ("按英文句号.切"), dropping the dots."""
    pieces = re.split(r"(?<!\d)\.(?!\d)", text.strip("\n").strip("."))
    return "\n".join(p for p in pieces if not _only_punctuation(p))


def cut5(text: str) -> str:
    """Split after every punctuation mark ("按标点符号切"), except a "." between two digits (3.14)."""
    text = text.strip("\n")
    punds = _constants()[1]
    items, buf = [], []
    for i, ch in enumerate(text):
        buf.append(ch)
        if ch in punds:
            decimal_point = ch == "." and 0 < i < len(text) - 1 and text[i - 1].isdigit() and text[i + 1].isdigit()
            if not decimal_point:
                items.append("".join(buf))
                buf = []
    if buf:
        items.append("".join(buf))
    return "\n".join(it for it in items if not set(it) <= punds)


METHODS: dict[str, Callable[[str], str]] = {
    "cut0": cut0, "cut1": cut1, "cut2": cut2, "cut3": cut3, "cut4": cut4, "cut5": cut5,
}


def get_method(name: str) -> Callable[[str], str]:
    """A split method by its official name (OptionsError lists the valid ones)."""
    method = METHODS.get(name)
    if method is None:
        raise OptionsError(f"unknown text split method {name!r}; use one of {', '.join(METHODS)}")
    return method


def split_big_text(text: str, max_len: int = MAX_SENTENCE_CHARS) -> list[str]:
    """Cut a too-long sentence at its marks and greedily re-join pieces up to ``max_len`` characters.
    (A single piece longer than ``max_len`` stays whole, as in the official code.)"""
    pieces = re.split("([" + re.escape("".join(sorted(splits()))) + "])", text)
    out, cur = [], ""
    for piece in pieces:
        if len(cur + piece) > max_len:
            out.append(cur)
            cur = piece
        else:
            cur += piece
    if cur:
        out.append(cur)
    return out


def merge_short_text_in_array(texts: list[str], threshold: int) -> list[str]:
    """Concatenate neighbours until each chunk has at least ``threshold`` characters; a short remainder joins
    the last chunk."""
    if len(texts) < 2:
        return list(texts)
    out, buf = [], ""
    for t in texts:
        buf += t
        if len(buf) >= threshold:
            out.append(buf)
            buf = ""
    if buf:
        if out:
            out[-1] += buf
        else:
            out.append(buf)
    return out


@lru_cache(maxsize=1)
def _clause_end() -> re.Pattern:
    """The official split marks as one character class, compiled once: kept here, not in ``re``'s own cache,
    which the warm-up's many patterns overflow (the first request would compile it again)."""
    return re.compile("[" + re.escape("".join(sorted(splits()))) + "]")


_NON_WORD = re.compile(r"\W+")


def _first_clause(text: str) -> str:
    return _clause_end().split(text)[0].strip()


def pre_seg_text(text: str, lang: str, method: str) -> list[str]:
    """The official `TextPreprocessor.pre_seg_text`: sentences ready for `get_phones_and_bert`.

    Raises TextError when the text holds nothing but blanks/newlines (the official "请输入有效文本")."""
    split_fn = get_method(method)
    stop = "." if lang == "en" else "。"
    text = text.strip("\n")
    if not text:
        return []
    if text[0] not in splits() and len(_first_clause(text)) < 4:
        text = stop + text  # a very short first clause gets a leading pause mark
    text = split_fn(text)
    while "\n\n" in text:
        text = text.replace("\n\n", "\n")
    items = text.split("\n")
    if all(t in (" ", "\n", "") for t in items):
        raise TextError("the text has nothing to say: enter some words")
    items = merge_short_text_in_array([t for t in items if t not in (" ", "")], MIN_CHUNK_CHARS)
    out = []
    for t in items:
        if not t.strip() or not _NON_WORD.sub("", t):
            continue  # blank or symbols only
        if t[-1] not in splits():
            t += stop
        out.extend(split_big_text(t) if len(t) > MAX_SENTENCE_CHARS else [t])
    return out


def preprocess(text: str, lang: str, method: str) -> list[str]:
    """Target text -> sentences: collapse runs of marks, then `pre_seg_text` (non-streaming path of TTS.run)."""
    return pre_seg_text(replace_consecutive_punctuation(text), lang, method)


def prepare_prompt_text(text: str, lang: str) -> str:
    """The reference transcript as TTS.run prepares it: newlines stripped, closed with "。" ("." for en) unless it
    already ends with a sentence mark. It is not split. Raises TextError for an empty transcript (after stripping
    newlines), where the official code raises IndexError."""
    text = text.strip("\n")
    if not text:
        raise TextError("the reference transcript is empty: enter the words spoken in the reference clip")
    return text if text[-1] in splits() else text + ("." if lang == "en" else "。")
