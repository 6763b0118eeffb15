"""Symbol tables, clean_text dispatch rules and language routing of the text frontend (official text/symbols2.py,
text/cleaner.py clean_text, TextPreprocessor.get_phones_and_bert)."""

from __future__ import annotations

import json
import types

import pytest

from engine.errors import ConfigError, TextError, UnsupportedLanguageError
from engine.text import cleaner, frontend, symbols
from engine.text.frontend import TextFrontend, languages, route
from engine.versions import VERSIONS
from tests.support.paths import conformance_root


def test_symbol_tables_match_official_sizes_and_order():
    v1, v2 = symbols.symbols("v1"), symbols.symbols("v2")
    assert len(v1) == 322 and len(v2) == 732
    assert v2[:322] == v1
    for version in (v for v in VERSIONS if v != "v1"):
        assert symbols.symbols(version) == v2
    fixture = conformance_root() / "text" / "text_frontend_v2.json"
    if fixture.is_file():
        assert list(v2) == json.loads(fixture.read_text(encoding="utf-8"))["symbols_v2"]


def test_useful_ids_from_spec():
    ids = symbols.symbol_to_id("v2")
    expected = {"!": 0, ",": 1, "-": 2, ".": 3, "?": 4, "SP": 77, "SP2": 78, "SP3": 79, "UNK": 86, "_": 95,
                "…": 321, "[": 322, "]": 323, "停": 351, "空": 352}
    assert {k: ids[k] for k in expected} == expected
    assert "[" not in symbols.symbol_to_id("v1")


def test_cleaned_text_to_sequence_and_inverse():
    phones = ["n", "i2", "h", "ao3", ","]
    ids = symbols.cleaned_text_to_sequence(phones, "v1")
    assert symbols.sequence_to_phones(ids, "v2") == phones  # v1 ids are a prefix of v2's
    with pytest.raises(TextError, match="not in the v1"):
        symbols.cleaned_text_to_sequence(["["], "v1")
    with pytest.raises(ConfigError, match="v5"):
        symbols.symbols("v5")
    with pytest.raises(TextError):
        symbols.sequence_to_phones([732], "v2")


@pytest.mark.parametrize("language,version", [("ko", "v1"), ("yue", "v1"), ("punctuation", "v2"), ("fr", "v2")])
def test_clean_text_unknown_language_reads_a_pause(language, version):
    # official: a language the version lacks is read by the English frontend on " " (then "," is prepended);
    # user-facing codes are rejected earlier by TextFrontend.check_language
    assert cleaner.clean_text("안녕 你好", language, version) == cleaner.clean_text(" ", "en", version)


def test_clean_text_unknown_phones_become_unk(monkeypatch):
    fake = types.SimpleNamespace(normalize=lambda t: t, g2p=lambda t: (["k", "#", "[", "a"], None))
    monkeypatch.setattr(cleaner, "language_module", lambda name: fake)
    assert cleaner.clean_text("x", "ja", "v2")[0] == ["k", "UNK", "[", "a"]
    assert cleaner.clean_text("x", "ja", "v1")[0] == ["k", "UNK", "UNK", "a"]


def test_clean_text_short_english_gets_leading_comma(monkeypatch):
    fake = types.SimpleNamespace(normalize=lambda t: t, g2p=lambda t: (["HH", "AY1"], None))
    monkeypatch.setattr(cleaner, "language_module", lambda name: fake)
    assert cleaner.clean_text("hi", "en", "v2") == ([",", "HH", "AY1"], None, "hi")


def test_clean_text_rejects_non_strings():
    with pytest.raises(TextError):
        cleaner.clean_text(None, "zh", "v2")


# ---- routing, with a stand-in segmenter ---------------------------------------------------------------------


@pytest.fixture
def segmenter(monkeypatch):
    """Replace LangSegmenter.getTexts by a recorded answer: {(text, default_lang): [(lang, text), ...]}."""
    answers: dict = {}
    calls: list = []

    def get_texts(text, default_lang):
        calls.append((text, default_lang))
        return answers[(text, default_lang)]

    monkeypatch.setattr(frontend, "_get_texts", get_texts)
    return types.SimpleNamespace(answers=answers, calls=calls)


def test_route_mixed_options_merge_english_and_non_english_runs(segmenter):
    segmenter.answers[("t", None)] = [("zh", "我"), ("ja", "の"), ("en", "App"), ("en", " ok"), ("zh", "好")]
    assert route("t", "zh") == [("zh", "我の"), ("en", "App ok"), ("zh", "好")]
    assert route("t", "ja") == [("ja", "我の"), ("en", "App ok"), ("ja", "好")]
    assert route("t", "auto") == segmenter.answers[("t", None)]
    assert route("t", "auto_yue") == [("yue", "我"), ("ja", "の"), ("en", "App"), ("en", " ok"), ("yue", "好")]


