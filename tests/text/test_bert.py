"""BERT features: the official formula (hidden_states[-3], CLS/SEP dropped, rows repeated per phone) computed
independently with transformers on a random test folder, zeros for non-Mandarin segments, and bad input."""

from __future__ import annotations

import pytest
import torch

from engine.errors import CheckpointError, TextError
from engine.testweights.roberta import make_vocab, write_roberta_folder
from engine.text.bert import BertFeatureExtractor, expand_to_phones
from engine.text.frontend import TextFrontend


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return write_roberta_folder(tmp_path_factory.mktemp("roberta"))


@pytest.fixture(scope="module")
def extractor(bert_folder):
    return BertFeatureExtractor.from_folder(bert_folder)


def _official_formula(folder, text, word2ph):
    # what TextPreprocessor.get_bert_feature computes, written out with plain transformers calls
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    # the official code ran under transformers 4, whose default dtype was float32 (5 keeps the file's)
    model = AutoModelForMaskedLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        res = model(**tok(text, return_tensors="pt"), output_hidden_states=True)
        res = torch.cat(res["hidden_states"][-3:-2], -1)[0].cpu()[1:-1]
    rows = [res[i].repeat(word2ph[i], 1) for i in range(len(word2ph))]
    return torch.cat(rows, dim=0).T


def test_features_equal_official_formula(bert_folder, extractor):
    text, word2ph = "你好,欢迎使用语音合成系统.", [2, 2, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1]
    got = extractor(text, word2ph)
    assert got.shape == (extractor.hidden_size, sum(word2ph)) and got.dtype == torch.float32
    torch.testing.assert_close(got, _official_formula(bert_folder, text, word2ph), rtol=0, atol=1e-6)


def test_test_folder_layout_and_vocab(bert_folder):
    names = {p.name for p in bert_folder.iterdir()}
    assert {"config.json", "vocab.txt", "tokenizer.json", "pytorch_model.bin"} <= names
    vocab = make_vocab()
    assert "一" in vocab and "龥" in vocab and "…" in vocab and len(make_vocab(21128)) == 21128


def test_expand_to_phones():
    chars = torch.arange(6.0).reshape(3, 2)  # (n_chars=3, hidden=2)
    out = expand_to_phones(chars, [2, 1, 3])
    assert out.shape == (2, 6)
    assert out[0].tolist() == [0, 0, 2, 4, 4, 4]
    with pytest.raises(TextError):
        expand_to_phones(chars, [1, 1])


def test_frontend_features_zh_and_zeros_for_english(extractor, monkeypatch):
    from engine.text import frontend

    monkeypatch.setattr(frontend, "_get_texts", lambda text, lang: [("zh", "我喜欢用"), ("en", "Python"), ("zh", "写代码。")])
    out = TextFrontend("v2", bert=extractor).phones_and_bert("我喜欢用Python写代码。", "zh")
    assert out.bert.shape == (extractor.hidden_size, len(out.phones))
    n0, n1 = len(out.segments[0].phones), len(out.segments[1].phones)
    assert torch.count_nonzero(out.bert[:, n0:n0 + n1]) == 0  # the English piece
    expected_zh = extractor(out.segments[0].norm_text, out.segments[0].word2ph)
    torch.testing.assert_close(out.bert[:, :n0], expected_zh)


def test_bad_input(extractor, tmp_path):
    with pytest.raises(TextError, match="one token per character"):
        extractor("ab", [2, 2])  # "ab" is one word piece for BERT, but two characters
    with pytest.raises(TextError):
        extractor("你好", [2])
    with pytest.raises(CheckpointError, match="chinese-roberta"):
        BertFeatureExtractor.from_folder(tmp_path)


def test_long_text_is_read_in_windows(extractor):
    # the official code fails past 510 characters (512 positions); here windows of 510 are concatenated
    text = "你好吗我很好" * 100  # 600 characters
    feats = extractor.char_features(text)
    assert feats.shape == (600, extractor.hidden_size)
    torch.testing.assert_close(feats[510:], extractor.char_features(text[510:]))
