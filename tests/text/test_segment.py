"""Sentence splitting (cut0..cut5, split_big_text, merge_short_text_in_array, pre_seg_text): the official rules
of the official text_segmentation_method.py and TextPreprocessor.pre_seg_text, and robustness on inputs where
the official code raises IndexError."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import OptionsError, TextError
from engine.text import segment


def test_cut5_spec_example():
    out = segment.cut5("你好，我是3.14小明。Hello, world! 1.5 ok")
    assert out.split("\n") == ["你好，", "我是3.14小明。", "Hello,", " world!", " 1.5 ok"]


@pytest.mark.parametrize("n_sentences,sizes", [(1, [1]), (8, [8]), (9, [4, 5]), (13, [4, 4, 5])])
def test_cut1_groups_four_sentences_last_takes_rest(n_sentences, sizes):
    text = "".join(f"第{i}句话。" for i in range(n_sentences))
    chunks = segment.cut1(text).split("\n")
    assert [c.count("。") for c in chunks] == sizes
    assert "".join(chunks) == text


def test_cut1_single_chunk_returns_original_text():
    # only one start index: the unsplit input comes back (no "。" appended)
    assert segment.cut1("没有句号的一句话") == "没有句号的一句话"


def test_cut2_emits_after_more_than_50_chars_and_merges_short_tail():
    s = "一" * 30 + "。"
    chunks = segment.cut2(s * 5).split("\n")
    assert [len(c) for c in chunks] == [62, 93]  # 31+31 > 50 closes a chunk; the 31-char tail joins the last
    assert segment.cut2("只有一句。") == "只有一句。"


def test_cut3_cut4_drop_their_marks():
    assert segment.cut3("第一句。第二句。") == "第一句\n第二句"
    assert segment.cut4("Pi is 3.14 now. Next one.") == "Pi is 3.14 now\n Next one"
    assert segment.cut4("Pi is 3.14.") == "Pi is 3.14"  # a dot after a digit is kept unless it ends the text


def test_cut0_and_punctuation_only_chunks():
    assert segment.cut0("随便什么文字。") == "随便什么文字。"
    assert segment.cut0("...!?") == "\n"
    assert segment.cut1("。") == "。"  # "。" is not in the punctuation-only set
    assert segment.cut5("，。！") == ""


def test_split_keeps_marks_and_folds_long_ellipsis_and_dash():
    assert segment.split("你好……再见——朋友") == ["你好。", "再见，", "朋友。"]
    assert segment.split("") == []


def test_split_big_text_respects_max_len():
    text = "，".join(["一二三四五六七八九十"] * 120) + "。"
    parts = segment.split_big_text(text)
    assert "".join(parts) == text
    assert all(len(p) <= segment.MAX_SENTENCE_CHARS for p in parts)
    assert len(parts) > 1


def test_merge_short_text_in_array():
    assert segment.merge_short_text_in_array(["a"], 5) == ["a"]
    assert segment.merge_short_text_in_array(["ab", "cd", "efg", "h"], 5) == ["abcdefgh"]
    assert segment.merge_short_text_in_array(["abcde", "fghij", "k"], 5) == ["abcde", "fghijk"]
    assert segment.merge_short_text_in_array(["a", "b"], 5) == ["ab"]


def test_pre_seg_text_prefixes_short_first_clause():
    assert segment.pre_seg_text("你好，今天天气很好。", "zh", "cut0") == ["。你好，今天天气很好。"]
    assert segment.pre_seg_text("Hi, how are you today?", "en", "cut0") == [".Hi, how are you today?"]
    assert segment.pre_seg_text("今天天气很好", "zh", "cut0") == ["今天天气很好。"]  # a closing mark is added


def test_pre_seg_text_splits_over_510_characters():
    text = "，".join(["一二三四五六七八九十"] * 100) + "。"
    out = segment.pre_seg_text(text, "zh", "cut0")
    assert len(out) > 1 and all(len(s) <= 510 for s in out)


def test_pre_seg_text_bad_input():
    assert segment.pre_seg_text("", "zh", "cut1") == []
    assert segment.pre_seg_text("\n\n", "zh", "cut1") == []
    assert segment.pre_seg_text("###", "zh", "cut0") == []  # symbols only: nothing to read
    assert segment.pre_seg_text(" ", "zh", "cut0") == []
    for blank, method in (("...", "cut0"), ("。。！", "cut5")):
        with pytest.raises(TextError):
            segment.pre_seg_text(blank, "zh", method)  # the official "请输入有效文本"
    with pytest.raises(OptionsError, match="cut0"):
        segment.get_method("cut9")


def test_preprocess_collapses_repeated_marks():
    assert segment.preprocess("今天天气很好!!!真的是这样吗???", "zh", "cut5") == ["今天天气很好!", "真的是这样吗?"]


_TEXT = st.text(alphabet=st.sampled_from(list("你好ab 1.3，。？！,.?!~:：—…;、-\n")), max_size=80)


@settings(max_examples=150, deadline=None)
@given(text=_TEXT, method=st.sampled_from(sorted(segment.METHODS)), lang=st.sampled_from(["zh", "en"]))
def test_segmentation_never_crashes(text, method, lang):
    # the official code raises IndexError on e.g. "\n" with cut1; here every input gives a list or a TextError
    assert isinstance(segment.get_method(method)(text), str)
    try:
        out = segment.preprocess(text, lang, method)
    except TextError:
        return
    assert all(s and s[-1] in segment.splits() for s in out)


def test_prepare_prompt_text():
    assert segment.prepare_prompt_text("\n你好\n", "zh") == "你好。"
    assert segment.prepare_prompt_text("Hello", "en") == "Hello."
    assert segment.prepare_prompt_text("你好！", "all_zh") == "你好！"
    with pytest.raises(TextError):
        segment.prepare_prompt_text("\n\n", "zh")