def test_route_all_options_pass_default_language(segmenter):
    segmenter.answers[("t", "zh")] = [("zh", "你好"), ("en", "App")]
    segmenter.answers[("t", "ja")] = [("ja", "こんにちは")]
    segmenter.answers[("t", "ko")] = [("ko", "안녕")]
    assert route("t", "all_zh") == [("zh", "你好"), ("en", "App")]
    assert route("t", "all_yue") == [("yue", "你好"), ("en", "App")]
    assert route("t", "all_ja") == [("ja", "こんにちは")]
    assert route("t", "all_ko") == [("ko", "안녕")]


def test_route_english_does_not_segment(segmenter):
    assert route("你好 hello", "en") == [("en", "你好 hello")]
    assert segmenter.calls == []


def test_segmenter_results_in_official_dict_shape(monkeypatch):
    fake = types.ModuleType("engine.text.langsegment")
    fake.get_texts = lambda text, default_lang=None: [{"lang": "zh", "text": text}]
    monkeypatch.setitem(__import__("sys").modules, "engine.text.langsegment", fake)
    assert route("你好", "all_zh") == [("zh", "你好")]


def test_phones_and_bert_retries_short_text_with_leading_dot(segmenter):
    segmenter.answers[("好", "zh")] = [("zh", "好")]
    segmenter.answers[(".好", "zh")] = [("zh", ".好")]
    out = TextFrontend("v2").phones_and_bert("好", "all_zh")
    assert [c[0] for c in segmenter.calls] == ["好", ".好"]
    assert out.segments[0].text == ".好" and out.phones[0] == "."
    assert out.norm_text == ".好" and out.word2ph == (1, 2)


def test_phones_and_bert_collapses_double_spaces(segmenter):
    segmenter.answers[("今天 天气 很好呀。", "zh")] = [("zh", "今天 天气 很好呀。")]
    out = TextFrontend("v2").phones_and_bert("今天   天气  很好呀。", "all_zh")
    assert segmenter.calls == [("今天 天气 很好呀。", "zh")]
    assert len(out.phones) >= 6 and len(out.phones) == len(out.phone_ids) and out.bert is None


def test_phones_and_bert_bad_input(segmenter):
    fe = TextFrontend("v2")
    for blank in ("", "   "):
        with pytest.raises(TextError, match="empty"):
            fe.phones_and_bert(blank, "all_zh")
    with pytest.raises(TextError):
        fe.phones_and_bert(b"bytes", "all_zh")
    with pytest.raises(UnsupportedLanguageError, match="all_zh"):
        fe.phones_and_bert("你好", "fr")
    with pytest.raises(UnsupportedLanguageError, match="v1"):
        TextFrontend("v1").phones_and_bert("안녕하세요", "all_ko")
    segmenter.answers[("。", "zh")] = []
    with pytest.raises(TextError, match="nothing to read"):
        fe.phones_and_bert("。", "all_zh")


def test_punctuation_only_text_reads_as_pause_marks(segmenter):
    segmenter.answers[("，。", "zh")] = [("zh", "，。")]
    segmenter.answers[(".，。", "zh")] = [("zh", ".，。")]
    out = TextFrontend("v2").phones_and_bert("，。", "all_zh")
    assert out.phones == (".",) and out.norm_text == "."


def test_language_lists():
    assert set(languages("v2")) == {"auto", "auto_yue", "en", "zh", "ja", "yue", "ko", "all_zh", "all_ja",
                                    "all_yue", "all_ko"}
    assert set(languages("v1")) == {"auto", "en", "zh", "ja", "all_zh", "all_ja"}
    assert languages("v4") == languages("v2")


def test_missing_segmenter_is_a_clear_error(monkeypatch):
    import importlib.util

    if importlib.util.find_spec("engine.text.langsegment") is not None:
        pytest.skip("engine.text.langsegment is present")
    with pytest.raises(UnsupportedLanguageError, match="langsegment"):
        route("你好", "all_zh")


_ODD_INPUTS = [
    ("こんにちは你好", "all_zh"), ("안녕하세요 你好", "all_ja"), ("你好世界", "all_ko"), ("你好 hello", "en"),
    ("😀😀", "all_zh"), ("😀", "en"), ("\x00\x07", "all_ja"), ("😀", "all_ko"), ("😀", "all_yue"), ("😀", "auto"),
    ("。。。", "auto_yue"), ("!!", "en"), ("abc", "all_yue"), ("٣٤٥", "en"), ("\u200b\u200b", "yue"),
    ("Hello 你好 こんにちは 안녕", "auto"), ("你好" * 300 + "。", "zh"),
]


@pytest.mark.parametrize("text,language", _ODD_INPUTS, ids=lambda x: repr(x)[:16])
def test_odd_input_gives_valid_phones(text, language):
    # documented behaviour: mixed scripts in a single-language mode, emoji and control characters follow the
    # official rules (unreadable characters are dropped, become UNK / 停, or leave a pause); never a crash
    import importlib.util

    if importlib.util.find_spec("engine.text.langsegment") is None:
        pytest.skip("engine.text.langsegment is not in the tree yet")
    out = TextFrontend("v2").phones_and_bert(text, language, with_bert=False)
    assert len(out.phones) >= 1 and len(out.phone_ids) == len(out.phones)
    assert all(0 <= i < 732 for i in out.phone_ids)
    assert out.norm_text == "".join(s.norm_text for s in out.segments)
