"""Mandarin tone sandhi on pypinyin finals: 不 / 一 sandhi, neutral tones, third-tone sandhi, and the word
merges done before it (the official `ToneSandhi`, itself from PaddleSpeech).

Finals are TONE3 strings with the tone digit last ("ao3", "i5"). Every rule returns a new list; callers'
lists are never changed in place.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Iterable, Sequence

from pypinyin import Style, lazy_pinyin

from engine.data import load_json

_SANDHI = "GPT_SoVITS/text/tone_sandhi.py::ToneSandhi.__init__.self."

Word = tuple[str, str]  # (word, jieba POS tag)


@lru_cache(maxsize=1)
def _word_lists() -> tuple[frozenset[str], frozenset[str], str]:
    c = load_json("frontend_constants.json")
    return (
        frozenset(c[_SANDHI + "must_neural_tone_words"]),
        frozenset(c[_SANDHI + "must_not_neural_tone_words"]),
        c[_SANDHI + "punc"],
    )


@lru_cache(maxsize=8192)
def _pinyin(word: str, style: Style) -> tuple[str, ...]:
    # pypinyin's reading of a word depends only on the word: memoised, bounded
    return tuple(lazy_pinyin(word, neutral_tone_with_five=True, style=style))


def initials_and_finals(word: str) -> tuple[list[str], list[str]]:
    """pypinyin initials (strict) and TONE3 finals (neutral tone 5) of a word."""
    return list(_pinyin(word, Style.INITIALS)), list(_pinyin(word, Style.FINALS_TONE3))


def _finals_tone3(word: str) -> list[str]:
    return list(_pinyin(word, Style.FINALS_TONE3))


def _set_tone(final: str, tone: str) -> str:
    return final[:-1] + tone


def _all_tone_three(finals: Iterable[str]) -> bool:
    # raises IndexError on an empty final, exactly where the official code does (the merges catch it)
    return all(f[-1] == "3" for f in finals)


def _unless_index_error(step: Callable[[list[Word]], list[Word]], words: list[Word]) -> list[Word]:
    try:
        return step(words)
    except IndexError:  # an empty final (a syllabic nasal...): the official code skips the step too
        return words


def _is_reduplication(word: str) -> bool:
    return len(word) == 2 and word[0] == word[1]


class ToneSandhi:
    """Applies the official sandhi rules. `search_cut(word)` is jieba's cut_for_search for the same dictionary."""

    def __init__(self, search_cut: Callable[[str], Iterable[str]]):
        self._search_cut = search_cut

    # ---- word merges before sandhi (pre_merge_for_modify) ---------------------------------------------------

    def pre_merge_for_modify(self, seg: Sequence[Word]) -> list[Word]:
        """Merge 不 / 一 with neighbours, reduplications, runs of third tones and 儿, as the official code does.
        A merge step that fails on odd input (an empty final) leaves the segmentation as it was, like the
        official try/except."""
        words = self._merge_bu([tuple(w) for w in seg])
        words = _unless_index_error(self._merge_yi, words)
        words = self._merge_reduplication(words)
        words = _unless_index_error(self._merge_three_tones, words)
        words = _unless_index_error(self._merge_three_tones_boundary, words)
        return self._merge_er(words)

    @staticmethod
    def _merge_bu(seg: list[Word]) -> list[Word]:
        out: list[Word] = []
        last = ""
        for word, pos in seg:
            if last == "不":
                word = last + word
            if word != "不":
                out.append((word, pos))
            last = word
        if last == "不":
            out.append((last, "d"))
        return out

    @staticmethod
    def _merge_yi(seg: list[Word]) -> list[Word]:
        # 1) "听 一 听" (verb, 一, same verb) -> "听一听"
        merged: list[list[str]] = []
        i = 0
        while i < len(seg):
            word, pos = seg[i]
            if i >= 1 and word == "一" and i + 1 < len(seg):
                prev = merged[-1] if merged else list(seg[i - 1])
                nxt = seg[i + 1]
                if prev[0] == nxt[0] and prev[1] == "v" and nxt[1] == "v":
                    merged[-1] = [prev[0] + "一" + nxt[0], prev[1]]
                    i += 2
                    continue
            merged.append([word, pos])
            i += 1
        # 2) a lone "一" absorbs the word after it
        out: list[list[str]] = []
        for word, pos in merged:
            if out and out[-1][0] == "一":
                out[-1][0] += word
            else:
                out.append([word, pos])
        return [(w, p) for w, p in out]

    @staticmethod
    def _merge_reduplication(seg: list[Word]) -> list[Word]:
        out: list[list[str]] = []
        for word, pos in seg:
            if out and word == out[-1][0]:
                out[-1][0] += word
            else:
                out.append([word, pos])
        return [(w, p) for w, p in out]

    @staticmethod
    def _merge_by(seg: list[Word], should_merge: Callable[[list[str], list[str]], bool]) -> list[Word]:
        finals = [_finals_tone3(w) for w, _ in seg]
        out: list[list[str]] = []
        merged_into_prev = [False] * len(seg)
        for i, (word, pos) in enumerate(seg):
            if i >= 1 and should_merge(finals[i - 1], finals[i]) and not merged_into_prev[i - 1]:
                prev_word = seg[i - 1][0]
                # a reduplication keeps its own word so it can take the neutral tone
                if not _is_reduplication(prev_word) and len(prev_word) + len(word) <= 3:
                    out[-1][0] += word
                    merged_into_prev[i] = True
                    continue
            out.append([word, pos])
        return [(w, p) for w, p in out]

    def _merge_three_tones(self, seg: list[Word]) -> list[Word]:
        return self._merge_by(seg, lambda a, b: _all_tone_three(a) and _all_tone_three(b))

    def _merge_three_tones_boundary(self, seg: list[Word]) -> list[Word]:
        return self._merge_by(seg, lambda a, b: a[-1][-1] == "3" and b[0][-1] == "3")

    @staticmethod
    def _merge_er(seg: list[Word]) -> list[Word]:
        out: list[list[str]] = []
        for i, (word, pos) in enumerate(seg):
            if i >= 1 and word == "儿" and seg[i - 1][0] != "#":
                out[-1][0] += word
            else:
                out.append([word, pos])
        return [(w, p) for w, p in out]

    # ---- per-word sandhi -------------------------------------------------------------------------------------

    def modified_tone(self, word: str, pos: str, finals: Sequence[str]) -> list[str]:
        """不 sandhi, 一 sandhi, neutral tones, then third-tone sandhi."""
        f = self._bu_sandhi(word, list(finals))
        f = self._yi_sandhi(word, f)
        f = self._neural_sandhi(word, pos, f)
        return self._three_sandhi(word, f)

    def split_word(self, word: str) -> list[str]:
        """Two sub-words: the shortest search-mode piece and the rest (official `_split_word`)."""
        pieces = sorted(self._search_cut(word), key=len)  # stable, like the official sorted()
        first = pieces[0]
        if word.find(first) == 0:
            return [first, word[len(first):]]
        return [word[: -len(first)], first]

    @staticmethod
    def _bu_sandhi(word: str, f: list[str]) -> list[str]:
        if len(word) == 3 and word[1] == "不":  # 看不懂
            f[1] = _set_tone(f[1], "5")
            return f
        for i, ch in enumerate(word):
            if ch == "不" and i + 1 < len(word) and f[i + 1][-1] == "4":  # 不怕 -> bu2
                f[i] = _set_tone(f[i], "2")
        return f

    def _yi_sandhi(self, word: str, f: list[str]) -> list[str]:
        punc = _word_lists()[2]
        if "一" in word and all(ch.isnumeric() for ch in word if ch != "一"):
            return f  # a digit string such as 一零零
        if len(word) == 3 and word[1] == "一" and word[0] == word[-1]:  # 看一看
            f[1] = _set_tone(f[1], "5")
        elif word.startswith("第一"):
            f[1] = _set_tone(f[1], "1")
        else:
            for i, ch in enumerate(word):
                if ch == "一" and i + 1 < len(word):
                    if f[i + 1][-1] == "4":
                        f[i] = _set_tone(f[i], "2")  # 一段
                    elif word[i + 1] not in punc:
                        f[i] = _set_tone(f[i], "4")  # 一天; before punctuation it stays yi1
        return f

    def _neural_sandhi(self, word: str, pos: str, f: list[str]) -> list[str]:
        must, must_not, _ = _word_lists()
        for j in range(1, len(word)):  # reduplicated nouns / verbs / adjectives: 奶奶, 试试
            if word[j] == word[j - 1] and pos[0] in "nva" and word not in must_not:
                f[j] = _set_tone(f[j], "5")
        ge = word.find("个")
        last = word[-1] if word else ""
        if last and last in "吧呢哈啊呐噻嘛吖嗨呐哦哒额滴哩哟喽啰耶喔诶":
            f[-1] = _set_tone(f[-1], "5")
        elif last and last in "的地得":
            f[-1] = _set_tone(f[-1], "5")
        elif len(word) == 1 and word in "了着过" and pos in {"ul", "uz", "ug"}:
            f[-1] = _set_tone(f[-1], "5")
        elif len(word) > 1 and last in "们子" and pos in {"r", "n"} and word not in must_not:
            f[-1] = _set_tone(f[-1], "5")
        elif len(word) > 1 and last in "上下里" and pos in {"s", "l", "f"}:  # 桌上, 家里
            f[-1] = _set_tone(f[-1], "5")
        elif len(word) > 1 and last in "来去" and word[-2] in "上下进出回过起开":  # 上来, 下去
            f[-1] = _set_tone(f[-1], "5")
        elif (ge >= 1 and (word[ge - 1].isnumeric() or word[ge - 1] in "几有两半多各整每做是")) or word == "个":
            f[ge] = _set_tone(f[ge], "5")  # 个 as a measure word
        elif word in must or word[-2:] in must:
            f[-1] = _set_tone(f[-1], "5")

        parts = self.split_word(word)
        halves = [f[: len(parts[0])], f[len(parts[0]):]]
        for i, part in enumerate(parts):
            if part in must or part[-2:] in must:
                halves[i][-1] = _set_tone(halves[i][-1], "5")
        return halves[0] + halves[1]

    def _three_sandhi(self, word: str, f: list[str]) -> list[str]:
        if len(word) == 2 and _all_tone_three(f):
            f[0] = _set_tone(f[0], "2")
        elif len(word) == 3:
            parts = self.split_word(word)
            if _all_tone_three(f):
                if len(parts[0]) == 2:  # 蒙古/包
                    f[0] = _set_tone(f[0], "2")
                    f[1] = _set_tone(f[1], "2")
                elif len(parts[0]) == 1:  # 纸/老虎
                    f[1] = _set_tone(f[1], "2")
            else:
                halves = [f[: len(parts[0])], f[len(parts[0]):]]
                for i, sub in enumerate(halves):
                    if _all_tone_three(sub) and len(sub) == 2:  # 所有/人
                        sub[0] = _set_tone(sub[0], "2")
                    elif i == 1 and not _all_tone_three(sub) and sub[0][-1] == "3" and halves[0][-1][-1] == "3":
                        halves[0][-1] = _set_tone(halves[0][-1], "2")  # 好/喜欢
                    f = halves[0] + halves[1]
        elif len(word) == 4:  # idioms: two halves of two
            halves = [f[:2], f[2:]]
            f = []
            for sub in halves:
                if _all_tone_three(sub):
                    sub[0] = _set_tone(sub[0], "2")
                f += sub
        return f
